"""EBS snapshots, idempotent by their `CSIVolumeSnapshotName` tag (looked up under a per-name lock).

`tagSpecification_N` snapshot parameters become snapshot tags, as for volumes; `csi.storage.k8s.io/`
keys are ignored; anything else is an unknown parameter.
"""

from __future__ import annotations

from collections.abc import Mapping

from csi import keys
from csi.backends.aws import params as P
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.records import page, tag_spec, to_snapshot
from csi.backends.base import Page, Snapshot
from csi.failures import AlreadyExistsError, InvalidParameterError, NotFoundError
from csi.keylocks import KeyedLocks

DESCRIPTION = "Created by ebs.csi.aws.com-compatible Ballast for {name}"


def _snapshot_tags(name: str, parameters: Mapping[str, str]) -> dict[str, str]:
    out = {P.TAG_SNAPSHOT_NAME: name, P.TAG_DRIVER: "true"}
    for key, value in parameters.items():
        if key.lower().startswith(P.TAG_PREFIX.lower()):
            out.update(P.user_tags({P.TAG_PREFIX + key[len(P.TAG_PREFIX) :]: value}))
        elif not key.startswith(keys.PREFIX_K8S):
            raise InvalidParameterError(f"unknown snapshot parameter {key!r} for the EBS backend")
    return out


class EbsSnapshots:
    def __init__(self, ec2: Ec2) -> None:
        self._ec2 = ec2
        self._locks = KeyedLocks()

    def create(self, name: str, source_volume_id: str, parameters: Mapping[str, str]) -> Snapshot:
        """Idempotent by name; the same name for another source -> AlreadyExistsError."""
        vid = P.volume_id(source_volume_id)
        snapshot_tags = _snapshot_tags(name, parameters)
        with self._locks.hold(name):
            found = self._ec2.describe_all(
                "describe_snapshots",
                "Snapshots",
                Filters=[{"Name": f"tag:{P.TAG_SNAPSHOT_NAME}", "Values": [name]}],
                OwnerIds=["self"],
            )
            if found:
                snap = to_snapshot(min(found, key=lambda s: s["SnapshotId"]))
                if snap.source_volume_id != vid:
                    raise AlreadyExistsError(
                        f"snapshot {name!r} already exists as {snap.id} of volume {snap.source_volume_id}"
                    )
                return snap
            created = self._ec2.call(
                "create_snapshot",
                VolumeId=vid,
                Description=DESCRIPTION.format(name=name),
                TagSpecifications=tag_spec("snapshot", snapshot_tags),
            )
            return to_snapshot(created)

    def delete(self, snapshot_id: str) -> None:
        self._ec2.call("delete_snapshot", SnapshotId=P.snapshot_id(snapshot_id))

    def get(self, snapshot_id: str) -> Snapshot:
        return to_snapshot(self._ec2.describe_snapshot(P.snapshot_id(snapshot_id)))

    def page(
        self, snapshot_id: str, source_volume_id: str, max_entries: int, starting_token: str
    ) -> Page[Snapshot]:
        """By id, by source volume, or all snapshots this driver made. Unknown id/source -> empty."""
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
                snaps = [to_snapshot(s) for s in raw]
        except NotFoundError:
            snaps = []
        return page(snaps, lambda s: s.id, max_entries, starting_token)
