"""CreateSnapshot's idempotency lookup takes the name literally: EC2 (and moto) read `*` and `?` in a
filter value as wildcards (moto `[...]` too), so a name that contains them must neither find another
snapshot's nor be refused as another source's; of snapshots sharing a name, the oldest answers. Against
moto's EC2 server over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.failures import AlreadyExistsError
from tests.aws.conftest import inject_responses

NEW = "new"  # a snapshot no earlier step returned
EXISTS = "exists"  # AlreadyExistsError naming the snapshot of that name: it is another source's

Step = tuple[str, str, str]  # (snapshot name, source volume: "v1" or "v2", expected: NEW, EXISTS or a name)


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([("backup-1", "v1", NEW), ("backup-*", "v1", NEW)], id="star-is-no-wildcard"),
        pytest.param([("backup-1", "v1", NEW), ("backup-?", "v2", NEW)], id="question-mark-is-no-wildcard"),
        pytest.param([("backup-1", "v1", NEW), ("backup-[1]", "v2", NEW)], id="brackets-are-no-class"),
        pytest.param(
            [("backup-1", "v1", NEW), ("backup-*", "v1", NEW), ("backup-*", "v1", "backup-*")],
            id="a-wildcard-name-is-found-again",
        ),
        pytest.param(
            [("backup-1", "v1", NEW), ("backup-?", "v2", NEW), ("backup-?", "v1", EXISTS)],
            id="a-wildcard-name-of-another-source-exists",
        ),
    ],
)
def test_snapshot_names_are_literal(backend: AwsBackend, steps: list[Step]) -> None:
    sources = {
        key: backend.create_volume(f"pvc-{key}", DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})).id
        for key in ("v1", "v2")
    }
    made: dict[str, str] = {}
    for name, source, expected in steps:
        if expected == EXISTS:
            with pytest.raises(AlreadyExistsError, match=made[name]):
                backend.create_snapshot(name, sources[source], {})
            continue
        snap = backend.create_snapshot(name, sources[source], {})
        assert (snap.name, snap.source_volume_id) == (name, sources[source])
        if expected == NEW:
            assert snap.id not in made.values(), f"{name!r} answered {snap.id}, another name's snapshot"
            made[name] = snap.id
        else:
            assert snap.id == made[expected]


def _named(sid: str, vid: str, started: datetime) -> dict[str, Any]:
    tags = [{"Key": "CSIVolumeSnapshotName", "Value": "snap-dup"}]
    return {"SnapshotId": sid, "VolumeId": vid, "StartTime": started, "State": "completed", "Tags": tags}


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        pytest.param("snap-0fffffffffffffff0", "snap-00000000000000001", id="older-has-the-larger-id"),
        pytest.param("snap-00000000000000001", "snap-0fffffffffffffff0", id="older-has-the-smaller-id"),
    ],
)
def test_of_duplicate_snapshot_names_the_oldest_answers(backend: AwsBackend, older: str, newer: str) -> None:
    """A duplicate (EC2's listing lagged a fresh snapshot past a retry) is the newer one: every later
    call answers with the first, whatever its random id."""
    vid = backend.create_volume("pvc-1", DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})).id
    first = datetime(2026, 1, 1, tzinfo=UTC)
    listed = [_named(newer, vid, first + timedelta(seconds=2)), _named(older, vid, first)]
    left = inject_responses(backend.ec2.client, "DescribeSnapshots", [{"Snapshots": listed}])
    assert backend.create_snapshot("snap-dup", vid, {}).id == older
    assert left == [], "the lookup did not see the duplicates"
