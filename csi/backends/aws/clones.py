"""The clone fallback, where the endpoint lacks CopyVolumes: a scratch snapshot of the source, restored
into the clone, then deleted.

A scratch snapshot is tagged `TAG_CLONE_SCRATCH=<clone name>` (and the driver tag), so it is known as
the driver's and as that clone's; it is no CSI snapshot (ListSnapshots leaves it out). An attempt cut
short (a crash, a wait that timed out) leaves it behind: the next attempt of the same clone reuses it
while it can (same source, not failed) and deletes any other, and every create of a clone, a retry that
finds the clone already made included, deletes the scratch snapshots of its name (`clear`). Deletes go
through the backend's retries; one that still fails fails the create with UNAVAILABLE (TransientError),
never a final error, because the clone exists: the CO's retry finds it by name and deletes the scratch
snapshot then.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from csi.backends.aws import params as P
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.filters import tag_filter, tagged_exactly
from csi.backends.aws.ownertags import OwnerTags
from csi.backends.aws.records import tag_spec
from csi.failures import DriverError, NotFoundError, TransientError
from shim import failpoints

TAG_CLONE_SCRATCH = "ballast.dev/clone-scratch"  # on scratch snapshots: the name of the clone


class ScratchSnapshots:
    """The scratch snapshots of clones made through snapshots."""

    def __init__(self, ec2: Ec2, owner: OwnerTags) -> None:
        self._ec2 = ec2
        self._owner = owner

    def clone(self, name: str, source_id: str, restore: Callable[[str], str]) -> str:
        """The volume `restore(snapshot id)` creates from a completed scratch snapshot of `source_id`,
        with the scratch snapshots of `name` deleted. A TransientError keeps the scratch snapshot for the
        retry; any other error deletes it (best effort) and is raised."""
        sid = self._take(name, source_id)
        try:
            self._wait_completed(name, sid)
            vid = restore(sid)
        except TransientError:
            raise
        except DriverError:
            with contextlib.suppress(DriverError):
                self.clear(name)
            raise
        failpoints.hit("aws.clone.restored")
        self.clear(name)
        return vid

    def clear(self, name: str) -> None:
        """Delete the scratch snapshots of clone `name`; one that cannot be -> TransientError."""
        for snap in self._scratch_of(name):
            self._delete(name, snap["SnapshotId"])

    def _scratch_of(self, name: str) -> list[dict[str, Any]]:
        found = self._ec2.describe_all(
            "describe_snapshots",
            "Snapshots",
            Filters=[tag_filter(TAG_CLONE_SCRATCH, name)],
            OwnerIds=["self"],
        )
        return sorted(tagged_exactly(found, TAG_CLONE_SCRATCH, name), key=lambda s: str(s["SnapshotId"]))

    def _take(self, name: str, source_id: str) -> str:
        """A scratch snapshot of `source_id` for clone `name`: one an earlier attempt left, if usable
        (the others are deleted), else a new one."""
        kept = ""
        for snap in self._scratch_of(name):
            if not kept and snap.get("VolumeId") == source_id and snap.get("State") != "error":
                kept = str(snap["SnapshotId"])
            else:
                self._delete(name, snap["SnapshotId"])
        if kept:
            return kept
        created = self._ec2.call(
            "create_snapshot",
            VolumeId=source_id,
            Description=f"scratch snapshot for {name}, a clone of {source_id}; deleted once it is made",
            TagSpecifications=tag_spec(
                "snapshot", {**self._owner.snapshot(name), P.TAG_DRIVER: "true", TAG_CLONE_SCRATCH: name}
            ),
        )
        failpoints.hit("aws.clone.snapshotted")
        return str(created["SnapshotId"])

    def _wait_completed(self, name: str, sid: str) -> None:
        def check() -> bool | None:
            try:
                state = self._ec2.describe_snapshot(sid).get("State")
            except NotFoundError as exc:
                raise TransientError(f"scratch snapshot {sid} of clone {name!r} vanished; retry") from exc
            if state == "error":
                raise DriverError(f"EBS failed to take scratch snapshot {sid} of clone {name!r}")
            return True if state == "completed" else None

        self._ec2.poll(f"scratch snapshot {sid} of clone {name!r}", check)

    def _delete(self, name: str, sid: str) -> None:
        try:
            self._ec2.call("delete_snapshot", SnapshotId=sid)
        except NotFoundError:
            return
        except DriverError as exc:
            raise TransientError(
                f"scratch snapshot {sid} of clone {name!r} could not be deleted ({exc}); a retry deletes it"
            ) from exc
