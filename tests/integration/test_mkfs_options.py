"""CreateVolume's mkfs parameters held against the real mkfs.ext4, mkfs.ext3 and mkfs.xfs: what the
controller refuses (INVALID_ARGUMENT naming the parameter) the program refuses too, and a volume the
controller makes with the options it accepts is formatted by the program the node runs, with the
arguments it runs it with (filesystems.mkfs_argv), on the volume's own file. So no volume is created
that NodeStageVolume could never format."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi import keys
from csi._proto import csi_pb2
from csi.filesystems import mkfs_argv, zeroed_flags
from tests.conformance.driver import Driver, running_driver
from tests.conftest import require_tool
from tests.csiclient import CsiClient, assert_code, connect

AM = csi_pb2.VolumeCapability.AccessMode
MiB, GiB = 1024**2, 1024**3
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def driver() -> Iterator[Driver]:
    with (
        tempfile.TemporaryDirectory(prefix="mkfs-") as d,
        running_driver(Path(d), "--mode", "controller") as drv,
    ):
        yield drv


@pytest.fixture
def client(driver: Driver) -> Iterator[CsiClient]:
    c = connect(driver.endpoint)
    yield c
    c.close()


def request(name: str, fs: str, params: dict[str, str], size: int) -> csi_pb2.CreateVolumeRequest:
    return csi_pb2.CreateVolumeRequest(
        name=name,
        volume_capabilities=[
            csi_pb2.VolumeCapability(
                mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs),
                access_mode=AM(mode=AM.SINGLE_NODE_WRITER),
            )
        ],
        capacity_range=csi_pb2.CapacityRange(required_bytes=size) if size else None,
        parameters=params,
    )


def run_mkfs(argv: list[str]) -> subprocess.CompletedProcess[str]:
    require_tool(argv[0])
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


# (fs type, parameters, volume size, the parameter named, the same options as mkfs flags)
REFUSED = [
    pytest.param(
        "xfs", {keys.BLOCK_SIZE: "512"}, 300 * MiB, keys.BLOCK_SIZE, ["-b", "size=512"], id="xfs-block-512"
    ),
    pytest.param(
        "xfs", {keys.INODE_SIZE: "256"}, 300 * MiB, keys.INODE_SIZE, ["-i", "size=256"], id="xfs-inode-256"
    ),
    pytest.param(
        "xfs",
        {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "1024"},
        300 * MiB,
        keys.INODE_SIZE,
        ["-b", "size=1024", "-i", "size=1024"],
        id="xfs-inode-over-half-a-block",
    ),
    pytest.param(
        "ext4",
        {keys.BLOCK_SIZE: str(2 * PAGE_SIZE)},
        64 * MiB,
        keys.BLOCK_SIZE,
        ["-b", str(2 * PAGE_SIZE)],
        id="ext4-block-over-the-page-size",
    ),
    pytest.param(
        "ext3",
        {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "4096"},
        64 * MiB,
        keys.INODE_SIZE,
        ["-b", "1024", "-I", "4096"],
        id="ext3-inode-over-the-block",
    ),
    pytest.param(
        "ext4",
        {keys.INODE_SIZE: "2048"},
        64 * MiB,
        keys.INODE_SIZE,
        ["-I", "2048"],
        id="ext4-inode-2048-on-the-small-volume-default-block",
    ),
    pytest.param(
        "ext4",
        {keys.BLOCK_SIZE: "4096", keys.INODE_SIZE: "4096"},
        16 * MiB,
        keys.INODE_SIZE,
        ["-b", "4096", "-I", "4096"],
        id="ext4-inode-4096-at-the-small-volume-default-ratio",
    ),
    pytest.param(
        "ext4",
        {keys.NUMBER_OF_INODES: str(2**32 - 1)},
        GiB,
        keys.NUMBER_OF_INODES,
        ["-N", str(2**32 - 1)],
        id="ext4-more-inodes-than-the-volume-holds",
    ),
    pytest.param(
        "ext4",
        {keys.NUMBER_OF_INODES: "10"},
        4 * MiB,
        keys.NUMBER_OF_INODES,
        ["-N", "10"],
        id="ext4-too-few-inodes",
    ),
    pytest.param(
        "ext4",
        {keys.BLOCK_SIZE: "4096", keys.INODE_SIZE: "1024", keys.BYTES_PER_INODE: "1024"},
        GiB,
        keys.BYTES_PER_INODE,
        ["-b", "4096", "-I", "1024", "-i", "1024"],
        id="ext4-an-inode-per-inode-size",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: str(MiB), keys.BYTES_PER_INODE: "65536"},
        8 * GiB,
        keys.BYTES_PER_INODE,
        ["-O", "bigalloc", "-C", str(MiB), "-i", "65536"],
        id="ext4-bigalloc-more-inodes-than-clusters",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "1024"},
        GiB,
        keys.EXT4_CLUSTER_SIZE,
        ["-O", "bigalloc", "-C", "1024"],
        id="ext4-cluster-1024",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "1024", keys.BLOCK_SIZE: "1024"},
        64 * MiB,
        keys.EXT4_CLUSTER_SIZE,
        ["-b", "1024", "-O", "bigalloc", "-C", "1024"],
        id="ext4-cluster-1024-a-block",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "2048"},
        GiB,
        keys.EXT4_CLUSTER_SIZE,
        ["-O", "bigalloc", "-C", "2048"],
        id="ext4-cluster-under-the-default-block",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "2048", keys.BLOCK_SIZE: "4096"},
        GiB,
        keys.EXT4_CLUSTER_SIZE,
        ["-b", "4096", "-O", "bigalloc", "-C", "2048"],
        id="ext4-cluster-under-the-block",
    ),
]


@pytest.mark.parametrize(("fs", "params", "size", "named", "flags"), REFUSED)
def test_what_the_controller_refuses_mkfs_refuses(
    client: CsiClient,
    tmp_path: Path,
    fs: str,
    params: dict[str, str],
    size: int,
    named: str,
    flags: list[str],
) -> None:
    message = assert_code(
        client.controller.CreateVolume, request("refused", fs, params, size), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert named in message, message
    image = tmp_path / "volume.img"
    with open(image, "wb") as f:
        f.truncate(size)
    done = run_mkfs([f"mkfs.{fs}", "-q", *flags, str(image)])
    assert done.returncode != 0, f"mkfs.{fs} {flags} took it, so the controller must too"


# (fs type, parameters, required_bytes: 0 for none, so the driver picks the size)
ACCEPTED = [
    pytest.param("xfs", {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "512"}, 300 * MiB, id="xfs-smallest"),
    pytest.param(
        "xfs", {keys.BLOCK_SIZE: "4096", keys.INODE_SIZE: "2048"}, 300 * MiB, id="xfs-largest-inode"
    ),
    pytest.param(
        "ext4",
        {keys.BLOCK_SIZE: str(PAGE_SIZE), keys.INODE_SIZE: str(PAGE_SIZE)},
        0,
        id="ext4-page-sized-no-size-asked",
    ),
    pytest.param(
        "ext3", {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "1024"}, 16 * MiB, id="ext3-inode-a-block"
    ),
    pytest.param("ext4", {keys.NUMBER_OF_INODES: "16"}, 8 * MiB, id="ext4-fewest-inodes"),
    pytest.param("ext4", {keys.NUMBER_OF_INODES: "100000"}, 0, id="ext4-inodes-no-size-asked"),
    pytest.param(
        "ext3", {keys.NUMBER_OF_INODES: "1000000", keys.INODE_SIZE: "128"}, 600 * MiB, id="ext3-inodes"
    ),
    pytest.param("ext4", {keys.BYTES_PER_INODE: str(64 * MiB)}, GiB, id="ext4-largest-ratio"),
    pytest.param("ext2", {keys.NUMBER_OF_INODES: "100000", keys.BLOCK_SIZE: "1024"}, 0, id="ext2-inodes"),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: str(MiB)},
        16 * MiB,
        id="ext4-bigalloc-smallest",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "2048", keys.BLOCK_SIZE: "1024"},
        64 * MiB,
        id="ext4-smallest-cluster",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "4096", keys.BLOCK_SIZE: "4096"},
        GiB,
        id="ext4-cluster-a-block",
    ),
    pytest.param(
        "ext4",
        {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "4096"},
        GiB,
        id="ext4-cluster-default-block",
    ),
]


@pytest.mark.parametrize(("fs", "params", "size"), ACCEPTED)
def test_a_volume_made_with_accepted_options_is_formatted_by_mkfs(
    driver: Driver, client: CsiClient, fs: str, params: dict[str, str], size: int
) -> None:
    name = f"ok-{fs}-{len(params)}-{size}-{'-'.join(params.values())}"
    volume = client.controller.CreateVolume(request(name, fs, params, size), timeout=30).volume
    assert volume.capacity_bytes >= size
    image = driver.data_dir / "volumes" / f"{volume.volume_id}.img"
    argv = mkfs_argv(str(image), fs, dict(volume.volume_context), extra=zeroed_flags(fs, (1, 47, 0)))
    done = run_mkfs(argv)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    client.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id))
