"""ControllerModifyVolume refusals through the real gRPC server over moto (behind tests/motoproxy.py,
which stands in for the EC2 checks moto lacks): spec, ControllerModifyVolume INVALID_ARGUMENT, "The SP
MUST NOT have applied any modification to the volume as part of this specific call". Settings the
volume type refuses at its size (params.VOLUME_TYPES, the table CreateVolume uses) are refused before
any call, a type that cannot hold the volume's size is INVALID_ARGUMENT (the external-resizer gives up
only on that code; OUT_OF_RANGE stays ControllerExpandVolume's), and EC2 refusing the ModifyVolume
leaves the tags as they were. CreateVolume's mutable_parameters are checked the same way, and the EBS
driver's deprecated `volumeType` key is the alias of `type`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from tests.aws.conftest import serving
from tests.csiclient import CsiClient, assert_code
from tests.motoproxy import MotoProxy
from tests.motoserver import make_client

INVALID = grpc.StatusCode.INVALID_ARGUMENT
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE
TAG = {"tagSpecification_1": "tier=fast", "tagDeletion_1": "keep"}


@pytest.fixture
def served(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, tmp_path: Path
) -> Iterator[tuple[CsiClient, AwsBackend]]:
    """The real driver over the aws backend, talking to moto through the proxy."""
    backend = make_backend(client=make_client(proxy.endpoint, account))
    with serving(backend, f"{tmp_path}/csi.sock") as client:
        yield client, backend


def volume(backend: AwsBackend, gib: int = 10, kind: str = "gp3") -> str:
    parameters = backend.validate_parameters({"type": kind, "tagSpecification_1": "keep=1"})
    return backend.create_volume("pvc-mod", DiskOptions(size_bytes=gib * GiB, parameters=parameters)).id


def described(ec2: Any, vid: str) -> tuple[dict[str, Any], dict[str, str]]:
    (record,) = ec2.describe_volumes(VolumeIds=[vid])["Volumes"]
    return record, {t["Key"]: t["Value"] for t in record.get("Tags", [])}


def modify(vid: str, parameters: dict[str, str]) -> csi_pb2.ControllerModifyVolumeRequest:
    return csi_pb2.ControllerModifyVolumeRequest(volume_id=vid, mutable_parameters=parameters)


@pytest.mark.parametrize(
    ("settings", "refused_by_ec2", "says"),
    [
        pytest.param({"throughput": "5000"}, "", "125..2000", id="gp3-throughput-above-2000"),
        pytest.param({"throughput": "124"}, "", "125..2000", id="gp3-throughput-below-125"),
        pytest.param({"iops": "2000"}, "", "3000..5000", id="gp3-iops-below-3000"),
        pytest.param({"iops": "64000"}, "", "3000..5000", id="gp3-iops-past-500-per-gib"),
        pytest.param({"iops": "100"}, "", "3000..5000", id="gp3-iops-100"),
        pytest.param({"type": "io2", "iops": "20000"}, "", "100..10000", id="io2-iops-past-1000-per-gib"),
        pytest.param({"type": "st1"}, "", "125..16384", id="st1-cannot-hold-10-gib"),
        pytest.param({"iops": "4000"}, "InvalidParameterValue", "injected", id="ec2-refuses"),
        pytest.param({"iops": "4000"}, "UnsupportedOperation", "injected", id="ec2-refuses-unsupported"),
    ],
)
def test_a_refused_modification_changes_nothing(
    served: tuple[CsiClient, AwsBackend],
    proxy: MotoProxy,
    ec2: Any,
    settings: dict[str, str],
    refused_by_ec2: str,
    says: str,
) -> None:
    client, backend = served
    vid = volume(backend)
    before, tags = described(ec2, vid)
    proxy.reset()
    if refused_by_ec2:
        proxy.fail("ModifyVolume", refused_by_ec2, times=1)
    assert_code(
        client.controller.ControllerModifyVolume, modify(vid, {**settings, **TAG}), INVALID, contains=says
    )
    after, tags_after = described(ec2, vid)
    assert tags_after == tags, "tags changed although the modification was refused"
    assert (after["VolumeType"], after["Iops"], after.get("Throughput")) == (
        before["VolumeType"],
        before["Iops"],
        before.get("Throughput"),
    )
    assert proxy.calls["CreateTags"] == proxy.calls["DeleteTags"] == 0
    assert proxy.calls["ModifyVolume"] == (1 if refused_by_ec2 else 0)


def test_a_type_that_cannot_hold_the_size_is_invalid_but_expanding_past_it_is_out_of_range(
    served: tuple[CsiClient, AwsBackend], ec2: Any
) -> None:
    client, backend = served
    vid = volume(backend, kind="gp2")
    assert_code(client.controller.ControllerModifyVolume, modify(vid, {"type": "sc1"}), INVALID)
    too_big = csi_pb2.CapacityRange(required_bytes=20000 * GiB)
    expand = csi_pb2.ControllerExpandVolumeRequest(volume_id=vid, capacity_range=too_big)
    assert_code(client.controller.ControllerExpandVolume, expand, OUT_OF_RANGE, contains="1..16384")
    assert described(ec2, vid)[0]["Size"] == 10


def test_an_accepted_modification_then_changes_the_tags(
    served: tuple[CsiClient, AwsBackend], ec2: Any
) -> None:
    client, backend = served
    vid = volume(backend)
    client.controller.ControllerModifyVolume(modify(vid, {"iops": "5000", **TAG}), timeout=60)
    record, tags = described(ec2, vid)
    assert record["Iops"] == 5000 and tags["tier"] == "fast" and "keep" not in tags


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        pytest.param({"volumeType": "io2", "iops": "2000"}, "io2", id="volumeType-alias"),
        pytest.param({"VolumeType": "gp2"}, "gp2", id="alias-any-case"),
        pytest.param({"type": "gp2", "volumeType": "io2"}, "gp2", id="type-wins"),
    ],
)
def test_the_deprecated_volume_type_key_is_an_alias_of_type(
    served: tuple[CsiClient, AwsBackend], ec2: Any, given: dict[str, str], kind: str
) -> None:
    client, backend = served
    vid = volume(backend)
    client.controller.ControllerModifyVolume(modify(vid, given), timeout=60)
    assert described(ec2, vid)[0]["VolumeType"] == kind


@pytest.mark.parametrize(
    "mutable",
    [
        pytest.param({"throughput": "5000"}, id="throughput-above-2000"),
        pytest.param({"iops": "64000"}, id="iops-past-500-per-gib"),
        pytest.param({"iops": "100"}, id="iops-below-3000"),
        pytest.param({"type": "gp2", "iops": "4000"}, id="iops-on-gp2"),
    ],
)
def test_create_volume_checks_its_mutable_parameters_alike(
    served: tuple[CsiClient, AwsBackend], ec2: Any, mutable: dict[str, str]
) -> None:
    client, _ = served
    capability = csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
        ),
    )
    request = csi_pb2.CreateVolumeRequest(
        name="pvc-new",
        capacity_range=csi_pb2.CapacityRange(required_bytes=10 * GiB),
        volume_capabilities=[capability],
        parameters={"type": "gp3"},
        mutable_parameters=mutable,
    )
    assert_code(client.controller.CreateVolume, request, INVALID)
    assert ec2.describe_volumes()["Volumes"] == []
