"""ControllerExpandVolume and ControllerModifyVolume of one EBS volume, through the real gRPC server
over moto (behind tests/motoproxy.py, which counts ModifyVolume calls): arriving together they reach the
coalescer and become one ModifyVolume (EBS allows one per volume, then hours of cool-down), whatever
spelling of the volume id each uses; a duplicate of either, or a DeleteVolume meanwhile, is still refused
(ABORTED), because the in-flight keys use the canonical volume id."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from tests.aws.conftest import inject_responses, serving
from tests.csiclient import CsiClient
from tests.motoproxy import MotoProxy
from tests.motoserver import ZONE, make_client

WINDOW = 1.0  # the coalescer's window: the second request arrives within it
LATER = 0.3
OK = grpc.StatusCode.OK
ABORTED = grpc.StatusCode.ABORTED

Request = Callable[[str], tuple[str, Any]]  # volume id -> (controller method, request)


def expand(gib: int, handle: str = "{}") -> Request:
    def build(vid: str) -> tuple[str, Any]:
        size = csi_pb2.CapacityRange(required_bytes=gib * GiB)
        return "ControllerExpandVolume", csi_pb2.ControllerExpandVolumeRequest(
            volume_id=handle.format(vid), capacity_range=size
        )

    return build


def modify(iops: int, handle: str = "{}") -> Request:
    def build(vid: str) -> tuple[str, Any]:
        return "ControllerModifyVolume", csi_pb2.ControllerModifyVolumeRequest(
            volume_id=handle.format(vid), mutable_parameters={"iops": str(iops)}
        )

    return build


def delete(handle: str = "{}") -> Request:
    def build(vid: str) -> tuple[str, Any]:
        return "DeleteVolume", csi_pb2.DeleteVolumeRequest(volume_id=handle.format(vid))

    return build


@pytest.fixture
def serve(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str, tmp_path: Path
) -> Iterator[Callable[[bool], tuple[CsiClient, AwsBackend]]]:
    """Start the real driver over the aws backend (through the proxy); `coalescing=False` serves it as
    if the backend had no coalescer."""
    with contextlib.ExitStack() as stack:

        def start(coalescing: bool) -> tuple[CsiClient, AwsBackend]:
            backend = make_backend(client=make_client(proxy.endpoint, account), modify_window=WINDOW)
            backend.capabilities = backend.capabilities._replace(coalesces_modifications=coalescing)
            return stack.enter_context(serving(backend, f"{tmp_path}/csi.sock")), backend

        yield start


def code_of(future: Any) -> grpc.StatusCode:
    try:
        future.result()
    except grpc.RpcError as exc:
        return exc.code()
    return OK


IN_TREE = "aws:///{}"
ZONAL = f"aws://{ZONE}/{{}}"


@pytest.mark.parametrize(
    ("coalescing", "first", "second", "second_code", "size_gib", "iops"),
    [
        pytest.param(True, expand(20), modify(4000), OK, 20, 4000, id="expand-then-modify-are-one"),
        pytest.param(True, expand(20), modify(4000, IN_TREE), OK, 20, 4000, id="modify-by-in-tree-id-joins"),
        pytest.param(True, modify(4000), expand(20, ZONAL), OK, 20, 4000, id="expand-by-zonal-id-joins"),
        pytest.param(True, expand(20), expand(30, IN_TREE), ABORTED, 20, 3000, id="second-expand-refused"),
        pytest.param(True, expand(20), delete(IN_TREE), ABORTED, 20, 3000, id="delete-meanwhile-refused"),
        pytest.param(False, expand(20), modify(4000), ABORTED, 20, 3000, id="no-coalescer-modify-refused"),
    ],
)
def test_expand_and_modify_arriving_together(
    serve: Callable[[bool], tuple[CsiClient, AwsBackend]],
    proxy: MotoProxy,
    ec2: Any,
    coalescing: bool,
    first: Request,
    second: Request,
    second_code: grpc.StatusCode,
    size_gib: int,
    iops: int,
) -> None:
    client, backend = serve(coalescing)
    vid = backend.create_volume("pvc-mod", DiskOptions(size_bytes=10 * GiB, parameters={"type": "gp3"})).id
    proxy.reset()
    calls = [first(vid), second(vid)]
    futures = []
    for method, request in calls:
        futures.append(getattr(client.controller, method).future(request, timeout=60))
        time.sleep(LATER)
    assert [code_of(f) for f in futures] == [OK, second_code], [f.exception() for f in futures]
    assert proxy.calls["ModifyVolume"] == 1
    (volume,) = ec2.describe_volumes(VolumeIds=[vid])["Volumes"]
    assert (volume["Size"], volume["Iops"]) == (size_gib, iops)


def test_a_repeated_expand_waits_for_the_modification_still_in_flight(
    serve: Callable[[bool], tuple[CsiClient, AwsBackend]], ec2: Any
) -> None:
    """The first ControllerExpandVolume's ModifyVolume was made, and its wait for `optimizing` timed
    out; EC2 describes the volume at its new size while the modification is still `modifying`. The
    retry answers only once the modification is usable, as docs/aws.md promises (the EBS CSI driver
    waits the same way), and ControllerGetVolume meanwhile reports the size usable now."""
    client, backend = serve(True)
    vid = backend.create_volume("pvc-mod", DiskOptions(size_bytes=10 * GiB, parameters={"type": "gp3"})).id
    ec2.modify_volume(VolumeId=vid, Size=20)  # moto makes it at once: its answers are held at modifying
    item = {"VolumeId": vid, "ModificationState": "modifying", "OriginalSize": 10, "TargetSize": 20}
    modifying = inject_responses(
        backend.ec2.client, "DescribeVolumesModifications", [{"VolumesModifications": [item]}] * 4
    )
    got = client.controller.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=vid), timeout=60)
    assert got.volume.capacity_bytes == 10 * GiB
    method, request = expand(20)(vid)
    answer = getattr(client.controller, method)(request, timeout=60)
    assert modifying == [], "the expand answered while the modification was still modifying"
    assert answer.capacity_bytes == 20 * GiB
