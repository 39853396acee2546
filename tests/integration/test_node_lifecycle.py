"""Node RPCs on real loop devices, real filesystems and real mounts (root only)."""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import subprocess

import grpc
import pytest

from csi import loopfind
from csi._proto import csi_pb2
from csi.backends.local import files
from csi.devices import device_readonly as mount_readonly
from csi.devices import set_device_readonly
from csi.mount import Mounter
from tests.conftest import in_ci, require_tool
from tests.csiclient import assert_code
from tests.integration.conftest import NODE_ID, MiB, NodeEnv, Volume, block_cap, mount_cap, write_mbr

AccessMode = csi_pb2.VolumeCapability.AccessMode
Usage = csi_pb2.VolumeUsage

FS_SIZES = [
    pytest.param("ext4", 64 * MiB, id="ext4"),
    pytest.param("ext2", 64 * MiB, id="ext2"),
    pytest.param("xfs", 320 * MiB, id="xfs"),
]


def _need(fs_type: str) -> None:
    require_tool(f"mkfs.{fs_type}")
    if fs_type == "xfs":
        require_tool("xfs_growfs")


def _can_grow_ext_online() -> bool:
    """Online ext* growth is the kernel's EXT4_IOC_RESIZE_FS, which demands CAP_SYS_RESOURCE."""
    with open("/proc/self/status") as fh:
        caps = next(int(line.split()[1], 16) for line in fh if line.startswith("CapEff:"))
    return bool(caps & (1 << 24))


def _stats(env: NodeEnv, volume_id: str, path: str) -> csi_pb2.NodeGetVolumeStatsResponse:
    response: csi_pb2.NodeGetVolumeStatsResponse = env.client.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=path), timeout=30
    )
    return response


def _mounted(path: str) -> bool:
    return Mounter().mount_at(path) is not None


@pytest.mark.parametrize(("fs_type", "size"), FS_SIZES)
def test_mount_lifecycle_is_idempotent_at_every_step(node_env: NodeEnv, fs_type: str, size: int) -> None:
    _need(fs_type)
    vol = node_env.volume(size)
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    node_env.stage(vol, cap)  # twice -> OK
    info = Mounter().mount_at(vol.staging)
    assert info is not None and info.fs_type == fs_type
    node_env.publish(vol, cap)
    node_env.publish(vol, cap)  # twice -> OK
    with open(os.path.join(vol.target, "hello.txt"), "w") as fh:
        fh.write("data")
    assert os.path.exists(os.path.join(vol.staging, "hello.txt")), "target is a bind of the staging mount"

    stats = _stats(node_env, vol.id, vol.target)
    by_unit = {u.unit: u for u in stats.usage}
    assert 0 < by_unit[Usage.BYTES].used < by_unit[Usage.BYTES].total <= size
    assert by_unit[Usage.INODES].total > by_unit[Usage.INODES].available > 0
    health = node_env.client.node.NodeGetVolumeHealth(
        csi_pb2.NodeGetVolumeHealthRequest(
            volume_id=vol.id, staging_target_path=vol.staging, volume_publish_path=vol.target
        )
    )
    assert health.volume_health.volume_id == vol.id and list(health.volume_health.health_statuses) == []

    node_env.unpublish(vol)
    assert not os.path.exists(vol.target), "unpublish removes the target"
    node_env.unpublish(vol)  # not mounted -> OK
    node_env.unstage(vol)
    assert not _mounted(vol.staging)
    node_env.unstage(vol)  # not staged -> OK
    assert not loopfind.devices_for(os.stat(vol.file)), "unstage releases the loop device"


