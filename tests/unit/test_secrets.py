"""Secrets (csi_secret fields and secrets maps) never reach a log line, at any level, in any format."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi import logs
from csi._proto import csi_pb2
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, connect
from tests.fakes import FAKE_NODE, FakeBackend

SECRET = "s3cr3t-Pa55w0rd-xyzzy"
SECRETS = {"password": SECRET, "token": SECRET[::-1]}

Mount = csi_pb2.VolumeCapability.MountVolume
AccessMode = csi_pb2.VolumeCapability.AccessMode
CAP = csi_pb2.VolumeCapability(mount=Mount(), access_mode=AccessMode(mode=AccessMode.SINGLE_NODE_WRITER))


@pytest.fixture(params=["text", "json"])
def driver_logs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[CsiClient, io.StringIO]]:
    stream = io.StringIO()
    logs.setup(request.param, "debug", stream)
    config, _ = parse_args(
        [
            "--endpoint",
            f"unix://{tmp_path}/csi.sock",
            "--node-id",
            FAKE_NODE,
            "--allowed-path-prefix",
            str(tmp_path),
        ]
    )
    driver = Driver(config, backend=FakeBackend())
    driver.start()
    client = connect(f"{tmp_path}/csi.sock")
    yield client, stream
    client.close()
    driver.stop(grace=1)
    logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "ballast"]


def _call_all(client: CsiClient, tmp_path: Path) -> list[str]:
    """Send secrets through every RPC that carries them; return the error messages seen."""
    import grpc

    messages: list[str] = []

    def attempt(fn: object, req: object) -> object:
        try:
            return fn(req, timeout=30)  # type: ignore[operator]
        except grpc.RpcError as err:
            messages.append(err.details() or "")
            return None

    vol = attempt(
        client.controller.CreateVolume,
        csi_pb2.CreateVolumeRequest(name="secret-vol", volume_capabilities=[CAP], secrets=SECRETS),
    )
    volume_id = vol.volume.volume_id if vol else "lv-missing"  # type: ignore[attr-defined]
    # an invalid request that must fail: the secret still must not leak through the error
    attempt(client.controller.CreateVolume, csi_pb2.CreateVolumeRequest(name="", secrets=SECRETS))
    attempt(
        client.controller.ControllerPublishVolume,
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=volume_id, node_id=FAKE_NODE, volume_capability=CAP, secrets=SECRETS
        ),
    )
    attempt(
        client.controller.CreateSnapshot,
        csi_pb2.CreateSnapshotRequest(name="secret-snap", source_volume_id=volume_id, secrets=SECRETS),
    )
    attempt(
        client.node.NodeStageVolume,
        csi_pb2.NodeStageVolumeRequest(
            volume_id=volume_id,
            staging_target_path=str(tmp_path / "stage"),
            volume_capability=CAP,
            secrets=SECRETS,
        ),
    )
    attempt(
        client.controller.ControllerExpandVolume,
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=2 << 30), secrets=SECRETS
        ),
    )
    attempt(client.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=SECRETS))
    return messages


def test_secrets_never_logged(driver_logs: tuple[CsiClient, io.StringIO], tmp_path: Path) -> None:
    client, stream = driver_logs
    messages = _call_all(client, tmp_path)
    text = stream.getvalue()
    assert "CreateVolume" in text and "secret-vol" in text, "the RPCs were logged at all"
    for secret in SECRETS.values():
        assert secret not in text
        assert all(secret not in m for m in messages)


def test_safe_dict_redacts_nested_secrets() -> None:
    req = csi_pb2.NodeStageVolumeRequest(volume_id="v", secrets=SECRETS, volume_context={"a": "b"})
    rendered = repr(logs.safe_dict(req))
    assert SECRET not in rendered and "<redacted>" in rendered and "'a': 'b'" in rendered
