"""Zone placement of new EBS volumes: which zone a CreateVolume lands in, from the requisite and
preferred topology of the request, the configured zone, and the zones the region offers.

A topology segment names a zone under the driver's key, the well-known key or the legacy beta key (what
migrated in-tree objects carry); `zone_of` is the one place that reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from csi import keys
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.metadata import ZONE_ENV
from csi.backends.base import DiskOptions
from csi.failures import OutOfCapacityError


class Zones:
    """Placement within one region. `zone` is the configured default ("" or "local": none)."""

    def __init__(self, ec2: Ec2, zone_key: str, zone: str = "") -> None:
        self._ec2 = ec2
        self._keys = (zone_key, keys.WELL_KNOWN_ZONE, keys.LEGACY_ZONE)
        self._zone = "" if zone == "local" else zone
        self._default = ""
        self._known: list[str] = []

    def zone_of(self, segment: Mapping[str, str]) -> str:
        """The zone a topology segment names ("" when it names none)."""
        return next((segment[k] for k in self._keys if segment.get(k)), "")

    def requisite(self, options: DiskOptions) -> list[str] | None:
        """The zones the requisite topology allows, in order; None when it does not restrict the zone
        (no requisite, or a segment without a zone)."""
        zones = [self.zone_of(s) for s in options.requisite]
        return None if not zones or "" in zones else zones

    def pick(self, options: DiskOptions) -> str:
        """A zone of this region: the first preferred one that satisfies requisite, else the first
        requisite one, else the default. A zone the region does not offer -> OutOfCapacityError."""
        zone = self._choose(options)
        if not self._known:
            self._known = self._ec2.zones()
        if zone not in self._known:
            raise OutOfCapacityError(
                f"zone {zone!r} is not an available zone of this region ({', '.join(self._known)})"
            )
        return zone

    def _choose(self, options: DiskOptions) -> str:
        allowed = self.requisite(options)
        for segment in options.preferred:
            zone = self.zone_of(segment)
            if zone and (allowed is None or zone in allowed):
                return zone
        if allowed:
            return allowed[0]
        if not self._default:
            zones = self._ec2.zones()
            self._default = self._zone or os.environ.get(ZONE_ENV, "") or (zones[0] if zones else "")
        if not self._default:
            raise OutOfCapacityError("no availability zone is available in this region")
        return self._default