def test_block_volume_is_a_device_node_at_the_target(node_env: NodeEnv) -> None:
    vol = node_env.volume(32 * MiB)
    cap = block_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    node_env.publish(vol, cap)
    st = os.stat(vol.target)
    assert stat.S_ISBLK(st.st_mode)
    (device,) = loopfind.devices_for(os.stat(vol.file))
    assert st.st_rdev == os.stat(device).st_rdev
    fd = os.open(vol.target, os.O_WRONLY)
    try:
        os.pwrite(fd, b"raw block", 4096)
    finally:
        os.close(fd)
    with open(vol.file, "rb") as fh:
        fh.seek(4096)
        assert fh.read(9) == b"raw block", "writes through the target reach the volume's file"
    stats = _stats(node_env, vol.id, vol.target)
    assert [(u.unit, u.total) for u in stats.usage] == [(Usage.BYTES, 32 * MiB)]
    expanded = node_env.client.node.NodeExpandVolume(
        csi_pb2.NodeExpandVolumeRequest(volume_id=vol.id, volume_path=vol.target, volume_capability=cap)
    )
    assert expanded.capacity_bytes == 32 * MiB
    node_env.unpublish(vol)
    assert not os.path.lexists(vol.target)
    node_env.unstage(vol)


def test_readonly_publish_refuses_writes(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    cap = mount_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap, readonly=True)
    with pytest.raises(OSError) as err:
        open(os.path.join(vol.target, "x"), "w").close()
    assert err.value.errno == errno.EROFS
    info = Mounter().mount_at(vol.target)
    assert info is not None and info.readonly
    # the same target with other options -> ALREADY_EXISTS
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        target_path=vol.target,
        volume_capability=cap,
        readonly=False,
    )
    assert_code(node_env.client.node.NodePublishVolume, request, grpc.StatusCode.ALREADY_EXISTS)


def test_stage_with_an_incompatible_capability_is_already_exists(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    node_env.stage(vol, mount_cap("ext4"))
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        volume_capability=mount_cap("ext4", mode=AccessMode.SINGLE_NODE_READER_ONLY),
        publish_context=vol.publish_context,
    )
    assert_code(node_env.client.node.NodeStageVolume, request, grpc.StatusCode.ALREADY_EXISTS)


@pytest.mark.parametrize(("fs_type", "size"), FS_SIZES)
def test_existing_filesystem_is_never_reformatted(node_env: NodeEnv, fs_type: str, size: int) -> None:
    _need(fs_type)
    vol = node_env.volume(size)
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    with open(os.path.join(vol.target, "keep.txt"), "w") as fh:
        fh.write("precious")
    node_env.unpublish(vol)
    node_env.unstage(vol)

    other = "xfs" if fs_type == "ext4" else "ext4"
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        volume_capability=mount_cap(other),
        publish_context=vol.publish_context,
    )
    assert_code(
        node_env.client.node.NodeStageVolume, request, grpc.StatusCode.FAILED_PRECONDITION, contains=fs_type
    )
    assert not _mounted(vol.staging)

    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    with open(os.path.join(vol.target, "keep.txt")) as fh:
        assert fh.read() == "precious"


@pytest.mark.parametrize(
    ("held", "code"),
    [
        pytest.param("xfs", grpc.StatusCode.OK, id="xfs-held-takes-an-xfs-flag"),
        pytest.param("ext4", grpc.StatusCode.INVALID_ARGUMENT, id="ext4-held-refuses-it"),
        pytest.param("", grpc.StatusCode.INVALID_ARGUMENT, id="blank-not-formatted-for-a-flag-ext4-refuses"),
    ],
)
def test_a_mount_naming_no_fs_type_takes_the_flags_of_the_filesystem_it_finds(
    node_env: NodeEnv, held: str, code: grpc.StatusCode
) -> None:
    """With no fs type asked for, the device may already hold xfs: its flags are checked against the
    filesystem the stage finds (or, on a blank device, the default it would make) before anything is
    written or mounted."""
    _need("xfs")
    vol = node_env.volume(320 * MiB)
    if held:
        node_env.stage(vol, mount_cap(held))
        node_env.unstage(vol)
    cap = mount_cap("", flags=("logbufs=4",))
    if code is grpc.StatusCode.OK:
        node_env.stage(vol, cap)
        info = Mounter().mount_at(vol.staging)
        assert info is not None and info.fs_type == "xfs" and "logbufs=4" in info.super_options
        return
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        volume_capability=cap,
        publish_context=vol.publish_context,
    )
    node_env.staged[vol.id] = vol.staging
    assert_code(node_env.client.node.NodeStageVolume, request, code, contains="logbufs=4")
    assert not _mounted(vol.staging)
    assert held or files.has_no_data(vol.file), "nothing was formatted"


