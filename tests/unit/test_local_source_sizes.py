"""CreateVolume from a snapshot or a volume with the local backend, over the real gRPC server on a unix
socket (csi/backends/local/contents.py): the capacity range bounds the new volume, never the source.
Spec, CapacityRange: required_bytes "MUST be at least this big", limit_bytes "MUST not be bigger than
this", and without a range the plugin MAY choose; so the volume is as big as its source when the range
allows it, and only a source past limit_bytes is OUT_OF_RANGE."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.local import LocalBackend
from csi.config import parse_args
from csi.server import Driver
from tests.csiclient import CsiClient, assert_code, connect

MiB, GiB = 1024**2, 1024**3
AM = csi_pb2.VolumeCapability.AccessMode
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


@pytest.fixture
def client() -> Iterator[CsiClient]:
    with tempfile.TemporaryDirectory(prefix="src-") as d:  # short: unix socket paths are limited
        socket = f"{d}/csi.sock"
        config, _ = parse_args(["--mode", "controller", "--endpoint", f"unix://{socket}", "--node-id", "n1"])
        backend = LocalBackend.open(str(Path(d) / "data"), driver_name="local.ballast.dev", node_id="n1")
        driver = Driver(config, backend=backend)
        driver.start()
        c = connect(socket)
        yield c
        c.close()
        driver.stop(grace=1)
        backend.close()


def create(
    c: CsiClient, name: str, size_range: tuple[int, int] | None, source: str = "", snapshot: str = ""
) -> Any:
    content = None
    if source:
        content = csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=source)
        )
    if snapshot:
        content = csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snapshot)
        )
    request = csi_pb2.CreateVolumeRequest(
        name=name, volume_capabilities=[MOUNT], volume_content_source=content
    )
    if size_range is not None:
        request.capacity_range.CopyFrom(
            csi_pb2.CapacityRange(required_bytes=size_range[0], limit_bytes=size_range[1])
        )
    return request


@pytest.mark.parametrize(
    ("source_size", "size_range", "expected"),
    [
        pytest.param(64 * MiB, (MiB, 128 * MiB), 64 * MiB, id="range-admits-the-source"),
        pytest.param(64 * MiB, (MiB, 0), 64 * MiB, id="required-below-the-source-no-limit"),
        pytest.param(2 * GiB, None, 2 * GiB, id="no-range-source-above-the-default"),
        pytest.param(64 * MiB, (128 * MiB, 0), 128 * MiB, id="required-above-the-source"),
        pytest.param(64 * MiB, (MiB, 32 * MiB), 0, id="source-past-the-limit-is-out-of-range"),
    ],
)
@pytest.mark.parametrize("kind", ["snapshot", "clone"])
def test_a_volume_from_a_source_is_at_least_as_big_as_the_source(
    client: CsiClient, kind: str, source_size: int, size_range: tuple[int, int] | None, expected: int
) -> None:
    ctl = client.controller
    src = ctl.CreateVolume(create(client, "src", (source_size, 0)), timeout=30).volume
    snap = ""
    if kind == "snapshot":
        made = ctl.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name="snap", source_volume_id=src.volume_id))
        snap = made.snapshot.snapshot_id
    request = create(client, "new", size_range, source="" if snap else src.volume_id, snapshot=snap)
    if not expected:
        assert_code(ctl.CreateVolume, request, grpc.StatusCode.OUT_OF_RANGE, contains="larger than")
        return
    made = ctl.CreateVolume(request, timeout=30).volume
    assert made.capacity_bytes == expected
    again = ctl.CreateVolume(request, timeout=30).volume
    assert (again.volume_id, again.capacity_bytes) == (made.volume_id, expected)
    got = ctl.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=made.volume_id), timeout=30)
    assert got.volume.capacity_bytes == expected
