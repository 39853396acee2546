"""A node plugin process killed (SIGKILL) between stage and publish: the next process publishes from
the mount table, and unpublish/unstage clean up what the first process made."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conformance.driver import NODE_ID, start_driver
from tests.conftest import require_root, require_tool
from tests.csiclient import client
from tests.integration.conftest import block_cap, force_clean, leftovers, mount_cap

MiB = 1024**2


def _stage_kill_publish(tmp_path: Path, cap: csi_pb2.VolumeCapability) -> None:
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck"):
        require_tool(tool)
    staging, target = tmp_path / "staging" / "globalmount", tmp_path / "pods" / "p" / "target"
    first = start_driver(tmp_path)
    try:
        with client(first.endpoint) as c:
            vol = c.controller.CreateVolume(
                csi_pb2.CreateVolumeRequest(
                    name="restart",
                    capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB),
                    volume_capabilities=[cap],
                )
            ).volume
            pc = c.controller.ControllerPublishVolume(
                csi_pb2.ControllerPublishVolumeRequest(
                    volume_id=vol.volume_id, node_id=NODE_ID, volume_capability=cap
                )
            ).publish_context
            c.node.NodeStageVolume(
                csi_pb2.NodeStageVolumeRequest(
                    volume_id=vol.volume_id,
                    staging_target_path=str(staging),
                    volume_capability=cap,
                    publish_context=pc,
                ),
                timeout=120,
            )
    finally:
        first.kill()  # SIGKILL: no clean shutdown
    second = start_driver(tmp_path)
    try:
        with client(second.endpoint) as c:
            publish = csi_pb2.NodePublishVolumeRequest(
                volume_id=vol.volume_id,
                staging_target_path=str(staging),
                target_path=str(target),
                volume_capability=cap,
                publish_context=pc,
            )
            c.node.NodePublishVolume(publish, timeout=60)
            c.node.NodePublishVolume(publish, timeout=60)
            assert Mounter().mount_at(str(target)) is not None
            c.node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.volume_id, target_path=str(target)),
                timeout=60,
            )
            c.node.NodeUnstageVolume(
                csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.volume_id, staging_target_path=str(staging)),
                timeout=60,
            )
            c.controller.ControllerUnpublishVolume(
                csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE_ID)
            )
            c.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id))
    finally:
        second.stop()
    assert leftovers(tmp_path, tmp_path / "data") == ([], [])
    assert not os.path.exists(target)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path; afterwards anything left mounted or attached under it is removed and fails the test."""
    yield tmp_path
    left = leftovers(tmp_path, tmp_path / "data")
    force_clean(tmp_path, tmp_path / "data")
    if left != ([], []):
        pytest.fail(f"leaked mounts/loop devices: {left}", pytrace=False)


def test_killed_plugin_between_stage_and_publish_mount(workdir: Path) -> None:
    _stage_kill_publish(workdir, mount_cap())


def test_killed_plugin_between_stage_and_publish_block(workdir: Path) -> None:
    _stage_kill_publish(workdir, block_cap())