def test_partition_table_is_never_formatted_and_partition_attribute_selects_one(node_env: NodeEnv) -> None:
    vol = node_env.volume(64 * MiB)
    write_mbr(vol.file, 2048, (64 * MiB // 512) - 2048)
    cap = mount_cap()
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id, staging_target_path=vol.staging, volume_capability=cap
    )
    node_env.staged[vol.id] = vol.staging
    assert_code(
        node_env.client.node.NodeStageVolume,
        request,
        grpc.StatusCode.FAILED_PRECONDITION,
        contains="partition",
    )
    with open(vol.file, "rb") as fh:
        fh.seek(510)
        assert fh.read(2) == b"\x55\xaa", "the partition table is untouched"

    node_env.stage(vol, cap, context={"partition": "1"})
    info = Mounter().mount_at(vol.staging)
    assert info is not None and info.source.endswith("p1")
    node_env.publish(vol, cap, context={"partition": "1"})
    stats = _stats(node_env, vol.id, vol.target)
    assert stats.usage[0].total < 63 * MiB


@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
def test_expand_after_a_restart_grows_the_partition_the_stage_used(node_env: NodeEnv, fs_type: str) -> None:
    """A restarted node plugin has forgotten which partition the stage used: NodeExpandVolume finds it
    mounted at the path, and never sizes or grows the whole disk under it."""
    vol = node_env.volume(800 * MiB)
    write_mbr(vol.file, 2048, 400 * MiB // 512 - 2048)
    cap, context = mount_cap(fs_type), {"partition": "1"}
    node_env.stage(vol, cap, context=context)
    node_env.publish(vol, cap, context=context)
    request = csi_pb2.NodeExpandVolumeRequest(volume_id=vol.id, volume_path=vol.target)
    for when in ("before", "after"):
        reply = node_env.client.node.NodeExpandVolume(request, timeout=60)
        assert reply.capacity_bytes == 399 * MiB, f"{when} the restart"
        info = Mounter().mount_at(vol.target)
        assert info is not None and info.source.endswith("p1")
        node_env.restart()


def test_restart_between_stage_and_publish(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    cap = mount_cap()
    node_env.stage(vol, cap)
    node_env.restart()
    node_env.stage(vol, cap)  # kubelet may repeat it after a restart
    node_env.publish(vol, cap)
    assert _mounted(vol.target)
    assert _stats(node_env, vol.id, vol.target).usage


def test_restart_between_stage_and_publish_block(node_env: NodeEnv) -> None:
    vol = node_env.volume(16 * MiB)
    cap = block_cap()
    node_env.stage(vol, cap)
    node_env.restart()
    node_env.publish(vol, cap)
    assert stat.S_ISBLK(os.stat(vol.target).st_mode)


@pytest.mark.parametrize(("fs_type", "size"), FS_SIZES)
def test_expansion_grows_the_mounted_filesystem(node_env: NodeEnv, fs_type: str, size: int) -> None:
    """Where the host withholds CAP_SYS_RESOURCE (this sandbox does), online ext4 growth cannot work: then
    the driver must say so, keep the filesystem mounted and intact, and grow it at the next stage instead."""
    _need(fs_type)
    vol = node_env.volume(size)
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    marker = os.path.join(vol.target, "marker")
    with open(marker, "w") as fh:
        fh.write("kept")
    before = os.statvfs(vol.target)
    new_size = size + 128 * MiB
    node_env.driver.backend.expand_volume(vol.id, new_size)
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vol.id,
        volume_path=vol.target,
        capacity_range=csi_pb2.CapacityRange(required_bytes=new_size),
        volume_capability=cap,
    )
    if fs_type != "xfs" and not _can_grow_ext_online():
        assert_code(
            node_env.client.node.NodeExpandVolume,
            request,
            grpc.StatusCode.FAILED_PRECONDITION,
            contains="CAP_SYS_RESOURCE",
        )
        assert _mounted(vol.target)
        with open(marker) as fh:
            assert fh.read() == "kept"
        node_env.unpublish(vol)
        node_env.unstage(vol)
        node_env.stage(vol, cap)
        node_env.publish(vol, cap)
        with open(marker) as fh:
            assert fh.read() == "kept"
    else:
        response = node_env.client.node.NodeExpandVolume(request, timeout=120)
        assert response.capacity_bytes == new_size
    after = os.statvfs(vol.target)
    grown = (after.f_blocks - before.f_blocks) * after.f_frsize
    assert grown > 100 * MiB, f"filesystem grew by only {grown} bytes"


@pytest.mark.parametrize(("fs_type", "size"), FS_SIZES)
def test_stage_grows_a_filesystem_smaller_than_its_device(node_env: NodeEnv, fs_type: str, size: int) -> None:
    _need(fs_type)
    vol = node_env.volume(size)
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    before = os.statvfs(vol.staging)
    node_env.unstage(vol)
    node_env.driver.backend.expand_volume(vol.id, size + 64 * MiB)
    node_env.stage(vol, cap)
    after = os.statvfs(vol.staging)
    grown = (after.f_blocks - before.f_blocks) * after.f_frsize
    assert grown > 48 * MiB, f"stage grew the filesystem by only {grown} bytes"


@pytest.mark.parametrize("fs_type", ["ext4", "ext2"])
def test_a_stage_that_grows_an_ext_filesystem_checks_it_fully_first(node_env: NodeEnv, fs_type: str) -> None:
    """resize2fs offline demands a full check first (e2fsck -f), which e2fsck -p skips on a clean
    filesystem. A full check resets the superblock's mount count: after it and one mount it says 1,
    after `e2fsck -p` and that mount 2."""
    _need(fs_type)
    vol = node_env.volume(64 * MiB)
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    node_env.unstage(vol)
    node_env.driver.backend.expand_volume(vol.id, 128 * MiB)
    node_env.stage(vol, cap)
    node_env.unstage(vol)  # the superblock on the file, as the kernel left it
    said = subprocess.run([require_tool("dumpe2fs"), "-h", vol.file], capture_output=True, text=True).stdout
    assert re.search(r"^Mount count:\s+1$", said, re.MULTILINE), said


def test_a_repeated_xfs_stage_finishes_the_grow_a_first_one_did_not(node_env: NodeEnv) -> None:
    """xfs grows only once mounted: a stage cut short between its mount and its grow (killed, or
    xfs_growfs failed) is finished by the CO's retry, which finds the filesystem mounted."""
    _need("xfs")
    vol = node_env.volume(320 * MiB)
    cap = mount_cap("xfs")
    node_env.stage(vol, cap)
    before = os.statvfs(vol.staging)
    node_env.driver.backend.expand_volume(vol.id, 384 * MiB)  # the device now outgrows the mounted fs
    node_env.stage(vol, cap)
    after = os.statvfs(vol.staging)
    grown = (after.f_blocks - before.f_blocks) * after.f_frsize
    assert grown > 48 * MiB, f"the retry grew the filesystem by only {grown} bytes"


@pytest.mark.parametrize(
    ("partition", "advice"),
    [
        pytest.param("", "expand the volume on the controller first", id="whole-device"),
        # the controller did grow the disk: it is the partition that keeps its size
        pytest.param("1", "a partition keeps its size when the volume grows", id="partition"),
    ],
)
def test_expand_beyond_the_device_is_out_of_range(node_env: NodeEnv, partition: str, advice: str) -> None:
    vol = node_env.volume()
    context = {"partition": partition} if partition else {}
    if partition:
        write_mbr(vol.file, 2048, 32 * MiB // 512)
    cap = mount_cap()
    node_env.stage(vol, cap, context=context)
    node_env.publish(vol, cap, context=context)
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vol.id,
        volume_path=vol.target,
        capacity_range=csi_pb2.CapacityRange(required_bytes=1024 * MiB),
    )
    message = assert_code(node_env.client.node.NodeExpandVolume, request, grpc.StatusCode.OUT_OF_RANGE)
    assert advice in message
    assert ("partition" in message) == bool(partition), message


def test_stats_of_a_path_that_is_not_the_volume_is_not_found(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    cap = mount_cap()
    node_env.stage(vol, cap)
    elsewhere = node_env.kubelet / "pods" / "plain-dir"
    elsewhere.mkdir(parents=True)
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=str(elsewhere))
    assert_code(
        node_env.client.node.NodeGetVolumeStats, request, grpc.StatusCode.NOT_FOUND, contains="not a mount"
    )
    missing = csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.id, volume_path=str(elsewhere / "nope"))
    assert_code(node_env.client.node.NodeGetVolumeStats, missing, grpc.StatusCode.NOT_FOUND)


def test_stats_of_a_block_path_that_is_another_volumes_device_is_not_found(node_env: NodeEnv) -> None:
    mine, other = node_env.volume(32 * MiB), node_env.volume(48 * MiB)
    cap = block_cap()
    for vol in (mine, other):
        node_env.stage(vol, cap)
        node_env.publish(vol, cap)
    assert [(u.unit, u.total) for u in _stats(node_env, mine.id, mine.target).usage] == [
        (Usage.BYTES, 32 * MiB)
    ]
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id=mine.id, volume_path=other.target)
    assert_code(
        node_env.client.node.NodeGetVolumeStats,
        request,
        grpc.StatusCode.NOT_FOUND,
        contains=f"is not the device of volume {mine.id}",
    )


