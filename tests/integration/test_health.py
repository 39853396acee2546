"""Volume and storage health on real devices: what the kernel reports about a staged volume's filesystem
(ext4's error counter, an xfs shut down), a block volume whose loop device was detached under it, and the
data dir's own filesystem (nearly full, errored, read-only), each through the real driver's socket.

Errors are made the way the kernel records them: ext4's `trigger_fs_error` sysfs knob (it counts one
error, as a real one would), `xfs_io -x -c shutdown`, a `losetup -d`, a file that fills the data dir.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import grpc
import pytest

from csi._proto import csi_pb2
from csi.devices import rdev
from csi.fshealth import device_name
from tests.conftest import require_tool
from tests.csiclient import assert_code
from tests.e2e.process import wait_for
from tests.integration.conftest import (
    MiB,
    NodeEnv,
    Volume,
    block_cap,
    loop_filesystem,
    mount_cap,
    running_node_env,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _node_health(env: NodeEnv, vol: Volume, **paths: str) -> list[tuple[int, str, str]]:
    req = csi_pb2.NodeGetVolumeHealthRequest(volume_id=vol.id, **paths)
    health = env.client.node.NodeGetVolumeHealth(req, timeout=60).volume_health
    assert health.volume_id == vol.id
    return [(e.status, e.reason, e.message) for e in health.health_statuses]


def _controller_health(env: NodeEnv, vol: Volume) -> list[tuple[int, str]]:
    req = csi_pb2.ControllerGetVolumeHealthRequest(volume_id=vol.id)
    health = env.client.controller.ControllerGetVolumeHealth(req, timeout=60).volume_health
    return [(e.status, e.reason) for e in health.health_statuses]


def _device_of(mount_point: str) -> str:
    return subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", mount_point], capture_output=True, text=True, check=True
    ).stdout.strip()


def _trigger_ext4_error(name: str | None, text: str) -> None:
    """Count one error on ext4 device `name` and wait until sysfs shows it: the kernel stashes the error
    and copies it into the superblock's counter (which errors_count reads) from a work queue, later."""
    assert name is not None, "the staged device has no kernel name"
    counter = Path(f"/sys/fs/ext4/{name}/errors_count")
    before = int(counter.read_text())
    with open(f"/sys/fs/ext4/{name}/trigger_fs_error", "w") as knob:
        knob.write(text)
    wait_for(lambda: int(counter.read_text()) > before, 30, f"ext4 {name} to count the error")


def test_ext4_errors_the_kernel_counted_are_degraded_on_both_sides(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    node_env.stage(vol, mount_cap("ext4"))
    node_env.publish(vol, mount_cap("ext4"))
    paths = {"staging_target_path": vol.staging, "volume_publish_path": vol.target}
    assert _node_health(node_env, vol, **paths) == []
    assert _controller_health(node_env, vol) == []
    name = device_name(rdev(_device_of(vol.staging)))
    assert name is not None
    _trigger_ext4_error(name, "ballast health test\n")
    found = _node_health(node_env, vol, **paths)
    assert [(s, r) for s, r, _ in found] == [(csi_pb2.DEGRADED, "FilesystemErrors")]
    assert "fsck.ext4" in found[0][2] and name in found[0][2]
    assert _controller_health(node_env, vol) == [(csi_pb2.DEGRADED, "FilesystemErrors")]
    listed = node_env.client.controller.ControllerListVolumeHealth(
        csi_pb2.ControllerListVolumeHealthRequest()
    )
    assert [e.volume_id for e in listed.entries] == [vol.id]


def test_ext4_remounted_read_only_after_errors_is_degraded(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    cap = mount_cap("ext4", flags=("errors=remount-ro",))
    node_env.stage(vol, cap)
    name = device_name(rdev(_device_of(vol.staging)))
    _trigger_ext4_error(name, "ballast health test\n")
    reasons = [r for _, r, _ in _node_health(node_env, vol, staging_target_path=vol.staging)]
    assert reasons == ["FilesystemErrors", "FilesystemReadOnly"]


def test_expanding_an_ext4_that_remounted_itself_read_only_is_failed_precondition(node_env: NodeEnv) -> None:
    """The bind mount at the target still says rw; the superblock says ro. Growing is refused for what it
    is, before resize2fs is asked."""
    vol = node_env.volume()
    cap = mount_cap("ext4", flags=("errors=remount-ro",))
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    node_env.driver.backend.expand_volume(vol.id, 128 * MiB)
    name = device_name(rdev(_device_of(vol.staging)))
    _trigger_ext4_error(name, "ballast expand test\n")
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vol.id,
        volume_path=vol.target,
        capacity_range=csi_pb2.CapacityRange(required_bytes=128 * MiB),
        volume_capability=cap,
    )
    assert_code(
        node_env.client.node.NodeExpandVolume,
        request,
        grpc.StatusCode.FAILED_PRECONDITION,
        contains=f"{vol.target} is mounted read-only; the filesystem cannot grow",
    )


def test_an_xfs_shut_down_is_inaccessible(node_env: NodeEnv) -> None:
    xfs_io = require_tool("xfs_io")
    require_tool("mkfs.xfs")
    vol = node_env.volume(size=300 * MiB)
    node_env.stage(vol, mount_cap("xfs"))
    assert _node_health(node_env, vol, staging_target_path=vol.staging) == []
    subprocess.run([xfs_io, "-x", "-c", "shutdown", vol.staging], check=True)
    found = _node_health(node_env, vol)
    assert [(s, r) for s, r, _ in found] == [(csi_pb2.INACCESSIBLE, "FilesystemShutDown")]
    assert "xfs_repair" in found[0][2]
    stats = csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=vol.staging)
    # there, but unreadable: not "does not exist" (NOT_FOUND would send the operator the wrong way)
    assert_code(
        node_env.client.node.NodeGetVolumeStats, stats, grpc.StatusCode.INTERNAL, contains="cannot be read"
    )


