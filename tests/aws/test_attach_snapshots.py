"""AwsBackend attachments, listings and snapshots against moto's EC2 server over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.metadata import SHARED_NITRO_LIMIT
from csi.backends.aws.params import TAG_READONLY_PREFIX
from csi.backends.base import DiskOptions, GiB
from csi.failures import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidParameterError,
    InvalidTokenError,
    LimitExceededError,
    NotFoundError,
)
from tests.aws.conftest import OTHER_ZONE, _Http, inject_errors, lose_answers
from tests.motoserver import ZONE, run_instance

EBS_ZONE = "topology.ebs.csi.aws.com/zone"


def volume(backend: AwsBackend, name: str, zone: str = ZONE) -> str:
    options = DiskOptions(size_bytes=GiB, parameters={"type": "gp3"}, requisite=[{EBS_ZONE: zone}])
    return backend.create_volume(name, options).id


def attachments(ec2: Any, volume_id: str) -> list[tuple[str, str]]:
    found = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0].get("Attachments", [])
    return [(a["InstanceId"], a["Device"]) for a in found]


# ---------------------------------------------------------------- attach / detach


def test_attach_allocates_device_names_and_is_idempotent(
    backend: AwsBackend, ec2: Any, instance: str
) -> None:
    first, second = volume(backend, "pvc-1"), volume(backend, "pvc-2")
    assert backend.attach(first, instance, False) == {"devicePath": "/dev/xvdba"}
    assert backend.attach(second, instance, False) == {"devicePath": "/dev/xvdbb"}
    assert backend.attach(f"aws://{ZONE}/{first}", instance, False) == {"devicePath": "/dev/xvdba"}
    assert attachments(ec2, first) == [(instance, "/dev/xvdba")]
    assert attachments(ec2, second) == [(instance, "/dev/xvdbb")]


def test_detach_frees_the_device_name(backend: AwsBackend, ec2: Any, instance: str) -> None:
    first, second = volume(backend, "pvc-1"), volume(backend, "pvc-2")
    backend.attach(first, instance, False)
    backend.detach(first, instance)
    assert attachments(ec2, first) == []
    backend.detach(first, instance)  # not attached: no-op
    assert backend.attach(second, instance, False) == {"devicePath": "/dev/xvdba"}


def test_names_used_by_the_instance_are_skipped(backend: AwsBackend, ec2: Any, instance: str) -> None:
    foreign = ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"]
    ec2.attach_volume(VolumeId=foreign, InstanceId=instance, Device="/dev/sdba")
    assert backend.attach(volume(backend, "pvc-1"), instance, False) == {"devicePath": "/dev/xvdbb"}


def test_a_name_taken_concurrently_moves_on_to_the_next(backend: AwsBackend, ec2: Any, instance: str) -> None:
    vid = volume(backend, "pvc-1")
    inject_errors(
        backend.ec2.client,
        "AttachVolume",
        ["InvalidParameterValue"],
        status=400,
        message="Attachment point /dev/xvdba is already in use",
    )
    assert backend.attach(vid, instance, False) == {"devicePath": "/dev/xvdbb"}
    assert attachments(ec2, vid) == [(instance, "/dev/xvdbb")]


def test_attached_elsewhere_fails_naming_the_node(backend: AwsBackend, ec2: Any, instance: str) -> None:
    other = run_instance(ec2)
    vid = volume(backend, "pvc-1")
    backend.attach(vid, other, False)
    with pytest.raises(FailedPreconditionError, match=other):
        backend.attach(vid, instance, False)


def test_node_in_another_zone_fails(backend: AwsBackend, ec2: Any) -> None:
    far = run_instance(ec2, zone=OTHER_ZONE)
    with pytest.raises(FailedPreconditionError, match=OTHER_ZONE):
        backend.attach(volume(backend, "pvc-1"), far, False)


@pytest.mark.parametrize(
    ("volume_id", "node_id"),
    [
        pytest.param("vol-00000000000000000", None, id="missing-volume"),
        pytest.param(None, "i-00000000000000000", id="missing-node"),
        pytest.param(None, "some-fake-node-id", id="foreign-node-id"),
    ],
)
def test_attach_missing_is_not_found(
    backend: AwsBackend, instance: str, volume_id: str | None, node_id: str | None
) -> None:
    with pytest.raises(NotFoundError):
        backend.attach(volume_id or volume(backend, "pvc-1"), node_id or instance, False)


def test_detach_from_a_missing_node_is_a_no_op(backend: AwsBackend) -> None:
    backend.detach(volume(backend, "pvc-1"), "i-00000000000000000")


def test_detach_missing_volume_is_not_found(backend: AwsBackend, instance: str) -> None:
    with pytest.raises(NotFoundError):
        backend.detach("vol-00000000000000000", instance)


def test_attached_volume_cannot_be_deleted(backend: AwsBackend, instance: str) -> None:
    vid = volume(backend, "pvc-1")
    backend.attach(vid, instance, False)
    with pytest.raises(FailedPreconditionError):
        backend.delete_volume(vid)


# ---------------------------------------------------------------- listing


def test_list_volumes_reports_published_nodes_and_skips_foreign_volumes(
    backend: AwsBackend, ec2: Any, instance: str
) -> None:
    mine = volume(backend, "pvc-1")
    in_tree = ec2.create_volume(
        Size=2,
        AvailabilityZone=ZONE,
        TagSpecifications=[
            {
                "ResourceType": "volume",
                "Tags": [{"Key": "kubernetes.io/created-for/pv/name", "Value": "pv-old"}],
            }
        ],
    )["VolumeId"]
    ec2.create_volume(Size=1, AvailabilityZone=ZONE)  # not Kubernetes'
    backend.attach(mine, instance, False)
    listed = {d.id: d for d in backend.list_volumes().items}
    assert set(listed) == {mine, in_tree}
    assert [(a.node_id, a.publish_context["devicePath"]) for a in listed[mine].attachments] == [
        (instance, "/dev/xvdba")
    ]


def test_list_volumes_pages_without_duplicates_across_changes(backend: AwsBackend) -> None:
    ids = sorted(volume(backend, f"pvc-{i}") for i in range(5))
    first = backend.list_volumes(max_entries=2)
    assert [d.id for d in first.items] == ids[:2] and first.next_token
    backend.delete_volume(ids[1])  # the last of the page
    added = volume(backend, "pvc-new")
    rest = backend.list_volumes(max_entries=0, starting_token=first.next_token)
    seen = [d.id for d in rest.items]
    assert len(seen) == len(set(seen))
    assert set(seen) >= set(ids[2:]) and not set(seen) & set(ids[:2])
    assert set(seen) <= {*ids[2:], added}
    assert rest.next_token == ""


@pytest.mark.parametrize("token", ["invalid-token", "after:", "vol-123"])
def test_foreign_tokens_are_rejected(backend: AwsBackend, token: str) -> None:
    with pytest.raises(InvalidTokenError):
        backend.list_volumes(starting_token=token)


@pytest.mark.parametrize(
    "token", ["after:garbage", "after:", "after:vol-0123456789abcdef0", "snap-0123456789abcdef0", "garbage"]
)
def test_foreign_snapshot_tokens_are_aborted(backend: AwsBackend, token: str) -> None:
    """Spec, ListSnapshots: "Invalid starting_token ... ABORTED"; only `after:<snapshot id>` was issued."""
    backend.create_snapshot("snap-a", volume(backend, "pvc-1"), {})
    with pytest.raises(InvalidTokenError):
        backend.list_snapshots(starting_token=token)


# ---------------------------------------------------------------- snapshots


def test_snapshot_is_idempotent_by_name(backend: AwsBackend, ec2: Any) -> None:
    vid = volume(backend, "pvc-1")
    snap = backend.create_snapshot("snap-a", vid, {"tagSpecification_1": "team=storage"})
    again = backend.create_snapshot("snap-a", f"aws:///{vid}", {})
    assert again.id == snap.id and snap.source_volume_id == vid and snap.size_bytes == GiB
    described = ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0]
    assert {t["Key"]: t["Value"] for t in described["Tags"]}["CSIVolumeSnapshotName"] == "snap-a"
    assert {t["Key"]: t["Value"] for t in described["Tags"]}["team"] == "storage"


def test_a_create_snapshot_whose_answer_is_lost_makes_one_snapshot(backend: AwsBackend, ec2: Any) -> None:
    """CreateSnapshot takes no client token: when EC2 made the snapshot and its answer was lost, the
    retry finds it by its name tag instead of making a second one, which nobody would ever delete."""
    vid = volume(backend, "pvc-1")
    lost = lose_answers(backend.ec2.client, "CreateSnapshot", 1)
    snap = backend.create_snapshot("snap-lost", vid, {})
    assert lost == [], "the answer was not lost: the test proves nothing"
    made = ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
    assert [s["SnapshotId"] for s in made] == [snap.id]
    assert backend.ec2.retry_counts().get("create_snapshot") == 1


@pytest.mark.parametrize(
    ("status", "code"),
    [
        pytest.param(0, "", id="connection-lost"),
        pytest.param(504, "", id="gateway-504"),
        pytest.param(502, "", id="gateway-502"),
        pytest.param(500, "InternalError", id="ec2-internal-error"),
        pytest.param(503, "ServiceUnavailable", id="ec2-service-unavailable"),
    ],
)
def test_a_lost_create_snapshot_answer_is_looked_for_until_ec2_lists_it(
    backend: AwsBackend, ec2: Any, status: int, code: str
) -> None:
    """EC2 may list a snapshot it has just made only a moment later: after an answer that may have come
    after the work was done (a lost connection, a server error), one lookup that finds nothing does not
    make a second snapshot; it is looked for again."""
    vid = volume(backend, "pvc-1")
    lost = lose_answers(backend.ec2.client, "CreateSnapshot", 1, status, code)
    lookups: list[int] = []

    def not_listed_yet(**kwargs: Any) -> Any:
        lookups.append(1)
        if len(lookups) == 2:  # the first lookup after the lost answer
            return _Http(200), {"Snapshots": [], "ResponseMetadata": {}}
        return None

    backend.ec2.client.meta.events.register("before-call.ec2.DescribeSnapshots", not_listed_yet)
    snap = backend.create_snapshot("snap-lag", vid, {})
    assert lost == [] and len(lookups) >= 3, "the answer was lost and the lag was seen"
    made = ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
    assert [s["SnapshotId"] for s in made] == [snap.id]
    assert backend.ec2.retry_counts().get("create_snapshot") == 1


def test_a_throttled_create_snapshot_is_retried_after_one_lookup(backend: AwsBackend, ec2: Any) -> None:
    """Throttling (a 503 too) is EC2 refusing before it acts: nothing to wait for in the listing."""
    vid = volume(backend, "pvc-1")
    throttled = inject_errors(backend.ec2.client, "CreateSnapshot", ["RequestLimitExceeded"], status=503)
    lookups: list[int] = []

    def count(**kwargs: Any) -> None:
        lookups.append(1)

    backend.ec2.client.meta.events.register("before-call.ec2.DescribeSnapshots", count)
    snap = backend.create_snapshot("snap-throttled", vid, {})
    assert throttled == [] and len(lookups) == 2, "one lookup before the call, one before its retry"
    assert [s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]] == [snap.id]


def test_snapshot_name_reused_for_another_volume_already_exists(backend: AwsBackend) -> None:
    backend.create_snapshot("snap-a", volume(backend, "pvc-1"), {})
    with pytest.raises(AlreadyExistsError):
        backend.create_snapshot("snap-a", volume(backend, "pvc-2"), {})


@pytest.mark.parametrize(
    ("source", "parameters", "error"),
    [
        pytest.param("vol-00000000000000000", {}, NotFoundError, id="missing-source"),
        pytest.param("some-id", {}, NotFoundError, id="foreign-source"),
        pytest.param(None, {"fastSnapshotRestore": "x"}, InvalidParameterError, id="unknown-parameter"),
    ],
)
def test_snapshot_errors(
    backend: AwsBackend, source: str | None, parameters: dict[str, str], error: type[Exception]
) -> None:
    with pytest.raises(error):
        backend.create_snapshot("snap-e", source or volume(backend, "pvc-1"), parameters)


def test_list_snapshots_by_id_source_and_paged(backend: AwsBackend) -> None:
    one, two = volume(backend, "pvc-1"), volume(backend, "pvc-2")
    snaps = [backend.create_snapshot(f"snap-{i}", one, {}) for i in range(3)]
    other = backend.create_snapshot("snap-other", two, {})
    assert [s.id for s in backend.list_snapshots(snapshot_id=snaps[1].id).items] == [snaps[1].id]
    assert {s.id for s in backend.list_snapshots(source_volume_id=one).items} == {s.id for s in snaps}
    assert backend.list_snapshots(snapshot_id=other.id, source_volume_id=one).items == []
    assert backend.list_snapshots(snapshot_id="snap-00000000000000000").items == []
    assert backend.list_snapshots(snapshot_id="not-a-snapshot").items == []
    assert backend.list_snapshots(source_volume_id="vol-00000000000000000").items == []
    seen: list[str] = []
    token = ""
    while True:
        page = backend.list_snapshots(max_entries=2, starting_token=token)
        assert len(page.items) <= 2
        seen.extend(s.id for s in page.items)
        token = page.next_token
        if not token:
            break
    assert sorted(seen) == sorted([*(s.id for s in snaps), other.id])


def test_delete_snapshot(backend: AwsBackend) -> None:
    snap = backend.create_snapshot("snap-d", volume(backend, "pvc-1"), {})
    assert backend.get_snapshot(snap.id).ready
    backend.delete_snapshot(snap.id)
    with pytest.raises(NotFoundError):
        backend.get_snapshot(snap.id)
    with pytest.raises(NotFoundError):
        backend.delete_snapshot(snap.id)


# ---------------------------------------------------------------- node side


def test_node_identity_from_overrides(make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend(node_id="i-0123456789abcdef0", zone="us-east-1c", max_volumes=11)
    identity = backend.node_identity()
    assert (identity.node_id, identity.max_volumes) == ("i-0123456789abcdef0", 11)
    assert identity.topology == {EBS_ZONE: "us-east-1c", "topology.kubernetes.io/zone": "us-east-1c"}
    assert set(identity.topology) == set(backend.capabilities.topology_keys)


def test_configured_attach_limit_is_enforced(make_backend: Callable[..., AwsBackend], instance: str) -> None:
    backend = make_backend(max_volumes=2)
    first, second, third = (volume(backend, f"pvc-{i}") for i in range(3))
    backend.attach(first, instance, False)
    backend.attach(second, instance, False)
    with pytest.raises(LimitExceededError, match="2 volumes"):
        backend.attach(third, instance, False)
    assert backend.attach(first, instance, False) == {"devicePath": "/dev/xvdba"}  # republish still fine


def test_attach_slots_come_from_the_instance_type_minus_what_is_attached(
    backend: AwsBackend, ec2: Any, instance: str
) -> None:
    """No --max-volumes-per-node: an m5 (shared Nitro) has 26 slots besides its root volume; volumes
    attached outside the driver take slots too. Full -> LimitExceededError (RESOURCE_EXHAUSTED)."""
    for i in range(SHARED_NITRO_LIMIT):
        other = ec2.create_volume(AvailabilityZone=ZONE, Size=1)["VolumeId"]
        ec2.attach_volume(VolumeId=other, InstanceId=instance, Device=f"/dev/sd{chr(ord('f') + i % 11)}{i}")
    new = volume(backend, "pvc-one-too-many")
    with pytest.raises(LimitExceededError, match=r"26 volumes attached, limit 26 \(instance type m5.large\)"):
        backend.attach(new, instance, False)


def test_republish_with_the_other_readonly_flag_already_exists(backend: AwsBackend, instance: str) -> None:
    vid = volume(backend, "pvc-ro")
    backend.attach(vid, instance, True)
    assert backend.attach(vid, instance, True) == {"devicePath": "/dev/xvdba"}
    assert [a.readonly for a in backend.get_volume(vid).attachments] == [True]
    with pytest.raises(AlreadyExistsError, match="readonly"):
        backend.attach(vid, instance, False)
    backend.detach(vid, instance)
    assert backend.attach(vid, instance, False) == {"devicePath": "/dev/xvdba"}
    assert [a.readonly for a in backend.get_volume(vid).attachments] == [False]


def readonly_marks(ec2: Any, vid: str) -> list[str]:
    tags = ec2.describe_volumes(VolumeIds=[vid])["Volumes"][0].get("Tags", [])
    return [t["Key"] for t in tags if t["Key"].startswith(TAG_READONLY_PREFIX)]


def test_an_unpublish_takes_the_readonly_mark_with_it(backend: AwsBackend, ec2: Any, instance: str) -> None:
    vid = volume(backend, "pvc-ro-gone")
    backend.attach(vid, instance, True)
    assert readonly_marks(ec2, vid) == [TAG_READONLY_PREFIX + instance]
    backend.detach(vid, instance)
    assert readonly_marks(ec2, vid) == []


def test_a_stale_readonly_mark_is_cleared_by_a_read_write_publish(
    backend: AwsBackend, ec2: Any, instance: str
) -> None:
    """A mark left behind (an unpublish that died between DetachVolume and DeleteTags) must not make the
    next read-write publish read-only, nor its retry by the CO ALREADY_EXISTS."""
    vid = volume(backend, "pvc-stale-ro")
    ec2.create_tags(Resources=[vid], Tags=[{"Key": TAG_READONLY_PREFIX + instance, "Value": "true"}])
    backend.attach(vid, instance, False)
    assert readonly_marks(ec2, vid) == []
    assert [a.readonly for a in backend.get_volume(vid).attachments] == [False]
    assert backend.attach(vid, instance, False) == {"devicePath": "/dev/xvdba"}
