"""NodeGetVolumeStats and NodeExpandVolume on a volume the node already staged, grpc-free: the size of
its device at a block path or the usage of its filesystem at a mount path, and growing that filesystem
to a device the controller has expanded. Neither prepares a device: both are handed the one a stage
prepared (Stager.prepared_device).

Contracts (CSI spec): a path that is not the volume's device or a mount of it -> NotFoundError (the
volume does not exist on that path); a device smaller than the size asked for -> OutOfRangeError; a
filesystem that cannot grow where it is mounted -> FailedPreconditionError.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

from csi import devices
from csi.failures import FailedPreconditionError, NotFoundError, OutOfRangeError, os_failures
from csi.filesystems import FS_TYPES
from csi.fshealth import forced_readonly
from csi.mount import Mounter, MountInfo, OnlineGrowthDenied
from shim import failpoints


class VolumeStats(NamedTuple):
    """What NodeGetVolumeStats reports: a block device's size, or a filesystem's usage."""

    block_bytes: int = 0
    usage: devices.Usage | None = None


def stats(mounter: Mounter, volume_id: str, device: str, path: str) -> VolumeStats:
    """Size of the volume's device at a block path, or usage of its filesystem mounted at `path`. What
    is wrong with a volume is NodeGetVolumeHealth's to say, not this. An unpublish meanwhile gives
    NotFoundError, never the numbers of the filesystem beneath: the usage is read between two stats
    that must both show the root of the mount the table holds (by name, each in one syscall; an open
    fd held across them would make that unpublish's umount fail EBUSY)."""
    with os_failures(), _gone_is_not_found(path):
        before = os.stat(path)
        if stat.S_ISBLK(before.st_mode):  # the size of the device it names, which no unmount changes
            node = _volume_node(volume_id, device, path, before)
            return VolumeStats(block_bytes=devices.device_size(node))
        _volume_mount(volume_id, device, path, mounter.mount_at(path), before)
        usage = devices.usage(path)
        after = os.stat(path)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
        raise NotFoundError(f"volume {volume_id} was unmounted from {path}")
    return VolumeStats(usage=usage)


def expand(mounter: Mounter, volume_id: str, device: str, path: str, required: int, block: bool) -> int:
    """Grow the filesystem mounted at `path` to its (already expanded) device; returns the device size
    (block access: just the size). `device` is the disk a stage prepared; what is sized and grown is
    the device at or mounted at `path`, the partition a stage used included: read from the host, so a
    restart that forgot which partition that was grows the same one."""
    with os_failures(), _gone_is_not_found(path):
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode):
            node = _volume_node(volume_id, device, path, st)
            return _holds(volume_id, node, devices.device_size(node), required)
        if block:
            return _holds(volume_id, device, devices.device_size(device), required)
        mount = _volume_mount(volume_id, device, path, mounter.mount_at(path), st)
        mounted = devices.member_node(device, (mount.major, mount.minor))
        size = _holds(volume_id, mounted, devices.device_size(mounted), required)
        if mount.fs_type not in FS_TYPES:
            raise FailedPreconditionError(f"cannot grow a {mount.fs_type} filesystem")
        # the superblock too: an ext4 that errors=remount-ro made read-only shows `ro`, or on newer
        # kernels `emergency_ro`, in its super options while the mount itself still says rw
        if mount.readonly or forced_readonly(mount):
            raise FailedPreconditionError(f"{path} is mounted read-only; the filesystem cannot grow")
        try:
            mounter.grow(mounted, path, mount.fs_type)
        except OnlineGrowthDenied as exc:
            # csi-rules: a filesystem that cannot grow while published is FAILED_PRECONDITION
            raise FailedPreconditionError(str(exc)) from exc
        failpoints.hit("node.expand.grown")
        return size


@contextlib.contextmanager
def _gone_is_not_found(path: str) -> Iterator[None]:
    """`path` vanished (an unpublish meanwhile) -> NotFoundError (spec: "Volume does not exist on
    specified volume_path"), not an INTERNAL OS failure."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotFoundError(f"volume_path {path} does not exist") from exc


def _volume_node(volume_id: str, device: str, path: str, st: os.stat_result) -> str:
    """The node of the volume's device or partition that the device node `st` (at `path`) names."""
    numbers = os.major(st.st_rdev), os.minor(st.st_rdev)
    if not devices.belongs(numbers, device):
        raise NotFoundError(f"{path} is not the device of volume {volume_id}")
    return devices.member_node(device, numbers)


def _volume_mount(
    volume_id: str, device: str, path: str, mount: MountInfo | None, st: os.stat_result
) -> MountInfo:
    """`mount`, the mount table's entry at `path`, when it is a mount of the volume and `st` (read at
    `path` before it) is on it: an unmount in between leaves `st` on the filesystem beneath."""
    if (
        mount is None
        or (mount.major, mount.minor) != (os.major(st.st_dev), os.minor(st.st_dev))
        or not devices.belongs((mount.major, mount.minor), device)
    ):
        raise NotFoundError(f"{path} is not a mount of volume {volume_id}")
    return mount


def _holds(volume_id: str, node: str, size: int, required: int) -> int:
    """`size`, the size of `node`, when it holds `required` bytes (OutOfRangeError otherwise)."""
    if required <= size:
        return size
    if devices.whole_device(node) != os.path.realpath(node):  # the controller grew the disk, not this
        raise OutOfRangeError(
            f"partition {node} of volume {volume_id} holds {size} bytes, less than the requested "
            f"{required}; a partition keeps its size when the volume grows: grow it on the disk with a "
            "partitioning tool (e.g. growpart), then expand again"
        )
    raise OutOfRangeError(
        f"the device of {volume_id} holds {size} bytes, less than the requested {required}; "
        "expand the volume on the controller first"
    )