@pytest.mark.parametrize(
    ("above", "code"),
    [
        pytest.param(0, grpc.StatusCode.OK, id="required-exactly-the-device-size"),
        pytest.param(1, grpc.StatusCode.OUT_OF_RANGE, id="required-one-byte-above-it"),
    ],
)
def test_node_expand_needs_a_device_holding_required_bytes(
    node_env: NodeEnv, above: int, code: grpc.StatusCode
) -> None:
    vol = node_env.volume(32 * MiB)
    cap = block_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vol.id,
        volume_path=vol.target,
        capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB + above),
        volume_capability=cap,
    )
    if code == grpc.StatusCode.OK:
        assert node_env.client.node.NodeExpandVolume(request, timeout=60).capacity_bytes == 32 * MiB
    else:
        message = assert_code(node_env.client.node.NodeExpandVolume, request, code)
        assert f"holds {32 * MiB} bytes, less than the requested {32 * MiB + 1}" in message


@pytest.mark.parametrize("rpc", ["stats", "expand"])
def test_a_mount_path_of_another_volume_is_not_found(node_env: NodeEnv, rpc: str) -> None:
    """Spec: "Volume does not exist on specified volume_path" -> NOT_FOUND; never the usage of the
    other volume, nor a grow of its filesystem."""
    mine, other = node_env.volume(), node_env.volume()
    cap = mount_cap()
    for vol in (mine, other):
        node_env.stage(vol, cap)
        node_env.publish(vol, cap)
    node, gone = node_env.client.node, grpc.StatusCode.NOT_FOUND
    if rpc == "stats":
        stats = csi_pb2.NodeGetVolumeStatsRequest(volume_id=mine.id, volume_path=other.target)
        message = assert_code(node.NodeGetVolumeStats, stats, gone)
    else:
        expand = csi_pb2.NodeExpandVolumeRequest(
            volume_id=mine.id, volume_path=other.target, volume_capability=cap
        )
        message = assert_code(node.NodeExpandVolume, expand, gone)
    assert f"is not a mount of volume {mine.id}" in message


