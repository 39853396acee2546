"""EBS snapshots, idempotent by their `CSIVolumeSnapshotName` tag (looked up under a per-name lock, by
the literal name: `*` and `?` in it are no wildcards, filters.py).

`tagSpecification_N` snapshot parameters become snapshot tags, as for volumes, their templates over the
VolumeSnapshot's names (SNAPSHOT_FIELDS: the `metadata` the external-snapshotter passes with
--extra-create-metadata, tagvalues.py); anything else is an unknown parameter. The tags of a snapshot
that exists by name are not compared: a retried CreateSnapshot answers with it.

Accessibility: an EBS snapshot lives in the region and restores into any of its zones. A CreateSnapshot
with requisite topology promises the requested zones of this region (kept in the TAG_ACCESSIBLE_ZONES
tag, reported as the snapshot's topology); none of them in this region -> OutOfCapacityError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from csi.backends.aws import params as P
from csi.backends.aws.clones import TAG_CLONE_SCRATCH
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.filters import tag_filter, tagged_exactly
from csi.backends.aws.ownertags import OwnerTags
from csi.backends.aws.params import TAG_ACCESSIBLE_ZONES
from csi.backends.aws.records import tag_spec, tags, to_snapshot
from csi.backends.aws.tagvalues import SNAPSHOT_FIELDS
from csi.backends.aws.zones import Zones
from csi.backends.base import EMPTY, Page, Snapshot, seek_page
from csi.failures import AlreadyExistsError, InvalidParameterError, NotFoundError, OutOfCapacityError
from csi.keylocks import KeyedLocks

DESCRIPTION = "Created by ebs.csi.aws.com-compatible Ballast for {name}"


def _snapshot_tags(
    name: str, parameters: Mapping[str, str], metadata: Mapping[str, str], owner: OwnerTags, lenient: bool
) -> dict[str, str]:
    specs = {}
    for key, value in parameters.items():
        tag_key = P.prefixed(key, P.TAG_PREFIX)
        if tag_key is not None:
            specs[tag_key] = value
        else:
            raise InvalidParameterError(f"unknown snapshot parameter {key!r} for the EBS backend")
    user = P.spec_tags(specs, SNAPSHOT_FIELDS, metadata, lenient)
    return {**owner.snapshot(name), **user, P.TAG_SNAPSHOT_NAME: name, P.TAG_DRIVER: "true"}


class EbsSnapshots:
    def __init__(
        self, ec2: Ec2, zones: Zones, zone_key: str, owner: OwnerTags, lenient_tags: bool = False
    ) -> None:
        self._ec2 = ec2
        self._zones = zones
        self._zone_key = zone_key
        self._owner = owner
        self._lenient_tags = lenient_tags  # --aws-warn-on-invalid-tag (P.tag_entry)
        self._locks = KeyedLocks()

    def _accessible(self, requisite: Sequence[Mapping[str, str]]) -> list[str]:
        """The zones of this region the requisite names ([]: no promise asked for, or a segment that
        does not restrict the zone)."""
        named = [self._zones.zone_of(s) for s in requisite]
        if not named or "" in named:
            return []
        available = self._ec2.zones()
        usable = [z for z in dict.fromkeys(named) if z in available]
        if not usable:
            raise OutOfCapacityError(
                f"no requisite zone ({', '.join(named)}) is a zone of this region ({', '.join(available)})"
            )
        return usable

    def create(
        self,
        name: str,
        source_volume_id: str,
        parameters: Mapping[str, str],
        requisite: Sequence[Mapping[str, str]] = (),
        metadata: Mapping[str, str] = EMPTY,
    ) -> Snapshot:
        """Idempotent by name; the same name for another source -> AlreadyExistsError."""
        vid = P.volume_id(source_volume_id)
        snapshot_tags = _snapshot_tags(name, parameters, metadata, self._owner, self._lenient_tags)
        zones = self._accessible(requisite)
        if zones:
            snapshot_tags[TAG_ACCESSIBLE_ZONES] = ",".join(zones)
        with self._locks.hold(name):
            record = self._named(name) or self._ec2.call_once(
                "create_snapshot",
                lambda: self._named(name),  # no client token: a lost answer must not make two
                VolumeId=vid,
                Description=DESCRIPTION.format(name=name),
                TagSpecifications=tag_spec("snapshot", snapshot_tags),
            )
            snap = to_snapshot(record, self._zone_key)
            if snap.source_volume_id != vid:
                raise AlreadyExistsError(
                    f"snapshot {name!r} already exists as {snap.id} of volume {snap.source_volume_id}"
                )
            return snap

    def _named(self, name: str) -> dict[str, Any] | None:
        """The oldest of this account's snapshots whose name tag is exactly `name`, or None."""
        found = self._ec2.describe_all(
            "describe_snapshots",
            "Snapshots",
            Filters=[tag_filter(P.TAG_SNAPSHOT_NAME, name)],
            OwnerIds=["self"],
        )
        named = tagged_exactly(found, P.TAG_SNAPSHOT_NAME, name)
        return min(named, key=lambda s: (s.get("StartTime") or 0, s["SnapshotId"])) if named else None

    def delete(self, snapshot_id: str) -> None:
        self._ec2.call("delete_snapshot", SnapshotId=P.snapshot_id(snapshot_id))

    def get(self, snapshot_id: str) -> Snapshot:
        return to_snapshot(self._ec2.describe_snapshot(P.snapshot_id(snapshot_id)), self._zone_key)

    def page(
        self, snapshot_id: str, source_volume_id: str, max_entries: int, starting_token: str
    ) -> Page[Snapshot]:
        """By id, by source volume, or all snapshots this driver made; never a clone's scratch snapshot
        (clones.py). Unknown id/source -> empty."""
        try:
            if snapshot_id:
                snaps = [self.get(snapshot_id)]
                if source_volume_id and snaps[0].source_volume_id != P.volume_id(source_volume_id):
                    snaps = []
            else:
                filters = [{"Name": "tag-key", "Values": [P.TAG_SNAPSHOT_NAME]}]
                if source_volume_id:
                    filters = [{"Name": "volume-id", "Values": [P.volume_id(source_volume_id)]}]
                raw = self._ec2.describe_all(
                    "describe_snapshots", "Snapshots", Filters=filters, OwnerIds=["self"]
                )
                snaps = [to_snapshot(s, self._zone_key) for s in raw if TAG_CLONE_SCRATCH not in tags(s)]
        except NotFoundError:
            snaps = []
        return seek_page(snaps, lambda s: s.id, max_entries, starting_token, P.SNAPSHOT_ID)
