"""AwsBackend volumes against moto's EC2 server over HTTP: parameters, idempotency, topology, restore,
clone, expansion and modification."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.volumes import client_token
from csi.backends.base import ContentSource, DiskOptions, GiB, SourceKind
from csi.failures import (
    AlreadyExistsError,
    DriverError,
    InvalidParameterError,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
)
from tests.aws.conftest import OTHER_ZONE, inject_responses, record_calls
from tests.motoserver import ZONE

EBS_ZONE = "topology.ebs.csi.aws.com/zone"
K8S_ZONE = "topology.kubernetes.io/zone"


def opts(backend: AwsBackend, size_gib: float = 1, **kwargs: Any) -> DiskOptions:
    params = backend.validate_parameters(kwargs.pop("parameters", {}))
    return DiskOptions(size_bytes=int(size_gib * GiB), parameters=params, **kwargs)


def ec2_volume(ec2: Any, volume_id: str) -> dict[str, Any]:
    volume: dict[str, Any] = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    return volume


def tags(volume: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in volume.get("Tags", [])}


def test_create_defaults_to_gp3_tags_and_both_zone_keys(backend: AwsBackend, ec2: Any) -> None:
    disk = backend.create_volume("pvc-a", opts(backend, 1.5))
    volume = ec2_volume(ec2, disk.id)
    assert (volume["VolumeType"], volume["Size"], volume["AvailabilityZone"]) == ("gp3", 2, ZONE)
    assert disk.size_bytes == 2 * GiB
    assert tags(volume)["CSIVolumeName"] == "pvc-a"
    assert tags(volume)["ebs.csi.aws.com/cluster"] == "true"
    assert disk.topology == {EBS_ZONE: ZONE, K8S_ZONE: ZONE}


@pytest.mark.parametrize(
    ("parameters", "size_gib", "expected"),
    [
        pytest.param({"type": "io2", "iops": "4000"}, 10, {"VolumeType": "io2", "Iops": 4000}, id="io2-iops"),
        pytest.param(
            {"type": "io1", "iopsPerGB": "10", "allowautoiopspergbincrease": "true"},
            20,
            {"VolumeType": "io1", "Iops": 200},
            id="io1-iops-per-gb",
        ),
        pytest.param(
            {"type": "gp3", "iops": "6000", "throughput": "500"},
            12,
            {"VolumeType": "gp3", "Iops": 6000, "Throughput": 500},
            id="gp3-throughput",
        ),
        pytest.param({"type": "gp2"}, 10, {"VolumeType": "gp2"}, id="gp2"),
        pytest.param({"type": "sc1"}, 125, {"VolumeType": "sc1"}, id="sc1"),
        pytest.param({"type": "st1"}, 125, {"VolumeType": "st1"}, id="st1"),
        pytest.param({"type": "standard"}, 10, {"VolumeType": "standard"}, id="standard"),
        pytest.param({"encrypted": "true"}, 1, {"Encrypted": True}, id="encrypted"),
    ],
)
def test_parameters_reach_ec2(
    backend: AwsBackend, ec2: Any, parameters: dict[str, str], size_gib: int, expected: dict[str, Any]
) -> None:
    disk = backend.create_volume("pvc-p", opts(backend, size_gib, parameters=parameters))
    volume = ec2_volume(ec2, disk.id)
    assert {k: volume.get(k) for k in expected} == expected


def test_user_tags_are_applied(backend: AwsBackend, ec2: Any) -> None:
    params = {"tagSpecification_1": "team=storage", "tagSpecification_2": "cost-centre=42"}
    disk = backend.create_volume("pvc-t", opts(backend, parameters=params))
    assert {"team": "storage", "cost-centre": "42"}.items() <= tags(ec2_volume(ec2, disk.id)).items()


def test_mutable_parameters_override_class_parameters(backend: AwsBackend, ec2: Any) -> None:
    options = DiskOptions(
        size_bytes=10 * GiB,
        parameters=backend.validate_parameters({"type": "gp3", "iops": "3000"}),
        mutable_parameters=backend.validate_mutable_parameters({"iops": "5000"}),
    )
    disk = backend.create_volume("pvc-m", options)
    assert ec2_volume(ec2, disk.id)["Iops"] == 5000


def test_volume_context_is_kept_with_the_volume(backend: AwsBackend) -> None:
    context = {"fsType": "ext4", "blockSize": "4096"}
    disk = backend.create_volume("pvc-ctx", opts(backend, context=context))
    assert disk.volume_context == context
    assert backend.get_volume(disk.id).volume_context == context
    assert backend.create_volume("pvc-ctx", opts(backend, context=context)).id == disk.id


def test_create_is_idempotent_by_name(backend: AwsBackend, ec2: Any) -> None:
    first = backend.create_volume("pvc-i", opts(backend, 3))
    again = backend.create_volume("pvc-i", opts(backend, 3))
    assert again.id == first.id
    assert (
        len(ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": ["pvc-i"]}])["Volumes"])
        == 1
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param({"size_gib": 4}, "size", id="size"),
        pytest.param({"parameters": {"type": "gp2"}}, "type", id="type"),
        pytest.param({"requisite": [{EBS_ZONE: OTHER_ZONE}]}, "zone", id="zone"),
        pytest.param({"context": {"fsType": "xfs"}}, "volume context", id="volume-context"),
    ],
)
def test_same_name_incompatible_arguments_already_exists(
    backend: AwsBackend, change: dict[str, Any], problem: str
) -> None:
    backend.create_volume("pvc-x", opts(backend, 3))
    with pytest.raises(AlreadyExistsError, match=problem):
        backend.create_volume("pvc-x", opts(backend, change.pop("size_gib", 3), **change))


def test_concurrent_retries_create_one_volume_with_one_client_token(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend()
    tokens = record_calls(backend.ec2.client, "CreateVolume")
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: backend.create_volume("pvc-race", opts(backend, 2)).id, range(16)))
    assert len(ids) == 1
    found = ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": ["pvc-race"]}])["Volumes"]
    assert [v["VolumeId"] for v in found] == list(ids)
    assert {t["ClientToken"] for t in tokens} == {client_token("pvc-race")}


def test_another_controller_finds_the_volume_by_tag(make_backend: Callable[..., AwsBackend]) -> None:
    first = make_backend().create_volume("pvc-h", opts(make_backend(), 2))
    assert make_backend().create_volume("pvc-h", opts(make_backend(), 2)).id == first.id


def test_a_burned_client_token_is_replaced(backend: AwsBackend, ec2: Any) -> None:
    """EC2 answers a token whose volume was deleted meanwhile with that (gone) volume: use a new token."""
    tokens = record_calls(backend.ec2.client, "CreateVolume")
    inject_responses(
        backend.ec2.client, "CreateVolume", [{"VolumeId": "vol-0000000000000dead", "State": "creating"}]
    )
    disk = backend.create_volume("pvc-burned", opts(backend))
    assert [t["ClientToken"] for t in tokens] == [client_token("pvc-burned"), client_token("pvc-burned", 1)]
    assert ec2_volume(ec2, disk.id)["VolumeId"] == disk.id


def test_client_token_is_stable_and_within_ec2_limits() -> None:
    token = client_token("pvc-" + "a" * 200)
    assert token == client_token("pvc-" + "a" * 200) and len(token) == 64
    assert client_token("pvc-1") != client_token("pvc-2")
    assert client_token("pvc-1", 1) != client_token("pvc-1")


@pytest.mark.parametrize(
    ("requisite", "preferred", "zone"),
    [
        pytest.param([], [], ZONE, id="default-zone"),
        pytest.param([{EBS_ZONE: OTHER_ZONE}], [], OTHER_ZONE, id="requisite"),
        pytest.param([{K8S_ZONE: "us-east-1c"}], [], "us-east-1c", id="well-known-key"),
        pytest.param(
            [{EBS_ZONE: ZONE}, {EBS_ZONE: OTHER_ZONE}],
            [{EBS_ZONE: OTHER_ZONE}],
            OTHER_ZONE,
            id="preferred-first",
        ),
        pytest.param([{EBS_ZONE: ZONE}], [{EBS_ZONE: "us-east-1c"}], ZONE, id="preferred-outside-requisite"),
        pytest.param(
            [{"failure-domain.beta.kubernetes.io/zone": "us-east-1d"}], [], "us-east-1d", id="legacy-zone-key"
        ),
        pytest.param(
            [{EBS_ZONE: "eu-west-1a"}, {EBS_ZONE: OTHER_ZONE}],
            [{EBS_ZONE: "eu-west-1a"}],
            OTHER_ZONE,
            id="a-preferred-zone-the-region-lacks-gives-way-to-a-requisite-one",
        ),
        pytest.param(
            [{EBS_ZONE: "eu-west-1a"}, {EBS_ZONE: OTHER_ZONE}],
            [],
            OTHER_ZONE,
            id="a-requisite-zone-the-region-lacks-gives-way-to-the-next",
        ),
        pytest.param([], [{EBS_ZONE: "eu-west-1a"}], ZONE, id="a-preferred-zone-the-region-lacks-is-skipped"),
    ],
)
def test_topology_picks_the_zone(
    backend: AwsBackend, requisite: list[dict[str, str]], preferred: list[dict[str, str]], zone: str
) -> None:
    disk = backend.create_volume("pvc-z", opts(backend, requisite=requisite, preferred=preferred))
    assert disk.topology[EBS_ZONE] == zone


def test_unknown_zone_cannot_be_placed(backend: AwsBackend) -> None:
    with pytest.raises(OutOfCapacityError, match="mars-north-1a"):
        backend.create_volume("pvc-nz", opts(backend, requisite=[{EBS_ZONE: "mars-north-1a"}]))


def test_a_zone_ec2_lists_later_is_placed_without_a_restart(backend: AwsBackend) -> None:
    """The region's zones are read again (once a call) before a zone is refused: one that became
    available since the last read (an AZ back from impaired, a Local Zone opted into) is usable."""
    reads = record_calls(backend.ec2.client, "DescribeAvailabilityZones")
    inject_responses(
        backend.ec2.client,
        "DescribeAvailabilityZones",
        [{"AvailabilityZones": [{"ZoneName": ZONE, "State": "available"}]}],
    )
    first = backend.create_volume("pvc-first", opts(backend, requisite=[{EBS_ZONE: ZONE}]))
    assert first.topology[EBS_ZONE] == ZONE
    later = backend.create_volume("pvc-later", opts(backend, requisite=[{EBS_ZONE: OTHER_ZONE}]))
    assert later.topology[EBS_ZONE] == OTHER_ZONE and len(reads) == 2
    with pytest.raises(OutOfCapacityError):
        backend.create_volume("pvc-nz", opts(backend, requisite=[{EBS_ZONE: "mars-north-1a"}]))
    assert len(reads) == 3, "a zone the region lacks costs one read again, no more"


def test_multi_attach_needs_io2(backend: AwsBackend, ec2: Any) -> None:
    with pytest.raises(InvalidParameterError, match="io2"):
        backend.create_volume("pvc-ma", opts(backend, multi_node=True, block=True))
    disk = backend.create_volume(
        "pvc-ma2", opts(backend, 4, parameters={"type": "io2", "iops": "1000"}, multi_node=True, block=True)
    )
    assert disk.multi_node and ec2_volume(ec2, disk.id)["MultiAttachEnabled"] is True


def test_delete_get_and_in_tree_handles(backend: AwsBackend) -> None:
    disk = backend.create_volume("pvc-d", opts(backend))
    assert backend.get_volume(f"aws://{ZONE}/{disk.id}").id == disk.id
    assert backend.get_volume(f"aws:///{disk.id}").name == "pvc-d"
    backend.delete_volume(f"aws://{ZONE}/{disk.id}")
    with pytest.raises(NotFoundError):
        backend.get_volume(disk.id)
    with pytest.raises(NotFoundError):
        backend.delete_volume(disk.id)


@pytest.mark.parametrize("handle", ["some-id", "vol-0000000000000000f", "aws://vol-1"])
def test_missing_volumes_are_not_found(backend: AwsBackend, handle: str) -> None:
    with pytest.raises(NotFoundError):
        backend.get_volume(handle)


# ---------------------------------------------------------------- restore and clone


def test_restore_from_snapshot(backend: AwsBackend, ec2: Any) -> None:
    source = backend.create_volume("pvc-src", opts(backend, 3))
    snap = backend.create_snapshot("snap-src", source.id, {})
    restored = backend.create_volume(
        "pvc-restored", opts(backend, 5, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
    )
    volume = ec2_volume(ec2, restored.id)
    assert (volume["SnapshotId"], volume["Size"]) == (snap.id, 5)
    assert restored.source == ContentSource(SourceKind.SNAPSHOT, snap.id)
    again = backend.create_volume(
        "pvc-restored", opts(backend, 5, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
    )
    assert again.id == restored.id


@pytest.mark.parametrize(
    ("parameters", "rates"),
    [
        pytest.param({"volumeInitializationRate": "250"}, [None, 250, 250], id="rated-class"),
        pytest.param({}, [None, None, None], id="class-without-a-rate-sends-none"),
    ],
)
def test_only_restores_from_snapshots_send_the_initialization_rate(
    backend: AwsBackend, parameters: dict[str, str], rates: list[int | None]
) -> None:
    """EC2 takes VolumeInitializationRate (100..300 MiB/s) for a volume made from a snapshot and refuses
    it otherwise, so one class serves empty claims, restores and clones (the latter through a scratch
    snapshot here); a class without one sends none, and the restore reads at EC2's default rate."""
    sent = record_calls(backend.ec2.client, "CreateVolume")
    source = backend.create_volume("pvc-src", opts(backend, parameters=parameters))
    snap = backend.create_snapshot("snap-src", source.id, {})
    for name, kind, sid in (("pvc-r", SourceKind.SNAPSHOT, snap.id), ("pvc-c", SourceKind.VOLUME, source.id)):
        backend.create_volume(name, opts(backend, parameters=parameters, source=ContentSource(kind, sid)))
    assert [call.get("VolumeInitializationRate") for call in sent] == rates
    assert [bool(call.get("SnapshotId")) for call in sent] == [False, True, True]