@pytest.mark.parametrize(("fs_type", "size"), [p for p in FS_SIZES if p.id != "ext2"])
def test_a_filesystem_staged_read_only_is_not_grown(node_env: NodeEnv, fs_type: str, size: int) -> None:
    """NodeExpandVolume of a read-only staging: FAILED_PRECONDITION before any grow is tried (xfs_growfs
    or resize2fs on it would fail, INTERNAL or with their own words)."""
    _need(fs_type)
    reader = mount_cap(fs_type, mode=AccessMode.MULTI_NODE_READER_ONLY)
    vol = node_env.volume(size)
    node_env.stage(vol, mount_cap(fs_type))  # formatted: a read-only stage never formats
    node_env.unstage(vol)
    node_env.stage(vol, reader)
    node_env.publish(vol, reader, readonly=True)
    before = os.statvfs(vol.target).f_blocks
    node_env.driver.backend.expand_volume(vol.id, size + 64 * MiB)
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=vol.id, volume_path=vol.target, staging_target_path=vol.staging, volume_capability=reader
    )
    assert_code(
        node_env.client.node.NodeExpandVolume,
        request,
        grpc.StatusCode.FAILED_PRECONDITION,
        contains="is mounted read-only; the filesystem cannot grow",
    )
    assert os.statvfs(vol.target).f_blocks == before


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        pytest.param(b"", False, id="empty-file-removed"),  # the target a block publish creates
        pytest.param(b"not the driver's", True, id="non-empty-file-kept"),
    ],
)
def test_unpublish_removes_only_an_empty_file_target(node_env: NodeEnv, content: bytes, kept: bool) -> None:
    """Nothing mounted at a regular-file target: only an empty one is the driver's to remove; removing
    one with data would lose it."""
    vol = node_env.volume()
    target = node_env.kubelet / "pods" / "p-file" / "volumeDevices" / "dev"
    target.parent.mkdir(parents=True)
    target.write_bytes(content)
    request = csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.id, target_path=str(target))
    if kept:
        assert_code(
            node_env.client.node.NodeUnpublishVolume,
            request,
            grpc.StatusCode.FAILED_PRECONDITION,
            contains="left in place",
        )
        assert target.read_bytes() == content
    else:
        node_env.client.node.NodeUnpublishVolume(request, timeout=30)
        assert not target.exists()


