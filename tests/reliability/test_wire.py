"""Undecodable request bytes are INVALID_ARGUMENT, not gRPC's INTERNAL -- without root or a real backend,
so a change to the interceptors that loses this is caught by the quickest run of the suite (the full
hostile-input check is test_fuzz.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, connect
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