def test_restore_smaller_than_snapshot_is_out_of_range(backend: AwsBackend) -> None:
    source = backend.create_volume("pvc-big", opts(backend, 8))
    snap = backend.create_snapshot("snap-big", source.id, {})
    with pytest.raises(OutOfRangeError):
        backend.create_volume(
            "pvc-small", opts(backend, 4, source=ContentSource(SourceKind.SNAPSHOT, snap.id))
        )


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(ContentSource(SourceKind.SNAPSHOT, "snap-00000000000000000"), id="snapshot"),
        pytest.param(ContentSource(SourceKind.VOLUME, "vol-00000000000000000"), id="volume"),
    ],
)
def test_missing_source_is_not_found(backend: AwsBackend, source: ContentSource) -> None:
    with pytest.raises(NotFoundError):
        backend.create_volume("pvc-nosrc", opts(backend, source=source))


def test_clone_lands_in_the_source_zone_and_leaves_no_snapshot(backend: AwsBackend, ec2: Any) -> None:
    source = backend.create_volume("pvc-orig", opts(backend, 2, requisite=[{EBS_ZONE: OTHER_ZONE}]))
    clone = backend.create_volume(
        "pvc-clone", opts(backend, 3, source=ContentSource(SourceKind.VOLUME, source.id))
    )
    volume = ec2_volume(ec2, clone.id)
    assert (volume["AvailabilityZone"], volume["Size"]) == (OTHER_ZONE, 3)
    assert clone.source == ContentSource(SourceKind.VOLUME, source.id)
    assert (
        ec2.describe_snapshots(OwnerIds=["self"], Filters=[{"Name": "volume-id", "Values": [source.id]}])[
            "Snapshots"
        ]
        == []
    )
    again = backend.create_volume(
        "pvc-clone", opts(backend, 3, source=ContentSource(SourceKind.VOLUME, source.id))
    )
    assert again.id == clone.id


