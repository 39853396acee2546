"""What the kernel reports about the health of a filesystem: the OS layer of volume and storage health.

- ext4 counts the errors it met per filesystem in sysfs (/sys/fs/ext4/<dev>/errors_count, kept in the
  superblock until fsck clears it): any -> DEGRADED. So for ext3 and ext2, which the ext4 driver mounts.
- xfs marks the metadata it found corrupt as "sick" (XFS_IOC_FSGEOMETRY, XFS_IOC_AG_GEOMETRY): any ->
  DEGRADED; a filesystem xfs shut down answers EIO -> INACCESSIBLE.
- A filesystem mounted read-write whose superblock is read-only (or, since Linux 6.11, flagged
  `emergency_ro` by ext4) was made read-only by the kernel after errors -> DEGRADED.
- `storage_issues(directory)` judges the filesystem holding a directory for NodeGetStorageHealth:
  unreachable or read-only -> STORAGE_UNREACHABLE; nearly full or errored -> STORAGE_DEGRADED.

grpc-free; nothing here writes. Readings that cannot be taken (no sysfs entry, another filesystem type)
report nothing rather than guessing.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import struct
from collections.abc import Iterator

from csi.devices import DeviceNumbers
from csi.health import Issue, Status, StorageIssue, StorageStatus
from csi.mount import Mounter, MountInfo

SYS_EXT4 = "/sys/fs/ext4"
SYS_DEV_BLOCK = "/sys/dev/block"
XFS_IOC_FSGEOMETRY = 0x8100587E  # _IOR('X', 126, struct xfs_fsop_geom), 256 bytes
XFS_IOC_AG_GEOMETRY = 0xC080583D  # _IOWR('X', 61, struct xfs_ag_geometry), 128 bytes
_GEOMETRY = struct.Struct("=8I4Q16s8I2I")  # ... logsunit, sick, checked (the fields up to `checked`)
_AG_GEOMETRY = struct.Struct("=8I")  # ag_number, length, freeblks, icount, ifree, sick, checked, flags
NEARLY_FULL_PERCENT = 95


def forced_readonly(mount: MountInfo) -> bool:
    """True when the kernel made a filesystem read-only under a read-write mount (after errors)."""
    return bool({"ro", "emergency_ro"} & set(mount.super_options)) and not mount.readonly


def _superblock_readonly(numbers: DeviceNumbers) -> bool:
    mounts = Mounter(syscalls=False).mounts()
    return any(
        (m.major, m.minor) == numbers and {"ro", "emergency_ro"} & set(m.super_options) for m in mounts
    )


def device_name(numbers: DeviceNumbers) -> str | None:
    """Kernel name of a block device ("loop5", "nvme1n1"), None when the numbers name no device."""
    path = os.path.realpath(f"{SYS_DEV_BLOCK}/{numbers[0]}:{numbers[1]}")
    return os.path.basename(path) if os.path.exists(path) else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def ext4_errors(name: str) -> tuple[int, str]:
    """(error count, what the last error was) of the ext4 filesystem on device `name`; (0, "") when
    it has none or is not ext4."""
    base = f"{SYS_EXT4}/{name}"
    count = _read(f"{base}/errors_count")
    if not count.isdigit() or int(count) == 0:
        return 0, ""
    where = _read(f"{base}/last_error_func")
    stamp = _read(f"{base}/last_error_time")
    when = ""
    if stamp.isdigit() and int(stamp):
        when = " at " + datetime.datetime.fromtimestamp(int(stamp), datetime.UTC).isoformat()
    return int(count), f" (last in {where}{when})" if where else ""


def _ioctl(fd: int, request: int, buf: bytearray) -> bool:
    """True when the ioctl answered; False when the filesystem does not know it (not xfs)."""
    try:
        fcntl.ioctl(fd, request, buf, True)
    except OSError as exc:
        if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    return True


def xfs_sick(path: str) -> list[str] | None:
    """What xfs marked sick on the filesystem holding `path` ([] when nothing), None when it is not an
    xfs that reports health. OSError(EIO) when xfs has shut the filesystem down."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        geometry = bytearray(256)
        if not _ioctl(fd, XFS_IOC_FSGEOMETRY, geometry):
            return None
        fields = _GEOMETRY.unpack_from(geometry)
        agcount, version, sick = fields[3], fields[15], fields[21]
        if version < 5:  # sick/checked exist from geometry version 5 (Linux 5.2) on
            return None
        found = ["filesystem-wide metadata"] if sick else []
        for ag in range(agcount):
            info = bytearray(128)
            _AG_GEOMETRY.pack_into(info, 0, ag, 0, 0, 0, 0, 0, 0, 0)
            if _ioctl(fd, XFS_IOC_AG_GEOMETRY, info) and _AG_GEOMETRY.unpack_from(info)[5]:
                found.append(f"allocation group {ag}")
        return found
    finally:
        os.close(fd)


