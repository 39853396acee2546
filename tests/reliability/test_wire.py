"""Requests refused before any handler runs, without root or a real backend, so a change to the
interceptors that loses this is caught by the quickest run of the suite (the full hostile-input check is
test_fuzz.py): undecodable bytes and over-size maps are INVALID_ARGUMENT, not gRPC's INTERNAL, and a
status that quotes a huge input keeps its code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi import errors
from csi._proto import csi_pb2
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, assert_code, connect
from tests.fakes import FAKE_NODE, FakeBackend


@pytest.fixture
def client(tmp_path: Path) -> Iterator[CsiClient]:
    config, _ = parse_args(["--endpoint", f"unix://{tmp_path}/w.sock", "--node-id", FAKE_NODE])
    driver = Driver(config, backend=FakeBackend())
    driver.start()
    c = connect(f"{tmp_path}/w.sock")
    yield c
    c.close()
    driver.stop(grace=1)


METHODS = ("/csi.v1.Identity/Probe", "/csi.v1.Controller/CreateVolume", "/csi.v1.Node/NodeStageVolume")
BROKEN = {
    "field-number-zero": b"\x00",
    "length-past-the-end": b"\x0a\x80\x80\x80\x80\x10",
    "unknown-wire-type": b"\x0f",
}
CASES = [
    pytest.param(m, p, id=f"{m.rsplit('/', 1)[1]}-{name}") for m in METHODS for name, p in BROKEN.items()
]
# field 1 is a string (name, volume_id) in these two: bytes that are not UTF-8 cannot decode
CASES += [
    pytest.param(m, b"\x0a\x05lv-\xc3\x28", id=f"{m.rsplit('/', 1)[1]}-string-not-utf8") for m in METHODS[1:]
]


@pytest.mark.parametrize(("method", "payload"), CASES)
def test_undecodable_request_is_invalid_argument(client: CsiClient, method: str, payload: bytes) -> None:
    call = client.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as err:
        call(payload, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert "could not be decoded" in (err.value.details() or "")


def test_a_request_with_unknown_fields_still_decodes(client: CsiClient) -> None:
    """Only bytes that do not parse are refused: unknown fields (a newer CO) are ignored as protobuf says."""
    call = client.channel.unary_unary(
        "/csi.v1.Identity/Probe",
        request_serializer=None,
        response_deserializer=csi_pb2.ProbeResponse.FromString,
    )
    assert call(b"\xa0\x06\x01", timeout=10).ready.value  # field 100, varint 1


BIG = {f"k{i}": "v" * 40 for i in range(120)}  # about 5.3 KiB: over the spec's 4 KiB per map
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)
OVERSIZE = [
    pytest.param(
        "GetCapacity", csi_pb2.GetCapacityRequest(parameters=BIG), "parameters", id="capacity-params"
    ),
    pytest.param(
        "NodeStageVolume",
        csi_pb2.NodeStageVolumeRequest(volume_id="v", volume_context=BIG),
        "volume_context",
        id="stage-volume-context",
    ),
    pytest.param(
        "NodePublishVolume",
        csi_pb2.NodePublishVolumeRequest(volume_id="v", publish_context=BIG),
        "publish_context",
        id="publish-publish-context",
    ),
    pytest.param(
        "CreateVolume",
        csi_pb2.CreateVolumeRequest(
            name="n",
            accessibility_requirements=csi_pb2.TopologyRequirement(
                requisite=[csi_pb2.Topology(segments=BIG)]
            ),
        ),
        "accessibility_requirements.requisite.segments",
        id="create-topology-segments",
    ),
]


@pytest.mark.parametrize(("method", "request_", "field"), OVERSIZE)
def test_a_map_over_4_kib_is_invalid_argument(
    client: CsiClient, method: str, request_: object, field: str
) -> None:
    stub = client.node if method.startswith("Node") else client.controller
    message = assert_code(getattr(stub, method), request_, grpc.StatusCode.INVALID_ARGUMENT)
    assert message == f"{field} is larger than 4096 bytes"


def test_secrets_are_not_held_to_the_map_limit(client: CsiClient) -> None:
    """The driver never reads secrets, and a Kubernetes Secret may be larger than 4 KiB."""
    request = csi_pb2.CreateVolumeRequest(name="big-secret", volume_capabilities=[MOUNT], secrets=BIG)
    assert client.controller.CreateVolume(request, timeout=10).volume.volume_id


@pytest.mark.parametrize(
    ("method", "request_", "code"),
    [
        pytest.param(
            "ListVolumes",
            csi_pb2.ListVolumesRequest(starting_token="t" * 20_000),
            grpc.StatusCode.ABORTED,
            id="list-token",
        ),
        pytest.param(
            "NodeStageVolume",
            csi_pb2.NodeStageVolumeRequest(
                volume_id="v",
                staging_target_path="/var/lib/kubelet/plugins/x/globalmount",
                volume_capability=csi_pb2.VolumeCapability(
                    mount=csi_pb2.VolumeCapability.MountVolume(mount_flags=["f" * 20_000]),
                    access_mode=MOUNT.access_mode,
                ),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="stage-mount-flag",
        ),
    ],
)
def test_a_status_quoting_a_huge_input_keeps_its_code(
    client: CsiClient, method: str, request_: object, code: grpc.StatusCode
) -> None:
    """Left whole, such a message would pass gRPC's 16 KiB header limit: the client would see
    RESOURCE_EXHAUSTED instead of the spec's code."""
    stub = client.node if method.startswith("Node") else client.controller
    message = assert_code(getattr(stub, method), request_, code)
    assert len(message) <= errors.MESSAGE_LIMIT and message.endswith("characters cut)")