def test_a_block_volume_whose_loop_device_was_detached_is_device_lost(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    node_env.stage(vol, block_cap())
    node_env.publish(vol, block_cap())
    assert _node_health(node_env, vol, volume_publish_path=vol.target) == []
    device = f"/dev/{device_name(rdev(vol.target))}"  # the published path is the device node
    subprocess.run(["losetup", "-d", device], check=True)  # nothing holds a block publish open
    for paths in ({}, {"volume_publish_path": vol.target}):
        found = _node_health(node_env, vol, **paths)
        assert [(s, r) for s, r, _ in found] == [(csi_pb2.INACCESSIBLE, "DeviceLost")], paths
    assert "stage it again" in found[0][2]


def test_a_publish_path_with_nothing_mounted_is_inaccessible(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    node_env.stage(vol, mount_cap())
    found = _node_health(node_env, vol, volume_publish_path=vol.target)
    assert [(s, r) for s, r, _ in found] == [(csi_pb2.INACCESSIBLE, "NotPublished")]


def test_a_volume_not_on_this_node_is_not_found(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    req = csi_pb2.NodeGetVolumeHealthRequest(volume_id=vol.id)
    assert_code(
        node_env.client.node.NodeGetVolumeHealth, req, grpc.StatusCode.NOT_FOUND, contains="not on this node"
    )


def test_storage_health_of_the_data_dir_filesystem(tmp_path: Path) -> None:
    (tmp_path / "fs").mkdir()
    with (
        loop_filesystem(tmp_path / "fs", "ext4", 64 * MiB, mount_options="errors=remount-ro") as mnt,
        running_node_env(tmp_path / "node", data_dir=mnt / "data") as env,
    ):

        def storage() -> list[tuple[int, str]]:
            resp = env.client.node.NodeGetStorageHealth(csi_pb2.NodeGetStorageHealthRequest(), timeout=60)
            return [(h.status, h.reason) for h in resp.backend_health]

        assert storage() == []
        st = os.statvfs(mnt)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # leave under 5% free
            f.write(b"\1" * (st.f_bavail * st.f_frsize - int(0.02 * st.f_blocks * st.f_frsize)))
            os.fsync(f.fileno())
        assert storage() == [(csi_pb2.STORAGE_DEGRADED, "DataDirNearlyFull")]
        filler.unlink()
        assert storage() == []
        name = device_name(rdev(_device_of(str(mnt))))
        _trigger_ext4_error(name, "ballast storage health test\n")  # counted, and the fs goes read-only
        assert storage() == [
            (csi_pb2.STORAGE_UNREACHABLE, "DataDirReadOnly"),
            (csi_pb2.STORAGE_DEGRADED, "DataDirFilesystemErrors"),
        ]