def _xfs_state(mount_point: str) -> tuple[bool, list[str]]:
    """(shut down, what is sick) of the xfs at `mount_point`; (False, []) for other filesystems."""
    try:
        return False, xfs_sick(mount_point) or []
    except OSError as exc:
        if exc.errno == errno.EIO:
            return True, []
        return False, []


def filesystem_issues(
    numbers: DeviceNumbers, mount_point: str | None, remounted_readonly: bool = False
) -> Iterator[Issue]:
    """Issues of a volume's filesystem on device `numbers`, mounted at `mount_point` (None: not mounted
    where this process can see it, so only the sysfs counters are read)."""
    name = device_name(numbers) or f"{numbers[0]}:{numbers[1]}"
    count, last = ext4_errors(name)
    if count:
        yield Issue(
            Status.DEGRADED,
            "FilesystemErrors",
            f"ext4 on {name} recorded {count} error(s){last}; unpublish and unstage the volume and run "
            "fsck.ext4 -f on it (which also resets the count)",
        )
    if remounted_readonly:
        yield Issue(
            Status.DEGRADED,
            "FilesystemReadOnly",
            f"the kernel remounted the filesystem on {name} read-only after errors; writes fail until it "
            "is unstaged, checked with fsck and staged again",
        )
    if mount_point is None:
        return
    shut_down, sick = _xfs_state(mount_point)
    if shut_down:
        yield Issue(
            Status.INACCESSIBLE,
            "FilesystemShutDown",
            f"xfs shut the filesystem on {name} down (every access fails with EIO); unpublish and unstage "
            "the volume and run xfs_repair on it",
        )
    elif sick:
        yield Issue(
            Status.DEGRADED,
            "FilesystemCorruption",
            f"xfs found corrupt metadata on {name} ({', '.join(sick)}); unpublish and unstage the volume "
            "and run xfs_repair on it",
        )


def storage_issues(directory: str, nearly_full_percent: int = NEARLY_FULL_PERCENT) -> list[StorageIssue]:
    """Issues of the filesystem holding `directory` (NodeGetStorageHealth of a local data dir)."""
    try:
        st = os.statvfs(directory)
        dev = os.stat(directory).st_dev
    except OSError as exc:
        return [
            StorageIssue(
                StorageStatus.UNREACHABLE,
                "DataDirUnreachable",
                f"{directory} cannot be read ({exc.strerror}); no volume in it can be used from this node",
            )
        ]
    numbers = (os.major(dev), os.minor(dev))
    shut_down, sick = _xfs_state(directory)
    out = _unusable(directory, shut_down, bool(st.f_flag & os.ST_RDONLY) or _superblock_readonly(numbers))
    name = device_name(numbers) or "its device"
    count, last = ext4_errors(name)
    if count or sick:
        found = f"ext4 recorded {count} error(s){last}" if count else f"xfs found corrupt {', '.join(sick)}"
        out.append(
            StorageIssue(
                StorageStatus.DEGRADED,
                "DataDirFilesystemErrors",
                f"the filesystem holding {directory} ({name}) has errors: {found}; {REPAIR}",
            )
        )
    if st.f_blocks and (st.f_blocks - st.f_bavail) * 100 >= nearly_full_percent * st.f_blocks:
        out.append(
            StorageIssue(
                StorageStatus.DEGRADED,
                "DataDirNearlyFull",
                f"the filesystem holding {directory} is over {nearly_full_percent}% full "
                f"({st.f_bavail * st.f_frsize} bytes left); volumes are sparse files whose writes fail once "
                "it is full: free space there or move volumes away",
            )
        )
    return out


REPAIR = "check the kernel log, unmount the filesystem and repair it (fsck, xfs_repair)"


def _unusable(directory: str, shut_down: bool, readonly: bool) -> list[StorageIssue]:
    out: list[StorageIssue] = []
    if shut_down:
        out.append(
            StorageIssue(
                StorageStatus.UNREACHABLE,
                "DataDirShutDown",
                f"xfs shut down the filesystem holding {directory}: every volume in it fails I/O; {REPAIR}",
            )
        )
    if readonly:
        out.append(
            StorageIssue(
                StorageStatus.UNREACHABLE,
                "DataDirReadOnly",
                f"the filesystem holding {directory} is read-only, so writes to every volume in it fail; "
                f"{REPAIR}, then mount it read-write",
            )
        )
    return out
