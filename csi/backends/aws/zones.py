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
        """The first zone of this region among the preferred zones that satisfy requisite, then the
        requisite zones (CSI CreateVolume: the volume "MUST be accessible from at least one of the
        requisite topologies", so a zone the region lacks gives way to the next), else the configured
        zone, else the region's first. The region's zones are read once, and read again before
        refusing (a zone EC2 lists since: an AZ back from `impaired`, a Local Zone opted into); none
        of the candidates among them -> OutOfCapacityError."""
        fresh = not self._known
        if fresh:
            self._known = self._ec2.zones()
        zone = self._first_known(options)
        if not zone and not fresh:
            self._known = self._ec2.zones()
            zone = self._first_known(options)
        if zone:
            return zone
        wanted = self._candidates(options)
        if not wanted:
            raise OutOfCapacityError("no availability zone is available in this region")
        raise OutOfCapacityError(
            f"no zone the volume may go to ({', '.join(wanted)}) is an available zone of this region "
            f"({', '.join(self._known) or 'none'})"
        )

    def _first_known(self, options: DiskOptions) -> str:
        """The first of the candidate zones the region offers, as last read ("" when none)."""
        return next((z for z in self._candidates(options) if z in self._known), "")

    def _candidates(self, options: DiskOptions) -> list[str]:
        """The zones a volume may go to, in order: preferred ones within requisite, then requisite ones;
        without a zone-restricting requisite, the preferred ones, then the configured zone or else the
        region's first."""
        allowed = self.requisite(options)
        preferred = [self.zone_of(s) for s in options.preferred]
        chosen = [z for z in preferred if z and (allowed is None or z in allowed)]
        if allowed is not None:
            return list(dict.fromkeys([*chosen, *allowed]))
        default = self._zone or os.environ.get(ZONE_ENV, "")
        return list(dict.fromkeys([*chosen, *([default] if default else self._known[:1])]))
