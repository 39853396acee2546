"""The node acts only on the volume a request names, and only with the access type it was staged with.

Real driver, real loop devices and mounts. Each case once answered OK and then exposed, unmounted,
detached or formatted another volume's data (or the same volume's raw data); each now answers the CSI
code for "not staged here" or "staged, but incompatible", and the host is left as it was.
"""

from __future__ import annotations

import os

import grpc
import pytest

from csi import loop, loopfind
from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.csiclient import assert_code
from tests.integration.conftest import MiB, NodeEnv, Volume, block_cap, mount_cap

Code = grpc.StatusCode
UNKNOWN_ID = "lv-" + "1" * 32
PATTERN = os.urandom(4096)


def _mounted(path: str) -> bool:
    return Mounter().mount_at(path) is not None


def _loops(vol: Volume) -> list[str]:
    return loopfind.devices_for(os.stat(vol.file))


def _write(path: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, PATTERN, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, len(PATTERN), 0)
    finally:
        os.close(fd)


def _stage_request(
    vol: Volume, cap: csi_pb2.VolumeCapability, staging: str = ""
) -> csi_pb2.NodeStageVolumeRequest:
    return csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=staging or vol.staging,
        volume_capability=cap,
        publish_context=vol.publish_context,
    )


@pytest.mark.parametrize(
    ("whose", "code"),
    [
        pytest.param("another-volume", Code.FAILED_PRECONDITION, id="another-volume-not-staged"),
        pytest.param("unknown", Code.NOT_FOUND, id="unknown-volume"),
    ],
)
def test_publish_of_another_volumes_staging_path_is_refused(
    node_env: NodeEnv, whose: str, code: Code
) -> None:
    staged, other = node_env.volume(), node_env.volume()
    node_env.stage(staged, mount_cap())
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=other.id if whose == "another-volume" else UNKNOWN_ID,
        staging_target_path=staged.staging,
        target_path=other.target,
        volume_capability=mount_cap(),
    )
    assert_code(node_env.client.node.NodePublishVolume, request, code)
    assert not _mounted(other.target) and not os.path.exists(other.target)


@pytest.mark.parametrize(
    "whose",
    [
        pytest.param("another-volume", id="another-volume-id"),
        pytest.param("unknown", id="unknown-volume-id"),
        pytest.param("same-volume-other-path", id="same-volume-other-path"),
    ],
)
def test_unstage_leaves_a_staging_that_is_not_the_requests_alone(node_env: NodeEnv, whose: str) -> None:
    staged, other = node_env.volume(), node_env.volume()
    node_env.stage(staged, mount_cap())
    volume_id, path = {
        "another-volume": (other.id, staged.staging),
        "unknown": (UNKNOWN_ID, staged.staging),
        "same-volume-other-path": (staged.id, other.staging),
    }[whose]
    node_env.client.node.NodeUnstageVolume(
        csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=path)
    )  # spec: not staged at that path -> OK
    assert _mounted(staged.staging), "the staged volume is still mounted"
    (device,) = _loops(staged)
    status = loopfind.status(device)
    assert status is not None and not status.lo_flags & loop.LO_FLAGS_AUTOCLEAR, (
        "its loop device is still attached, and not set to detach once unmounted"
    )
    node_env.publish(staged, mount_cap())  # and still usable


def test_unstage_of_a_published_block_volume_is_refused(node_env: NodeEnv) -> None:
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, block_cap())
    node_env.publish(vol, block_cap())
    _write(vol.target)
    request = csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=vol.staging)
    assert_code(
        node_env.client.node.NodeUnstageVolume, request, Code.FAILED_PRECONDITION, contains="published"
    )
    assert len(_loops(vol)) == 1, "the published device stays attached"
    assert _read(vol.target) == PATTERN, "and the pod's device node still reaches this volume"
    node_env.unpublish(vol)
    node_env.unstage(vol)
    assert _loops(vol) == [], "unpublished, the unstage releases the device"


