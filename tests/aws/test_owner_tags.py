"""The operator's tags (--aws-extra-tags, --aws-k8s-tag-cluster-id; csi/backends/aws/ownertags.py) on
every volume, snapshot and clone scratch snapshot the aws backend makes, under a class's tags, never
compared on a retried create, and refused at start-up where EC2 or the driver could not take them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.ownertags import OwnerTags
from csi.backends.base import ContentSource, DiskOptions, GiB, SourceKind
from csi.config import parse_args
from csi.failures import FailedPreconditionError
from tests.aws.conftest import record_calls

OWNER = OwnerTags({"team": "storage"}, "prod-1")


def _tags(record: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in record.get("Tags", [])}


def test_the_flags_reach_the_backend_config() -> None:
    config, _ = parse_args(
        ["--backend", "aws", "--aws-extra-tags", " team = storage ,cost=42", "--aws-k8s-tag-cluster-id", "c1"]
    )
    assert config.backend.aws_extra_tags == {"team": "storage", "cost": "42"}
    assert config.backend.aws_k8s_tag_cluster_id == "c1"


def test_volumes_carry_the_cluster_and_extra_tags_under_the_classes(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend(owner_tags=OwnerTags({"team": "storage", "tier": "gold"}, "prod-1"))
    parameters = backend.validate_parameters({"tagSpecification_1": "tier=silver"})
    disk = backend.create_volume("pvc-1", DiskOptions(size_bytes=GiB, parameters=parameters))
    tags = _tags(ec2.describe_volumes(VolumeIds=[disk.id])["Volumes"][0])
    assert {k: tags[k] for k in ("kubernetes.io/cluster/prod-1", "Name", "KubernetesCluster")} == {
        "kubernetes.io/cluster/prod-1": "owned",
        "Name": "prod-1-dynamic-pvc-1",
        "KubernetesCluster": "prod-1",
    }
    assert (tags["team"], tags["tier"], tags["CSIVolumeName"]) == ("storage", "silver", "pvc-1")


def test_snapshots_and_scratch_snapshots_carry_them(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend(owner_tags=OWNER)
    source = backend.create_volume(
        "pvc-src", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    )
    snap = backend.create_snapshot("snapcontent-1", source.id, {})
    tags = _tags(ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0])
    assert (tags["team"], tags["Name"], tags["kubernetes.io/cluster/prod-1"]) == (
        "storage",
        "prod-1-dynamic-snapcontent-1",
        "owned",
    )
    assert "KubernetesCluster" not in tags
    scratch = record_calls(backend.ec2.client, "CreateSnapshot")
    clone = DiskOptions(
        size_bytes=GiB,
        parameters=backend.validate_parameters({}),
        source=ContentSource(SourceKind.VOLUME, source.id),
    )
    backend.create_volume("pvc-clone", clone)  # moto has no CopyVolumes: through a scratch snapshot
    (made,) = scratch
    assert {t["Key"]: t["Value"] for t in made["TagSpecifications"][0]["Tags"]}["team"] == "storage"


@pytest.mark.parametrize("kind", ["volume", "snapshot"])
def test_extra_tags_win_over_the_cluster_tags_as_in_the_ebs_driver(
    make_backend: Callable[..., AwsBackend], ec2: Any, kind: str
) -> None:
    """The EBS driver's CreateVolume and CreateSnapshot write the --k8s-tag-cluster-id tags first and
    --extra-tags over them: an operator's own Name or KubernetesCluster is what EC2 gets."""
    backend = make_backend(owner_tags=OwnerTags({"Name": "billing", "KubernetesCluster": "legacy"}, "prod-1"))
    made = backend.create_volume(
        "pvc-3", DiskOptions(size_bytes=GiB, parameters=backend.validate_parameters({}))
    )
    if kind == "volume":
        tags = _tags(ec2.describe_volumes(VolumeIds=[made.id])["Volumes"][0])
    else:
        snap = backend.create_snapshot("snapcontent-3", made.id, {})
        tags = _tags(ec2.describe_snapshots(SnapshotIds=[snap.id])["Snapshots"][0])
    assert (tags["Name"], tags["KubernetesCluster"], tags["kubernetes.io/cluster/prod-1"]) == (
        "billing",
        "legacy",
        "owned",
    )


def test_a_retried_create_is_not_held_to_tags_added_since(make_backend: Callable[..., AwsBackend]) -> None:
    options = DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})
    first = make_backend().create_volume("pvc-9", options)
    assert make_backend(owner_tags=OWNER).create_volume("pvc-9", options).id == first.id


@pytest.mark.parametrize(
    ("owner", "message"),
    [
        pytest.param(OwnerTags({"CSIVolumeName": "x"}), "driver's or AWS's", id="drivers-key"),
        pytest.param(OwnerTags({"aws:createdBy": "x"}), "driver's or AWS's", id="aws-key"),
        pytest.param(OwnerTags({"k" * 129: "x"}), "limits", id="key-too-long"),
        pytest.param(OwnerTags({"k": "v" * 257}), "limits", id="value-too-long"),
        pytest.param(OwnerTags(cluster_id="a/b"), "no '/'", id="cluster-id-with-slash"),
        pytest.param(OwnerTags(cluster_id="c" * 107), "at most 106", id="cluster-id-too-long"),
    ],
)
def test_tags_ec2_or_the_driver_cannot_take_stop_the_start(
    make_backend: Callable[..., AwsBackend], owner: OwnerTags, message: str
) -> None:
    with pytest.raises(FailedPreconditionError, match=message):
        make_backend(owner_tags=owner)