def test_unpublish_and_unstage_of_never_mounted_paths_are_ok(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    node_env.unpublish(vol)
    node_env.unstage(vol)
    assert not os.path.exists(vol.target)


@pytest.mark.parametrize(
    ("mode", "second_target"),
    [
        pytest.param(AccessMode.SINGLE_NODE_SINGLE_WRITER, False, id="single-node-single-writer"),
        # the driver advertises SINGLE_NODE_MULTI_WRITER, so the spec's "Non MULTI_NODE" row applies
        pytest.param(AccessMode.SINGLE_NODE_WRITER, False, id="single-node-writer"),
        pytest.param(AccessMode.SINGLE_NODE_READER_ONLY, False, id="single-node-reader-only"),
        pytest.param(AccessMode.SINGLE_NODE_MULTI_WRITER, True, id="single-node-multi-writer"),
    ],
)
def test_second_target_on_the_node_follows_the_access_mode(
    node_env: NodeEnv, mode: AccessMode.Mode, second_target: bool
) -> None:
    vol = node_env.volume()
    node_env.stage(vol, mount_cap())
    cap = mount_cap(mode=mode)
    node_env.publish(vol, cap)
    other = str(node_env.kubelet / "pods" / "other" / "mount")
    if second_target:
        node_env.publish(vol, cap, target=other)
        assert _mounted(other)
        return
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        target_path=other,
        volume_capability=cap,
    )
    assert_code(
        node_env.client.node.NodePublishVolume,
        request,
        grpc.StatusCode.FAILED_PRECONDITION,
        contains="one target",
    )
    assert not os.path.exists(other)


def test_unstage_refuses_while_still_published(node_env: NodeEnv) -> None:
    vol = node_env.volume()
    cap = mount_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    request = csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.id, staging_target_path=vol.staging)
    assert_code(node_env.client.node.NodeUnstageVolume, request, grpc.StatusCode.FAILED_PRECONDITION)
    assert _mounted(vol.staging) and _mounted(vol.target)


def test_node_info_reports_id_limit_and_topology(node_env: NodeEnv) -> None:
    info = node_env.client.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "itest-node"
    assert info.max_volumes_per_node > 0
    assert dict(info.accessible_topology.segments) == {"topology.local.csi.ballast.dev/zone": "local"}


