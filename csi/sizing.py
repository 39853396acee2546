"""NodeGetVolumeStats and NodeExpandVolume on a volume the node already staged, grpc-free: the size of
its device at a block path or the usage of its filesystem at a mount path, and growing that filesystem
to a device the controller has expanded. Neither prepares a device: both are handed the one a stage
prepared (Stager.prepared_device).

Contracts (CSI spec): a path that is not the volume's device or a mount of it -> NotFoundError (the
volume does not exist on that path); a device smaller than the size asked for -> OutOfRangeError; a
filesystem that cannot grow where it is mounted -> FailedPreconditionError.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from csi import devices
from csi.devices import DeviceNumbers
from csi.failures import FailedPreconditionError, NotFoundError, OutOfRangeError, os_failures
from csi.filesystems import FS_TYPES
from csi.fshealth import forced_readonly
from csi.mount import Mounter, OnlineGrowthDenied
from shim import failpoints


class VolumeStats(NamedTuple):
    """What NodeGetVolumeStats reports: a block device's size, or a filesystem's usage."""

    block_bytes: int = 0
    usage: devices.Usage | None = None


def stats(mounter: Mounter, volume_id: str, device: str, path: str) -> VolumeStats:
    """Size of the volume's device at a block path, or usage of its filesystem mounted at `path`. What
    is wrong with a volume is NodeGetVolumeHealth's to say, not this."""
    with os_failures():
        numbers = _block_numbers(path)
        if numbers is not None:
            if not devices.belongs(numbers, device):
                raise NotFoundError(f"{path} is not the device of volume {volume_id}")
            return VolumeStats(block_bytes=devices.device_size(path))
        mount = mounter.mount_at(path)
        if mount is None or not devices.belongs((mount.major, mount.minor), device):
            raise NotFoundError(f"{path} is not a mount of volume {volume_id}")
        return VolumeStats(usage=devices.usage(path))


def expand(mounter: Mounter, volume_id: str, device: str, path: str, required: int, block: bool) -> int:
    """Grow the filesystem mounted at `path` to its (already expanded) device; returns the device size
    (block access: just the size). `device` is the disk a stage prepared; what is sized and grown is
    the device at or mounted at `path`, the partition a stage used included: read from the host, so a
    restart that forgot which partition that was grows the same one."""
    with os_failures():
        numbers = _block_numbers(path)
        if numbers is not None:
            if not devices.belongs(numbers, device):
                raise NotFoundError(f"{path} is not a device of volume {volume_id}")
            return _holds(volume_id, devices.device_size(path), required)
        if block:
            return _holds(volume_id, devices.device_size(device), required)
        mount = mounter.mount_at(path)
        if mount is None or not devices.belongs((mount.major, mount.minor), device):
            raise NotFoundError(f"volume {volume_id} is not mounted at {path}")
        mounted = devices.member_node(device, (mount.major, mount.minor))
        size = _holds(volume_id, devices.device_size(mounted), required)
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


def _holds(volume_id: str, size: int, required: int) -> int:
    """`size`, when it holds `required` bytes (OutOfRangeError otherwise)."""
    if required > size:
        raise OutOfRangeError(
            f"the device of {volume_id} holds {size} bytes, less than the requested {required}; "
            "expand the volume on the controller first"
        )
    return size


def _block_numbers(path: str) -> DeviceNumbers | None:
    """Device numbers of `path` when it is a block device node, else None."""
    st = os.stat(path)
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISBLK(st.st_mode) else None
