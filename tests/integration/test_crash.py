"""Crash safety: SIGKILL the driver while it creates many volumes at once, restart it, retry the same
requests. Exactly one volume per name must exist, no orphan file may remain, and deleting everything
must leave no volume file behind."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2
from tests.conformance.driver import Driver, running_driver
from tests.csiclient import CsiClient, connect

pytestmark = pytest.mark.slow

AM = csi_pb2.VolumeCapability.AccessMode
MiB = 1024**2
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)
NAMES = 48  # half empty volumes, half clones of a 32 MiB seed (clones are slow enough to be cut short)
KILL_AFTER = 8  # responses before the SIGKILL
SEED_BYTES = b"seed-data" * 1024


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="crash-") as d:
        yield Path(d)


def request(i: int, seed_id: str) -> csi_pb2.CreateVolumeRequest:
    req = csi_pb2.CreateVolumeRequest(
        name=f"pvc-{i:03d}",
        volume_capabilities=[MOUNT],
        capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB),
    )
    if i % 2:
        req.volume_content_source.volume.volume_id = seed_id
    return req


def make_seed(driver: Driver, c: CsiClient) -> str:
    response: csi_pb2.CreateVolumeResponse = c.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name="seed",
            volume_capabilities=[MOUNT],
            capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB),
        ),
        timeout=30,
    )
    seed = response.volume.volume_id
    with open(driver.data_dir / "volumes" / f"{seed}.img", "r+b") as f:
        for offset in range(0, 32 * MiB, 64 * 1024):
            f.seek(offset)
            f.write(SEED_BYTES[: 32 * 1024])
    return seed


def create_until_killed(driver: Driver, c: CsiClient, seed_id: str) -> dict[str, str]:
    """Fire every request concurrently; SIGKILL the driver after KILL_AFTER answers. Returns the
    name -> volume id answers that arrived before the kill."""
    done: dict[str, str] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        req = request(i, seed_id)
        try:
            vol = c.controller.CreateVolume(req, timeout=30).volume
        except grpc.RpcError:
            return
        with lock:
            done[req.name] = vol.volume_id
            if len(done) == KILL_AFTER:
                driver.kill()

    with futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(NAMES)))
    driver.kill()
    return done


def create_with_retries(c: CsiClient, req: csi_pb2.CreateVolumeRequest) -> str:
    for _ in range(50):
        try:
            return str(c.controller.CreateVolume(req, timeout=30).volume.volume_id)
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE):
                raise
            time.sleep(0.1)
    raise AssertionError(f"{req.name} never succeeded")


def test_sigkill_during_concurrent_creates_leaves_exactly_one_volume_per_name(workdir: Path) -> None:
    data = workdir / "data"
    with running_driver(workdir, "--mode", "controller", data_dir=data) as driver:
        c = connect(driver.endpoint)
        seed_id = make_seed(driver, c)
        before_kill = create_until_killed(driver, c, seed_id)
        c.close()
    assert 0 < len(before_kill) < NAMES, "the kill should land while creates are still running"

    with running_driver(workdir, "--mode", "controller", data_dir=data) as driver:
        c = connect(driver.endpoint)
        reqs = [request(i, seed_id) for i in range(NAMES)]
        with futures.ThreadPoolExecutor(8) as pool:
            ids = dict(
                zip([r.name for r in reqs], pool.map(lambda r: create_with_retries(c, r), reqs), strict=True)
            )
        again = {r.name: create_with_retries(c, r) for r in reqs}
        assert again == ids, "a retried request must return the volume it created"
        for name, vid in before_kill.items():
            assert ids[name] == vid, f"{name} answered {vid} before the crash, {ids[name]} after"
        assert len(set(ids.values())) == NAMES

        listed = {e.volume.volume_id for e in c.controller.ListVolumes(csi_pb2.ListVolumesRequest()).entries}
        assert listed == {*ids.values(), seed_id}
        files = set(os.listdir(data / "volumes"))
        assert files == {f"{v}.img" for v in listed}, "orphan or missing backing files"
        for i, name in enumerate(ids):
            if i % 2:
                with open(data / "volumes" / f"{ids[name]}.img", "rb") as f:
                    assert f.read(len(SEED_BYTES[: 32 * 1024])) == SEED_BYTES[: 32 * 1024], (
                        f"{name} is not a clone"
                    )

        for vid in listed:
            c.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid), timeout=30)
        assert c.controller.ListVolumes(csi_pb2.ListVolumesRequest()).entries == []
        c.close()
    assert os.listdir(data / "volumes") == []