def _write_block(path: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\0" * 4096, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_readonly_block_publish_refuses_writes_until_unpublished(node_env: NodeEnv) -> None:
    vol = node_env.volume(16 * MiB)
    cap = block_cap(AccessMode.SINGLE_NODE_MULTI_WRITER)  # the mode for several targets on one node
    node_env.stage(vol, cap)
    node_env.publish(vol, cap, readonly=True)
    with pytest.raises(OSError) as err:
        _write_block(vol.target)
    assert err.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    (device,) = loopfind.devices_for(os.stat(vol.file))
    writer = str(node_env.kubelet / "pods" / "writer" / "dev")
    node_env.publish(vol, cap, target=writer)  # a writable publish beside it makes the device writable
    _write_block(writer)
    node_env.unpublish(vol, writer)
    assert mount_readonly(device), "only read-only publishes remain"
    node_env.unpublish(vol)
    assert not mount_readonly(device), "no publish left: the device is writable again"


def test_a_repeated_readonly_block_publish_makes_the_device_readonly(node_env: NodeEnv) -> None:
    """As after a crash between the bind and making the device read-only: the retry finds the bind."""
    vol = node_env.volume(16 * MiB)
    cap = block_cap()
    node_env.stage(vol, cap)
    node_env.publish(vol, cap, readonly=True)
    (device,) = loopfind.devices_for(os.stat(vol.file))
    set_device_readonly(device, False)
    node_env.publish(vol, cap, readonly=True)
    assert mount_readonly(device)


def _publish_readonly(node_env: NodeEnv, vol: Volume, cap: csi_pb2.VolumeCapability) -> None:
    """Publish `vol` to this node again, read-only this time, as an attacher would."""
    controller = node_env.client.controller
    controller.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.id, node_id=NODE_ID)
    )
    answer = controller.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=vol.id, node_id=NODE_ID, volume_capability=cap, readonly=True
        )
    )
    vol.publish_context = dict(answer.publish_context)


@pytest.mark.parametrize("block", [False, True], ids=["mount", "block"])
def test_a_readonly_controller_publish_is_enforced_on_the_node(node_env: NodeEnv, block: bool) -> None:
    """The node request says readonly=false; the read-only ControllerPublishVolume still holds."""
    vol = node_env.volume(16 * MiB)
    cap = block_cap() if block else mount_cap()
    if not block:  # a blank volume cannot be formatted read-only: give it a filesystem first
        node_env.stage(vol, cap)
        node_env.unstage(vol)
    _publish_readonly(node_env, vol, cap)
    node_env.stage(vol, cap)
    node_env.publish(vol, cap, readonly=False)
    with pytest.raises(OSError) as err:
        if block:
            _write_block(vol.target)
        else:
            with open(os.path.join(vol.target, "new"), "wb") as fh:
                fh.write(b"x")
    assert err.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def test_missing_partition_is_failed_precondition_and_releases_the_device(node_env: NodeEnv) -> None:
    vol = node_env.volume(16 * MiB)
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging,
        volume_capability=mount_cap(),
        publish_context=vol.publish_context,
        volume_context={"partition": "3"},
    )
    assert_code(
        node_env.client.node.NodeStageVolume, request, grpc.StatusCode.FAILED_PRECONDITION, contains="3"
    )
    assert loopfind.devices_for(os.stat(vol.file)) == [], "a failed stage leaves no loop device behind"
    assert not _mounted(vol.staging)


