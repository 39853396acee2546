"""A backend from another package: tests/backend_example is pip-installed (into a private directory, not
the venv) and the real driver, started with `--backend example`, finds it through the
`ballast.backends` entry-point group and serves it over its socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2
from tests.conftest import REPO, require_root
from tests.csiclient import CsiClient, assert_code, client

EXAMPLE = REPO / "tests" / "backend_example"
MiB = 1024**2
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed example package and its entry-point metadata."""
    work = tmp_path_factory.mktemp("example")
    source = work / "src"
    shutil.copytree(EXAMPLE, source)  # building writes into the source tree: keep the repository clean
    target = work / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "--target", str(target), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def _environment(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def _driver(site: Path, tmp: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "csi",
        "--endpoint", f"unix://{tmp}/csi.sock",
        "--data-dir", str(tmp / "data"),
        "--kubelet-dir", str(tmp / "kubelet"),
        "--node-id", "node-x",
        *extra,
    ]  # fmt: skip


@pytest.fixture
def example(site: Path, tmp_path: Path) -> Iterator[CsiClient]:
    (tmp_path / "kubelet").mkdir()
    proc = subprocess.Popen(
        _driver(site, tmp_path, "--backend", "example"), env=_environment(site), stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "csi.sock").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"driver did not start: {proc.communicate()[1].decode()}")
            time.sleep(0.05)
        with client(f"{tmp_path}/csi.sock") as c:
            yield c
    finally:
        proc.terminate()
        proc.wait(timeout=30)


CAP = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"),
    access_mode=csi_pb2.VolumeCapability.AccessMode(
        mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    ),
)


def _request(name: str, size: int) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name, capacity_range=csi_pb2.CapacityRange(required_bytes=size), volume_capabilities=[CAP]
    )


def _create(c: CsiClient, name: str, size: int) -> csi_pb2.Volume:
    response: csi_pb2.CreateVolumeResponse = c.controller.CreateVolume(_request(name, size), timeout=30)
    return response.volume


def test_the_driver_serves_a_backend_installed_as_a_package(example: CsiClient) -> None:
    info = example.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "example.csi.ballast.dev", "the backend's own default driver name"
    vol = _create(example, "data-1", 64 * MiB)
    assert (vol.volume_id, vol.capacity_bytes) == ("data-1", 64 * MiB)
    assert _create(example, "data-1", 64 * MiB) == vol, "create is idempotent by name"
    assert_code(
        example.controller.CreateVolume, _request("data-1", 128 * MiB), grpc.StatusCode.ALREADY_EXISTS
    )
    listed = example.controller.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=30)
    assert [e.volume.volume_id for e in listed.entries] == ["data-1"]
    publish = csi_pb2.ControllerPublishVolumeRequest(volume_id="data-1", node_id="node-x")
    assert_code(example.controller.ControllerPublishVolume, publish, grpc.StatusCode.UNIMPLEMENTED)
    example.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="data-1"), timeout=30)
    example.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="data-1"), timeout=30)
    assert not example.controller.ListVolumes(csi_pb2.ListVolumesRequest(), timeout=30).entries


def test_the_staging_core_stages_the_package_backend_on_a_loop_device(
    example: CsiClient, tmp_path: Path
) -> None:
    require_root()
    _create(example, "staged", 64 * MiB)
    staging = tmp_path / "kubelet" / "plugins" / "staged" / "globalmount"
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id="staged", staging_target_path=str(staging), volume_capability=CAP
    )
    unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id="staged", staging_target_path=str(staging))
    try:
        example.node.NodeStageVolume(stage, timeout=120)
        assert os.path.ismount(staging)
        (staging / "hello").write_text("from a package backend")
    finally:
        example.node.NodeUnstageVolume(unstage, timeout=120)
    assert not os.path.ismount(staging)
    example.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id="staged"), timeout=30)


def test_an_unknown_backend_is_refused_naming_the_installed_ones(site: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        _driver(site, tmp_path, "--backend", "nope"),
        env=_environment(site),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown backend 'nope'; available: local, aws, example" in done.stderr
