"""The topology segment a local data dir serves (its zone, optionally a region) and which requested
segments it satisfies: its own keys, plus the well-known and legacy labels that in-tree translation
and operators use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from csi import keys
from csi.failures import AlreadyExistsError, OutOfCapacityError


class Segment:
    def __init__(self, driver_name: str, zone: str, region: str = "") -> None:
        self.labels = {keys.topology_zone_key(driver_name): zone}
        if region:
            self.labels[keys.topology_region_key(driver_name)] = region
        self._accepted = {
            **dict.fromkeys((keys.WELL_KNOWN_ZONE, keys.LEGACY_ZONE), zone),
            **dict.fromkeys((keys.WELL_KNOWN_REGION, keys.LEGACY_REGION), region),
            **self.labels,
        }

    def serves(self, segment: Mapping[str, str]) -> bool:
        """True when every key of a requested segment names this data dir's zone/region."""
        return all(v and self._accepted.get(k) == v for k, v in segment.items())

    def allows(self, requisite: Sequence[Mapping[str, str]]) -> bool:
        """True when there is no requisite or some requisite segment is served (preferred never limits)."""
        return not requisite or any(self.serves(s) for s in requisite)

    def check_requisite(self, requisite: Sequence[Mapping[str, str]]) -> None:
        """A volume can be placed here only when some requisite segment (if any) is served."""
        if not self.allows(requisite):
            raise OutOfCapacityError(
                f"no requisite topology segment is served by this data dir (it serves {self.labels})"
            )

    def check_existing(
        self, name: str, object_id: str, requisite: Sequence[Mapping[str, str]], kind: str = "volume"
    ) -> None:
        """A volume (or snapshot) of this data dir, so in this segment, answers a repeated create only
        when it is accessible from the request's requisite (if any); else AlreadyExistsError (spec:
        "already exists but is incompatible")."""
        if not self.allows(requisite):
            raise AlreadyExistsError(
                f"{kind} {name!r} already exists ({object_id}) in segment {self.labels}, which the "
                "request's accessibility_requirements exclude: add that segment to the requisite "
                f"topology, or delete the {kind} or use another name"
            )