def test_clone_outside_the_source_zone_cannot_be_placed(backend: AwsBackend) -> None:
    source = backend.create_volume("pvc-o2", opts(backend, 2))
    with pytest.raises(OutOfCapacityError, match=ZONE):
        backend.create_volume(
            "pvc-c2",
            opts(
                backend,
                2,
                source=ContentSource(SourceKind.VOLUME, source.id),
                requisite=[{EBS_ZONE: OTHER_ZONE}],
            ),
        )


# ---------------------------------------------------------------- expansion and modification


def test_expand_rounds_up_and_is_idempotent(backend: AwsBackend, ec2: Any) -> None:
    disk = backend.create_volume("pvc-e", opts(backend, 2))
    modifications = record_calls(backend.ec2.client, "ModifyVolume")
    assert backend.expand_volume(disk.id, 5 * GiB + 1) == 6 * GiB
    assert ec2_volume(ec2, disk.id)["Size"] == 6
    assert backend.expand_volume(disk.id, 4 * GiB) == 6 * GiB  # already bigger: no second modification
    assert len(modifications) == 1


def test_expand_answers_the_new_size_while_ec2_still_describes_the_old(backend: AwsBackend, ec2: Any) -> None:
    """EC2 can report a modification complete before DescribeVolumes shows the new size."""
    disk = backend.create_volume("pvc-lag", opts(backend, 2))
    client = backend.ec2.client
    stale = client.describe_volumes(VolumeIds=[disk.id])
    client.meta.events.register(
        "after-call.ec2.ModifyVolume", lambda **_: inject_responses(client, "DescribeVolumes", [stale])
    )
    assert backend.expand_volume(disk.id, 5 * GiB) == 5 * GiB
    assert ec2_volume(ec2, disk.id)["Size"] == 5