@pytest.mark.parametrize(
    ("first", "then", "same_path", "code"),
    [
        pytest.param("mount", "block", True, Code.ALREADY_EXISTS, id="mount-then-block-same-path"),
        pytest.param("mount", "block", False, Code.FAILED_PRECONDITION, id="mount-then-block-other-path"),
        pytest.param("block", "mount", True, Code.ALREADY_EXISTS, id="block-then-mount-same-path"),
        pytest.param("block", "mount", False, Code.FAILED_PRECONDITION, id="block-then-mount-other-path"),
    ],
)
def test_stage_with_the_other_access_type_is_refused(
    node_env: NodeEnv, first: str, then: str, same_path: bool, code: Code
) -> None:
    vol = node_env.volume(16 * MiB)
    caps = {"mount": mount_cap(), "block": block_cap()}
    node_env.stage(vol, caps[first])
    node_env.publish(vol, caps[first])
    if first == "block":
        _write(vol.target)
    staging = vol.staging if same_path else vol.staging + "-2"
    assert_code(node_env.client.node.NodeStageVolume, _stage_request(vol, caps[then], staging), code)
    if first == "block":
        assert _read(vol.target) == PATTERN, "the raw data was not formatted over"
        assert not _mounted(staging)
    else:
        assert _mounted(vol.staging) and _mounted(vol.target)
    assert len(_loops(vol)) == 1


@pytest.mark.parametrize("access", ["mount", "block"])
def test_stage_at_a_second_path_is_refused(node_env: NodeEnv, access: str) -> None:
    """A volume is staged at one path per node: staged again elsewhere -> FAILED_PRECONDITION, and the
    first staging keeps its device and stays publishable."""
    vol = node_env.volume(16 * MiB)
    cap = {"mount": mount_cap(), "block": block_cap()}[access]
    node_env.stage(vol, cap)
    second = vol.staging + "-2"
    assert_code(
        node_env.client.node.NodeStageVolume,
        _stage_request(vol, cap, second),
        Code.FAILED_PRECONDITION,
        contains="one path per node",
    )
    assert not _mounted(second)
    assert len(_loops(vol)) == 1
    node_env.publish(vol, cap)


@pytest.mark.parametrize(
    "published", [pytest.param(True, id="raw-published"), pytest.param(False, id="staged-only")]
)
def test_mount_stage_of_a_block_staged_volume_is_refused_after_a_restart(
    node_env: NodeEnv, published: bool
) -> None:
    """Block staging mounts nothing: its record on disk (csi/blockstagings.py) outlives the plugin, so a
    stage as a filesystem elsewhere is still refused, unpublished too (it once formatted the volume)."""
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, block_cap())
    if published:
        node_env.publish(vol, block_cap())
        _write(vol.target)
    node_env.restart()
    request = _stage_request(vol, mount_cap(), vol.staging + "-fs")
    assert_code(
        node_env.client.node.NodeStageVolume, request, Code.FAILED_PRECONDITION, contains="block device"
    )
    if published:
        assert _read(vol.target) == PATTERN, "the raw data was not formatted over"
    assert not _mounted(vol.staging + "-fs")
    assert Mounter().probe(_loops(vol)[0]).blank, "the block-staged volume was not formatted"


def test_block_publish_of_a_filesystem_staged_volume_is_refused(node_env: NodeEnv) -> None:
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, mount_cap())
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        target_path=vol.target,
        volume_capability=block_cap(),
        publish_context=vol.publish_context,
    )
    assert_code(
        node_env.client.node.NodePublishVolume, request, Code.FAILED_PRECONDITION, contains="filesystem"
    )
    assert not _mounted(vol.target) and not os.path.exists(vol.target)


def test_unstage_of_a_block_staging_clears_its_record(node_env: NodeEnv) -> None:
    """After NodeUnstageVolume the volume may be staged again anywhere, with either access type."""
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, block_cap())
    node_env.restart()
    node_env.unstage(vol)
    assert _loops(vol) == []
    request = _stage_request(vol, mount_cap(), vol.staging + "-fs")
    node_env.client.node.NodeStageVolume(request, timeout=120)
    assert _mounted(vol.staging + "-fs")
    node_env.client.node.NodeUnstageVolume(
        csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=vol.staging + "-fs"),
        timeout=120,
    )


@pytest.mark.parametrize(
    "restart", [pytest.param(False, id="same-process"), pytest.param(True, id="restarted")]
)
def test_block_publish_from_a_path_the_volume_was_never_staged_at_is_refused(
    node_env: NodeEnv, restart: bool
) -> None:
    """As for mount access: a staging_target_path the volume is not staged at -> FAILED_PRECONDITION."""
    vol = node_env.volume(16 * MiB)
    node_env.stage(vol, block_cap())
    if restart:
        node_env.restart()
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging + "-2",
        target_path=vol.target,
        volume_capability=block_cap(),
        publish_context=vol.publish_context,
    )
    assert_code(
        node_env.client.node.NodePublishVolume, request, Code.FAILED_PRECONDITION, contains="staged at"
    )
    assert not _mounted(vol.target) and not os.path.exists(vol.target)
    node_env.publish(vol, block_cap())  # from the path it was staged at
    assert _mounted(vol.target)
