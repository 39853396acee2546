"""The mount-flag allow-lists (csi/filesystems.py FS_OPTIONS) held against the real kernel: every flag
they accept, each value pattern by its edge values, stages a fresh volume of each filesystem; what the
kernel refuses is INVALID_ARGUMENT naming the flag, before the device is formatted (root only)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.local import files
from csi.filesystems import FS_OPTIONS, MAX_COMMIT_SECONDS, PAGE_SIZE
from tests.conftest import require_tool
from tests.csiclient import assert_code
from tests.integration.conftest import MiB, NodeEnv, mount_cap, running_node_env

SIZES = {"ext4": 64 * MiB, "ext3": 64 * MiB, "ext2": 64 * MiB, "xfs": 300 * MiB}
# name= option -> values to stage with: the edges of what the allow-list takes
VALUES = {
    "barrier=": ["0", "1"],
    "errors=": ["remount-ro", "continue"],
    "stripe=": ["0", "999999999"],
    "data=": ["ordered", "writeback", "journal"],
    "commit=": ["0", "5", str(MAX_COMMIT_SECONDS)],
    "allocsize=": [f"{PAGE_SIZE}", f"{PAGE_SIZE // 1024}k", "64m", "1g", "1G"],
    "logbufs=": ["2", "8"],
    "logbsize=": ["0", "16k", "16384", "64K", "256k", "262144"],
}
XFS_QUOTA = ("uquota", "gquota", "pquota", "prjquota")


def _accepted() -> list[object]:
    out: list[object] = []
    for fs_type, options in FS_OPTIONS.items():
        for name, parser in options.items():
            flags = [name] if parser is None else [name + value for value in VALUES[name]]
            out += [pytest.param(fs_type, flag, id=f"{fs_type}-{flag}") for flag in flags]
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeEnv]:
    """One driver for the module; each test unstages what it staged."""
    with running_node_env(tmp_path_factory.mktemp("flags")) as node_env:
        yield node_env


def _stage_request(
    env: NodeEnv, fs_type: str, flags: list[str]
) -> tuple[csi_pb2.NodeStageVolumeRequest, str]:
    vol = env.volume(SIZES[fs_type])
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        volume_capability=mount_cap(fs_type, tuple(flags)),
        publish_context=vol.publish_context,
    )
    env.staged[vol.id] = vol.staging
    return request, vol.file


def _quota_in_kernel() -> bool:
    """xfs quota is compiled in (CONFIG_XFS_QUOTA) exactly when xfs shows its quota statistics (once xfs
    is loaded, which the xfs stages before the quota flags make sure of)."""
    return os.path.exists("/proc/fs/xfs/xqmstat")


@pytest.mark.parametrize(("fs_type", "flag"), _accepted())
def test_every_allowed_flag_stages_a_fresh_volume(env: NodeEnv, fs_type: str, flag: str) -> None:
    require_tool(f"mkfs.{fs_type}")
    request, _ = _stage_request(env, fs_type, [flag])
    try:
        if flag in XFS_QUOTA and not _quota_in_kernel():
            # not the allow-list's to know: the mount's INTERNAL error names the flags the kernel refused
            assert_code(env.client.node.NodeStageVolume, request, grpc.StatusCode.INTERNAL, contains=flag)
            return
        env.client.node.NodeStageVolume(request, timeout=120)
    finally:
        env.client.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(
                volume_id=request.volume_id, staging_target_path=request.staging_target_path
            ),
            timeout=120,
        )
        env.staged.pop(request.volume_id, None)


@pytest.mark.parametrize(
    ("fs_type", "flags", "named"),
    [
        pytest.param("ext3", ["delalloc"], "delalloc", id="ext3-delalloc"),
        pytest.param("ext3", ["nodelalloc"], "nodelalloc", id="ext3-nodelalloc"),
        pytest.param("ext3", ["journal_checksum"], "journal_checksum", id="ext3-journal_checksum"),
        pytest.param("ext3", ["dioread_nolock"], "dioread_nolock", id="ext3-dioread_nolock"),
        pytest.param("ext2", ["data=ordered"], "data=ordered", id="ext2-data"),
        pytest.param("ext2", ["commit=5"], "commit=5", id="ext2-commit"),
        pytest.param("ext2", ["delalloc"], "delalloc", id="ext2-delalloc"),
        pytest.param("ext2", ["journal_checksum"], "journal_checksum", id="ext2-journal_checksum"),
        pytest.param("ext4", ["commit=999999999"], "commit=999999999", id="ext4-commit-too-long"),
        pytest.param("ext4", ["data=journal", "delalloc"], "delalloc", id="ext4-data-journal-delalloc"),
        pytest.param("xfs", ["logbsize=1024"], "logbsize=1024", id="xfs-logbsize-1024"),
        pytest.param("xfs", ["logbsize=7k"], "logbsize=7k", id="xfs-logbsize-7k"),
        pytest.param("xfs", ["logbsize=512k"], "logbsize=512k", id="xfs-logbsize-512k"),
        pytest.param("xfs", ["allocsize=3k"], "allocsize=3k", id="xfs-allocsize-3k"),
        pytest.param("xfs", ["allocsize=0"], "allocsize=0", id="xfs-allocsize-0"),
        pytest.param("xfs", ["allocsize=2g"], "allocsize=2g", id="xfs-allocsize-2g"),
    ],
)
def test_a_flag_the_kernel_refuses_is_invalid_before_anything_is_written(
    env: NodeEnv, fs_type: str, flags: list[str], named: str
) -> None:
    """These flags once passed the allow-list: the device was formatted, then mount(2) failed EINVAL
    (INTERNAL, with a message naming no flag) at every retry."""
    require_tool(f"mkfs.{fs_type}")
    request, file = _stage_request(env, fs_type, flags)
    assert_code(env.client.node.NodeStageVolume, request, grpc.StatusCode.INVALID_ARGUMENT, contains=named)
    env.staged.pop(request.volume_id, None)
    assert files.has_no_data(file), "nothing was formatted"