FAILED = {"ModificationState": "failed", "OriginalSize": 2, "TargetSize": 3}  # EC2's record, size unchanged


@pytest.mark.parametrize(
    ("latest", "error"),
    [
        pytest.param([[{**FAILED, "StatusMessage": "an old one"}]], None, id="an-old-failure-blocks-nothing"),
        pytest.param(
            [[], [{**FAILED, "StatusMessage": "no capacity"}]],
            "no capacity",
            id="our-own-failure-is-an-error",
        ),
    ],
)
def test_a_failed_modification_fails_only_the_expand_that_asked_for_it(
    backend: AwsBackend, latest: list[list[dict[str, Any]]], error: str | None
) -> None:
    """EC2 describes the latest modification of a volume, a failed one too. One that failed before
    must not fail every later expand; our own failing is an error with EC2's reason (INTERNAL), never
    the new size reported as done. `latest`: DescribeVolumesModifications' answers before and after our
    ModifyVolume (moto answers the rest)."""
    disk = backend.create_volume("pvc-fail", opts(backend, 2))
    answers = [{"VolumesModifications": [{**m, "VolumeId": disk.id} for m in mods]} for mods in latest]
    inject_responses(backend.ec2.client, "DescribeVolumesModifications", answers)
    if error is None:
        assert backend.expand_volume(disk.id, 5 * GiB) == 5 * GiB
    else:
        with pytest.raises(DriverError, match=f"failed to modify volume {disk.id}: {error}"):
            backend.expand_volume(disk.id, 5 * GiB)


