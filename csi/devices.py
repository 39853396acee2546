"""Block devices on this host: identity (device numbers, partitions, sysfs), size, read-only flag, and
what a filesystem on them reports. Every node-side stager uses these; nothing here mounts or formats.

Contracts:
- `rdev(path)` raises FailedPreconditionError when `path` is not a block device.
- `family(device)` is the device's numbers and its partitions'; `belongs(numbers, device)` is True for
  the device itself and for its partitions; `names_node(root, disk_root)` is the same for bind-mounted
  device nodes. None of them raises.
- `fs_size` reads a superblock and returns None rather than guessing.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import stat
import struct
from typing import NamedTuple

from csi.failures import FailedPreconditionError
from csi.filesystems import EXT_TYPES

DeviceNumbers = tuple[int, int]
BLKROSET, BLKROGET = 0x125D, 0x125E


def partition_path(device: str, number: int) -> str:
    """/dev/loop0 + 1 -> /dev/loop0p1; /dev/xvdf + 1 -> /dev/xvdf1; 0 -> the device itself."""
    if number == 0:
        return device
    return f"{device}p{number}" if device[-1].isdigit() else f"{device}{number}"


def rdev(path: str) -> DeviceNumbers:
    """(major, minor) of the block device at `path`."""
    st = os.stat(path)
    if not stat.S_ISBLK(st.st_mode):
        raise FailedPreconditionError(f"{path} is not a block device")
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def family(device: str) -> frozenset[DeviceNumbers]:
    """Device numbers of `device` and of each of its partitions: read once, then every entry of a mount
    table is checked by a set lookup. Empty when `device` is not a block device or is gone; never raises."""
    try:
        own = rdev(device)
    except (OSError, FailedPreconditionError):
        return frozenset()
    members = {own}
    sys_dir = f"/sys/dev/block/{own[0]}:{own[1]}"
    try:
        entries = os.listdir(sys_dir)
    except OSError:
        return frozenset(members)
    disk = os.path.basename(os.path.realpath(sys_dir))
    for entry in entries:  # partitions are subdirectories named after the disk: loop0p1, vda1
        if not entry.startswith(disk) or not os.path.exists(f"{sys_dir}/{entry}/partition"):
            continue
        try:
            with open(f"{sys_dir}/{entry}/dev", encoding="ascii") as fh:
                major, minor = fh.read().split(":")
        except (OSError, ValueError):
            continue  # the partition went away meanwhile
        members.add((int(major), int(minor)))
    return frozenset(members)


def belongs(numbers: DeviceNumbers, device: str) -> bool:
    """True when device numbers `numbers` are `device` or one of its partitions."""
    if numbers[0] == 0:  # an unnamed device (tmpfs, proc, overlay...): no block device, no partition
        return False
    try:
        if numbers == rdev(device):  # the common case, without listing sysfs
            return True
    except (OSError, FailedPreconditionError):
        return False
    return numbers in family(device)


def member_node(device: str, numbers: DeviceNumbers) -> str:
    """The node of `device` or of its partition with device numbers `numbers` (which belong to it):
    /dev/loop0 + the numbers of loop0p1 -> /dev/loop0p1."""
    if numbers == rdev(device):
        return device
    return "/dev/" + os.path.basename(os.path.realpath(f"/sys/dev/block/{numbers[0]}:{numbers[1]}"))


def whole_device(device: str) -> str:
    """/dev/loop0p1 -> /dev/loop0 (the disk a partition belongs to); a whole disk -> itself."""
    real = os.path.realpath(device)
    sys_path = os.path.realpath(f"/sys/class/block/{os.path.basename(real)}")
    if os.path.exists(os.path.join(sys_path, "partition")):
        return "/dev/" + os.path.basename(os.path.dirname(sys_path))
    return real


def devtmpfs_numbers(device: str) -> tuple[DeviceNumbers, str]:
    """How a bind-mounted device node shows in mountinfo: the /dev filesystem and /<name> as root."""
    real = os.path.realpath(device)
    st = os.stat(os.path.dirname(real))
    return (os.major(st.st_dev), os.minor(st.st_dev)), "/" + os.path.relpath(real, "/dev")


def names_node(root: str, disk_root: str) -> bool:
    """True when `root`, the devtmpfs path a bind-mounted device node shows in mountinfo, is the disk's
    node `disk_root` or one of its partitions' (/loop1, /loop1p2 for /loop1; never /loop10)."""
    if not root.startswith(disk_root):
        return False
    rest = root[len(disk_root) :]
    if not rest:
        return True
    if disk_root[-1].isdigit():  # partitions of a disk whose name ends in a digit take a "p"
        if not rest.startswith("p"):
            return False
        rest = rest[1:]
    return rest.isdigit()


def device_size(device: str) -> int:
    """Size of a block device (or file) in bytes."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def device_readonly(device: str) -> bool:
    """The kernel's read-only flag of a block device (BLKROGET)."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        value = ctypes.c_int(0)
        fcntl.ioctl(fd, BLKROGET, value)
        return bool(value.value)
    finally:
        os.close(fd)


def set_device_readonly(device: str, readonly: bool) -> None:
    """Set the kernel's read-only flag of a block device (BLKROSET): writes through any node fail."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BLKROSET, ctypes.c_int(1 if readonly else 0))
    finally:
        os.close(fd)


def fs_size(device: str, fs_type: str) -> int | None:
    """Filesystem size in bytes from its superblock (ext*, xfs); None when unreadable or unknown."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if fs_type in EXT_TYPES:
            return _ext_size(os.pread(fd, 1024, 1024))
        if fs_type == "xfs":
            return _xfs_size(os.pread(fd, 16, 0))
        return None
    finally:
        os.close(fd)


def _ext_size(sb: bytes) -> int | None:
    if len(sb) < 0x158 or struct.unpack_from("<H", sb, 0x38)[0] != 0xEF53:
        return None
    lo, log_block = struct.unpack_from("<I", sb, 0x4)[0], struct.unpack_from("<I", sb, 0x18)[0]
    incompat = struct.unpack_from("<I", sb, 0x60)[0]
    hi = struct.unpack_from("<I", sb, 0x150)[0] if incompat & 0x80 else 0
    return int(((hi << 32) | lo) * (1024 << log_block))


def _xfs_size(sb: bytes) -> int | None:
    if len(sb) < 16 or sb[:4] != b"XFSB":
        return None
    block, dblocks = struct.unpack_from(">IQ", sb, 4)
    return int(block * dblocks)


class Usage(NamedTuple):
    """What statvfs reports for a mounted filesystem."""

    total_bytes: int
    available_bytes: int
    used_bytes: int
    total_inodes: int
    free_inodes: int
    used_inodes: int


def usage(path: str) -> Usage:
    st = os.statvfs(path)
    return Usage(
        total_bytes=st.f_blocks * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        total_inodes=st.f_files,
        free_inodes=st.f_ffree,
        used_inodes=st.f_files - st.f_ffree,
    )
