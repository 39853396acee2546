"""Staging, target and volume paths that lead out of the kubelet dir through a symbolic link, over the
real socket with real loop devices and mounts (the audit's cases A-E, plus the reads).

Each once answered OK and mounted over, created or removed something outside the allowed roots (or
reported on a device reached through /dev); each is now refused -- INVALID_ARGUMENT, the CO gave an
unusable path; NOT_FOUND for the reads, the volume is not at such a path -- and nothing outside changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.csiclient import assert_code
from tests.integration.conftest import NodeEnv, Volume, block_cap, mount_cap

Code = grpc.StatusCode


@dataclass
class World:
    """The node's kubelet dir with links out of it, and the directory they lead to."""

    env: NodeEnv
    outside: Path

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """outside/, entry by entry (mode, mtime), and whether anything is mounted in it."""
        entries = {str(p): (p.lstat().st_mode, p.lstat().st_mtime_ns) for p in self.outside.rglob("*")}
        mounted = [m.mount_point for m in Mounter().mounts() if m.mount_point.startswith(str(self.outside))]
        entries.update({f"mounted:{m}": (0, 0) for m in mounted})
        return entries


@pytest.fixture
def world(node_env: NodeEnv) -> World:
    outside = node_env.tmp / "outside"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "passwd").write_text("root:x:0:0\n")
    (outside / "victimdir").mkdir()
    k = node_env.kubelet
    (k / "plugins" / "a").mkdir(parents=True)
    (k / "pods").mkdir()
    (k / "plugins" / "a" / "globalmount").symlink_to(outside / "etc")
    (k / "plugins" / "b").symlink_to(outside)
    (k / "pods" / "evil").symlink_to(outside)
    (k / "pods" / "dev").symlink_to("/dev")
    return World(node_env, outside)


def _staged(env: NodeEnv, access: str) -> Volume:
    """A volume staged (legitimately) with `access`, or only controller-published when access is ""."""
    vol = env.volume()
    if access:
        env.stage(vol, block_cap() if access == "block" else mount_cap())
    return vol


def _request(rpc: str, env: NodeEnv, vol: Volume, path: str, access: str) -> Any:
    cap = block_cap() if access == "block" else mount_cap()
    pc = vol.publish_context
    if rpc == "NodeStageVolume":
        return csi_pb2.NodeStageVolumeRequest(
            volume_id=vol.id, staging_target_path=path, volume_capability=cap, publish_context=pc
        )
    if rpc == "NodeUnstageVolume":
        return csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=path)
    if rpc == "NodePublishVolume":
        return csi_pb2.NodePublishVolumeRequest(
            volume_id=vol.id,
            staging_target_path=vol.staging,
            target_path=path,
            volume_capability=cap,
            publish_context=pc,
        )
    if rpc == "NodeUnpublishVolume":
        return csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.id, target_path=path)
    if rpc == "NodeGetVolumeStats":
        return csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=path)
    return csi_pb2.NodeExpandVolumeRequest(volume_id=vol.id, volume_path=path, volume_capability=cap)


INVALID, NOT_FOUND = Code.INVALID_ARGUMENT, Code.NOT_FOUND


@pytest.mark.parametrize(
    ("rpc", "path", "access", "code"),
    [
        pytest.param("NodeStageVolume", "plugins/a/globalmount", "", INVALID, id="A-stage-at-a-link-to-etc"),
        pytest.param("NodeUnstageVolume", "plugins/a/globalmount", "mount", INVALID, id="A-unstage-at-it"),
        pytest.param("NodeStageVolume", "plugins/b/newdir", "", INVALID, id="B-stage-under-a-linked-parent"),
        pytest.param("NodePublishVolume", "pods/evil/etc", "mount", INVALID, id="C-publish-over-etc"),
        pytest.param("NodePublishVolume", "pods/evil/new/mount", "mount", INVALID, id="C2-publish-creating"),
        pytest.param("NodeUnpublishVolume", "pods/evil/victimdir", "mount", INVALID, id="D-unpublish"),
        pytest.param("NodePublishVolume", "pods/evil/blk", "block", INVALID, id="E-block-publish-creating"),
        pytest.param("NodeGetVolumeStats", "pods/dev/{device}", "block", NOT_FOUND, id="stats-via-link"),
        pytest.param("NodeExpandVolume", "pods/dev/{device}", "block", NOT_FOUND, id="expand-via-link"),
    ],
)
def test_a_path_leading_out_through_a_link_is_refused_and_changes_nothing(
    world: World, rpc: str, path: str, access: str, code: Code
) -> None:
    env = world.env
    vol = _staged(env, access)
    device = (env.driver.backend.prepared_device(vol.id) or "") if access else ""
    path = f"{env.kubelet}/{path.format(device=os.path.basename(device))}"
    before = world.snapshot()
    assert_code(getattr(env.client.node, rpc), _request(rpc, env, vol, path, access), code)
    assert world.snapshot() == before
    assert (world.outside / "etc" / "passwd").read_text() == "root:x:0:0\n"


def test_a_kubelet_dir_reached_through_a_link_keeps_working(node_env: NodeEnv) -> None:
    """/var/lib -> elsewhere on some distros: the kubelet names paths through the link, the mount table
    shows them resolved. Stage, publish, publish again, stats, unpublish and unstage all work, and an
    unstage while published is still refused."""
    real = node_env.tmp.resolve() / "real-kubelet"
    node_env.kubelet.rename(real)
    node_env.kubelet.symlink_to(real)
    node_env.restart()
    vol = node_env.volume()
    node_env.stage(vol, mount_cap())
    node_env.publish(vol, mount_cap())
    node_env.publish(vol, mount_cap())  # idempotent: found in the mount table under its resolved name
    target = Mounter().mount_at(str(real / Path(vol.target).relative_to(node_env.kubelet)))
    assert target is not None and len(Mounter().mounts((target.mount_point,))) == 1
    stats = node_env.client.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=vol.target), timeout=60
    )
    assert stats.usage
    request = csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=vol.staging)
    unstage = node_env.client.node.NodeUnstageVolume
    assert_code(unstage, request, Code.FAILED_PRECONDITION, contains="published")
    node_env.unpublish(vol)
    node_env.unstage(vol)
    assert not os.path.exists(vol.target)
    assert Mounter().mount_at(str(real / Path(vol.staging).relative_to(node_env.kubelet))) is None


def test_a_link_planted_in_the_staging_path_while_it_formats_stops_the_mount(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check at the request is seconds before the mount when the volume is formatted first: a parent
    swapped for a link to outside/ in that time is found right before mount(2), which never happens."""
    env = world.env
    vol = env.volume()
    parent = env.kubelet / "plugins" / "swap"
    staging = parent / "globalmount"
    staging.mkdir(parents=True)
    (world.outside / "globalmount").mkdir()
    real_mkfs = Mounter.mkfs

    def mkfs_then_swap(self: Mounter, *args: Any, **kwargs: Any) -> None:
        real_mkfs(self, *args, **kwargs)
        parent.rename(parent.with_name("swap.real"))
        parent.symlink_to(world.outside)

    monkeypatch.setattr(Mounter, "mkfs", mkfs_then_swap)
    before = world.snapshot()
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=str(staging),
        volume_capability=mount_cap(),
        publish_context=vol.publish_context,
    )
    assert_code(env.client.node.NodeStageVolume, request, INVALID, contains="symbolic link")
    assert world.snapshot() == before, "nothing mounted over outside/globalmount"
    assert env.driver.backend.prepared_device(vol.id) is None, "the failed stage released its device"