def test_expand_missing_volume_is_not_found(backend: AwsBackend) -> None:
    with pytest.raises(NotFoundError):
        backend.expand_volume("vol-00000000000000000", 5 * GiB)


def test_modify_changes_type_iops_and_throughput(backend: AwsBackend, ec2: Any) -> None:
    disk = backend.create_volume("pvc-mod", opts(backend, 10, parameters={"type": "gp2"}))
    changed = backend.modify_volume(
        disk.id, backend.validate_mutable_parameters({"type": "io2", "iops": "2000"})
    )
    volume = ec2_volume(ec2, disk.id)
    assert (volume["VolumeType"], volume["Iops"]) == ("io2", 2000)
    assert changed.parameters["type"] == "io2"


def test_modify_rejects_iops_on_a_type_without_them(backend: AwsBackend) -> None:
    disk = backend.create_volume("pvc-mod2", opts(backend, 10, parameters={"type": "gp2"}))
    with pytest.raises(InvalidParameterError):
        backend.modify_volume(disk.id, {"iops": "4000"})


def test_resize_and_modify_together_make_one_ec2_modification(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend(modify_window=0.5)
    disk = backend.create_volume("pvc-both", opts(backend, 10))
    modifications = record_calls(backend.ec2.client, "ModifyVolume")
    with ThreadPoolExecutor(2) as pool:
        grown = pool.submit(backend.expand_volume, disk.id, 20 * GiB)
        tuned = pool.submit(backend.modify_volume, disk.id, {"iops": "5000", "throughput": "300"})
        assert grown.result() == 20 * GiB
        assert tuned.result().size_bytes == 20 * GiB
    assert len(modifications) == 1
    assert {k: modifications[0].get(k) for k in ("Size", "Iops", "Throughput")} == {
        "Size": 20,
        "Iops": 5000,
        "Throughput": 300,
    }
    volume = ec2_volume(ec2, disk.id)
    assert (volume["Size"], volume["Iops"]) == (20, 5000)
