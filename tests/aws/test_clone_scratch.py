"""The clone fallback (moto has no CopyVolumes, so every clone here takes it) never leaves its scratch
snapshot behind: against moto through tests/motoproxy.py, a DeleteSnapshot that keeps failing fails the
create (UNAVAILABLE) and the retry deletes the snapshot; what an interrupted earlier attempt left (a
scratch snapshot, with or without the clone made) is reused or deleted by the next create of the same
clone; another clone's scratch snapshot is left alone, and none is ever listed as a CSI snapshot. The
same crash points in a real driver process: tests/reliability/test_kill_aws.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.clones import TAG_CLONE_SCRATCH
from csi.backends.aws.params import TAG_DRIVER
from csi.backends.base import ContentSource, DiskOptions, GiB, SourceKind
from csi.failures import InvalidParameterError, TransientError
from tests.motoproxy import MotoProxy

CLONE = "pvc-clone"
SOMEONE_ELSE = "pvc-someone-else"  # another clone, whose scratch snapshot is still in use


def opts(source: str = "") -> DiskOptions:
    content = ContentSource(SourceKind.VOLUME, source) if source else None
    return DiskOptions(size_bytes=2 * GiB, parameters={"type": "gp3"}, source=content)


def leave_scratch(ec2: Any, source: str, clone: str) -> str:
    """A scratch snapshot of `source` for `clone`, as an attempt killed after CreateSnapshot leaves it."""
    tags = [{"Key": TAG_DRIVER, "Value": "true"}, {"Key": TAG_CLONE_SCRATCH, "Value": clone}]
    snap = ec2.create_snapshot(
        VolumeId=source, TagSpecifications=[{"ResourceType": "snapshot", "Tags": tags}]
    )
    return str(snap["SnapshotId"])


def scratch_of(ec2: Any, clone: str) -> list[str]:
    found = ec2.describe_snapshots(
        OwnerIds=["self"], Filters=[{"Name": "tag-key", "Values": [TAG_CLONE_SCRATCH]}]
    )
    return sorted(
        s["SnapshotId"]
        for s in found["Snapshots"]
        if {t["Key"]: t["Value"] for t in s.get("Tags", [])}[TAG_CLONE_SCRATCH] == clone
    )


def snapshots_of(ec2: Any, volume_id: str) -> list[str]:
    """Every snapshot of the volume, tagged or not."""
    found = ec2.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "volume-id", "Values": [volume_id]}])
    return sorted(s["SnapshotId"] for s in found["Snapshots"])


def clones(ec2: Any) -> list[str]:
    found = ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": [CLONE]}])["Volumes"]
    return [v["VolumeId"] for v in found if v["State"] not in ("deleting", "deleted")]


@dataclass(frozen=True)
class Earlier:
    """What an earlier attempt of the clone left, and what the next attempt does about it."""

    made: bool  # the clone volume exists already
    leave: Callable[[Any, str, str], object]  # (ec2, source, another volume) -> plants leftovers
    failing_deletes: int  # DeleteSnapshot calls refused (InternalError) during the next attempt
    snapshots_taken: int  # CreateSnapshot calls of the next attempt and its retry together


def nothing(ec2: Any, source: str, other: str) -> None:
    return None


def snapshot_of_source(ec2: Any, source: str, other: str) -> str:
    return leave_scratch(ec2, source, CLONE)


def snapshot_of_another_volume(ec2: Any, source: str, other: str) -> str:
    return leave_scratch(ec2, other, CLONE)


@pytest.mark.parametrize(
    "earlier",
    [
        pytest.param(Earlier(False, nothing, 10, 1), id="delete-refused-then-retried"),
        pytest.param(Earlier(False, snapshot_of_source, 0, 0), id="killed-after-snapshot-reused"),
        pytest.param(Earlier(False, snapshot_of_another_volume, 0, 1), id="stale-scratch-of-other-source"),
        pytest.param(Earlier(True, snapshot_of_source, 0, 0), id="killed-after-restore-retry-deletes"),
    ],
)
def test_a_clone_leaves_no_scratch_snapshot(
    slow: AwsBackend, proxy: MotoProxy, ec2: Any, earlier: Earlier
) -> None:
    source = slow.create_volume("pvc-src", opts()).id
    other = slow.create_volume("pvc-other", opts()).id
    foreign = leave_scratch(ec2, source, SOMEONE_ELSE)
    made = slow.create_volume(CLONE, opts(source)).id if earlier.made else ""
    earlier.leave(ec2, source, other)
    proxy.reset()
    proxy.fail("DeleteSnapshot", "InternalError", times=earlier.failing_deletes)

    try:
        clone = slow.create_volume(CLONE, opts(source)).id
    except TransientError:
        assert earlier.failing_deletes, "the clone failed although nothing was refused"
        assert scratch_of(ec2, CLONE), "the refused DeleteSnapshot did not fail the create"
        assert slow.list_snapshots(source_volume_id=source).items == [], "a scratch snapshot was listed"
        taken = proxy.calls["CreateSnapshot"]
        proxy.reset()
        clone = slow.create_volume(CLONE, opts(source)).id  # the CO's retry
        proxy.calls["CreateSnapshot"] += taken

    assert clones(ec2) == [clone] and made in ("", clone)
    assert snapshots_of(ec2, source) == [foreign], "a scratch snapshot was left, or another clone's deleted"
    assert snapshots_of(ec2, other) == []
    assert proxy.calls["CreateSnapshot"] == earlier.snapshots_taken


@pytest.mark.parametrize(
    ("code", "falls_back"),
    [
        pytest.param("InvalidAction", True, id="endpoint-lacks-copyvolumes-falls-back"),
        pytest.param("NotImplemented", True, id="not-implemented-falls-back"),
        pytest.param("UnsupportedOperation", False, id="request-refused-is-invalid-argument"),
    ],
)
def test_copyvolumes_refusals(
    slow: AwsBackend, proxy: MotoProxy, ec2: Any, code: str, falls_back: bool
) -> None:
    """Only a missing action turns CopyVolumes off; EC2's UnsupportedOperation refuses this request
    (INVALID_ARGUMENT, as the EBS CSI driver answers it) and makes nothing."""
    source = slow.create_volume("pvc-src", opts()).id
    proxy.fail("CopyVolumes", code, times=1)
    if falls_back:
        assert slow.create_volume(CLONE, opts(source)).id in clones(ec2)
        assert proxy.calls["CreateSnapshot"] == 1
    else:
        with pytest.raises(InvalidParameterError, match="UnsupportedOperation"):
            slow.create_volume(CLONE, opts(source))
        assert clones(ec2) == [] and proxy.calls["CreateSnapshot"] == 0