def test_storage_class_fs_type_and_mkfs_options_reach_mkfs(node_env: NodeEnv) -> None:
    _need("xfs")
    cap = mount_cap("")  # no fs type in the capability: the StorageClass decides
    created = node_env.client.controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(
            name="sc-options",
            capacity_range=csi_pb2.CapacityRange(required_bytes=100 * MiB),
            volume_capabilities=[cap],
            parameters={"csi.storage.k8s.io/fstype": "xfs", "inodeSize": "1024"},
        )
    ).volume
    assert created.capacity_bytes == 300 * MiB, "raised to the smallest device mkfs.xfs formats"
    vol = node_env.volume(16 * MiB)  # paths only; the volume under test is the one created above
    vol.id = created.volume_id
    vol.publish_context = dict(node_env.driver.backend.attach(vol.id, "itest-node", False))
    node_env.stage(vol, cap, context=dict(created.volume_context))
    info = Mounter().mount_at(vol.staging)
    assert info is not None and info.fs_type == "xfs"
    (device,) = loopfind.devices_for(os.stat(node_env.data_dir / "volumes" / f"{vol.id}.img"))
    with open(device, "rb") as fh:
        superblock = fh.read(512)
    assert struct.unpack_from(">H", superblock, 104)[0] == 1024, "sb_inodesize is the StorageClass value"


def test_a_never_written_ext4_volume_is_formatted_without_writing_zeros(node_env: NodeEnv) -> None:
    """A volume the backend proves never written is formatted as zeroed storage (filesystems.
    zeroed_flags): mkfs writes neither the journal nor the inode tables full of zeros into the sparse
    backing file (1 GiB ext4 with mkfs defaults: about 33 MiB), and e2fsck finds the result clean."""
    require_tool("mkfs.ext4")
    version = Mounter().mke2fs_version("ext4")
    if version < (1, 47, 0):
        message = f"mke2fs 1.47.0 or later is needed for assume_storage_prezeroed; found {version}"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    vol = node_env.volume(1024 * MiB)
    node_env.stage(vol, mount_cap("ext4"))
    node_env.unstage(vol)  # unmounted: everything the mount wrote is in the file
    allocated = os.stat(vol.file).st_blocks * 512
    assert allocated < 4 * MiB, f"{allocated / MiB:.1f} MiB written into a fresh 1 GiB volume"
    checked = subprocess.run([require_tool("e2fsck"), "-f", "-n", vol.file], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("fs_type", ["ext2", ""], ids=["fs-type-ext2", "no-fs-type"])
def test_an_existing_ext2_volume_is_staged_as_it_is(node_env: NodeEnv, fs_type: str) -> None:
    """In-tree EBS mounted ext2 and the EBS CSI driver takes it (ValidFSTypes), so a migrated PV with
    fsType ext2 (or none) stages its ext2 volume: mounted as ext2, never reformatted, its data kept."""
    vol = node_env.volume(64 * MiB)
    subprocess.run([require_tool("mkfs.ext2"), "-q", "-F", vol.file], check=True, capture_output=True)
    subprocess.run(
        [require_tool("debugfs"), "-w", "-R", "mkdir kept", vol.file], check=True, capture_output=True
    )
    cap = mount_cap(fs_type)
    node_env.stage(vol, cap)
    node_env.publish(vol, cap)
    info = Mounter().mount_at(vol.staging)
    assert info is not None and info.fs_type == "ext2"
    assert os.path.isdir(os.path.join(vol.target, "kept")), "the filesystem was not reformatted"
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.id,
        staging_target_path=vol.staging + "-other",
        volume_capability=mount_cap("ext4"),
        publish_context=vol.publish_context,
    )
    assert_code(
        node_env.client.node.NodeStageVolume, request, grpc.StatusCode.FAILED_PRECONDITION, contains="ext2"
    )


def test_a_blank_volume_is_formatted_as_ext2_when_asked(node_env: NodeEnv) -> None:
    require_tool("mkfs.ext2")
    vol = node_env.volume(64 * MiB)
    node_env.stage(vol, mount_cap("ext2", ("noatime", "errors=remount-ro")))
    info = Mounter().mount_at(vol.staging)
    assert info is not None and info.fs_type == "ext2" and "errors=remount-ro" in info.super_options
    node_env.unstage(vol)
    said = subprocess.run([require_tool("dumpe2fs"), "-h", vol.file], capture_output=True, text=True).stdout
    assert "has_journal" not in said, "ext2 has no journal"
    checked = subprocess.run([require_tool("e2fsck"), "-f", "-n", vol.file], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
