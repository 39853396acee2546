"""Bind mounts of staged volumes onto pod paths (publish/unpublish), grpc-free; part of the staging core.

Contracts (CSI spec): publishing twice with the same arguments -> OK; the target holds another volume,
or this one with other options -> AlreadyExistsError; unpublishing what is not mounted -> OK and the
target is removed. A target is only ever created or removed by the driver: an empty directory (mount
access) or an empty regular file (block access); anything else is left in place with an error.
Targets come checked (csi/paths.py: resolved, under the allowed roots, not a link); they are created
and removed relative to their parent directory's fd, reached without following a symbolic link, and a
bind or an unmount first re-checks that the path still leads there (paths.check_reaches).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from typing import NamedTuple

from csi import devices, paths
from csi.devices import DeviceNumbers
from csi.failures import AlreadyExistsError, FailedPreconditionError, InvalidParameterError
from csi.mount import Mounter, MountError, MountInfo
from shim import failpoints

# Per-mount flags visible in mountinfo, compared when a target is published twice; with the statvfs(3)
# bit that shows each on the mount a bind copies them from.
PER_MOUNT_FLAGS = frozenset({"nodev", "nosuid", "noexec", "noatime", "nodiratime"})
_ST_FLAGS = {"ro": os.ST_RDONLY, "nodev": os.ST_NODEV, "nosuid": os.ST_NOSUID, "noexec": os.ST_NOEXEC}
_ST_FLAGS |= {"noatime": os.ST_NOATIME, "nodiratime": os.ST_NODIRATIME}
MAX_STACKED = 8  # unmounting peels at most this many mounts stacked on one path


class Source(NamedTuple):
    """What a publish binds: a staging path or a device node, and how it shows in mountinfo."""

    path: str
    numbers: DeviceNumbers
    root: str


class Publication(NamedTuple):
    """One publish request, already validated: where, how, and under which access."""

    staging: str
    target: str
    block: bool
    readonly: bool
    bind_flags: Sequence[str]
    single_writer: bool


class Publisher:
    """Bind mounts under the allowed `roots` through `mounter`."""

    def __init__(self, mounter: Mounter, roots: Sequence[str]) -> None:
        self._mounter = mounter
        self._roots = roots

    def others(self, numbers: DeviceNumbers, root: str, exclude: set[str]) -> list[str]:
        """Mount points under the allowed roots showing the same device and root, except `exclude`."""
        return [m.mount_point for m in self._mounts_of(numbers, root) if m.mount_point not in exclude]

    def _mounts_of(self, numbers: DeviceNumbers, root: str) -> list[MountInfo]:
        return [
            m
            for m in self._mounter.mounts(numbers=(numbers,))
            if (m.major, m.minor) == numbers
            and m.root == root
            and paths.under_roots(m.mount_point, self._roots)
        ]

    def peel(self, path: str) -> None:
        """Unmount `path` until nothing is mounted there (stacked mounts included); first re-checked,
        so a symbolic link planted on the way since the path was checked unmounts nothing elsewhere."""
        paths.recheck(path, self._roots)
        for _ in range(MAX_STACKED):
            if not self._mounter.unmount(path) or self._mounter.mount_at(path) is None:
                break

    def publish(self, volume_id: str, source: Source, pub: Publication) -> None:
        """Bind `source` onto the target; already there with the same options -> no-op. The bind keeps
        the per-mount flags of the source's mount (the staging mount's nodev, say) and adds the requested
        ones; a read-write publish of a filesystem staged read-only -> FailedPreconditionError."""
        pub = pub._replace(bind_flags=self._with_inherited(source, pub))
        current = self._mounter.mount_at(pub.target)
        if current is not None:
            _check_published(current, source, pub)
            if pub.block:  # a publish killed between its bind and this sync left the device writable
                self._sync_block_readonly(source)
            return
        if pub.single_writer:
            others = self.others(source.numbers, source.root, {pub.staging, pub.target})
            if others:
                raise FailedPreconditionError(
                    f"volume {volume_id} is already published at {others[0]} and its access mode allows "
                    "one target per node"
                )
        with paths.made_parent(pub.target, self._roots) as parent:
            created = _create_target(parent, pub.target, pub.block)
            failpoints.hit("node.publish.target-created")
            try:
                self._bind(parent, source, pub)
            except (MountError, InvalidParameterError):
                if created:
                    _remove_target(parent, pub.target)
                raise
        failpoints.hit("node.publish.bound")
        if pub.block:
            self._sync_block_readonly(source)

    def unpublish(self, target: str) -> None:
        """Unmount the target and remove it. Not mounted or missing -> OK."""
        current = self._mounter.mount_at(target)
        with paths.found_parent(target, self._roots) as parent:
            if parent is None:
                return  # a directory on the way is missing: nothing can be mounted there
            self.peel(target)
            failpoints.hit("node.unpublish.unmounted")
            _remove_target(parent, target)
        if current is not None and current.fs_type == "devtmpfs":
            device = _shown(current)
            if devices.is_block_device(device):
                self._sync_block_readonly(Source(device, (current.major, current.minor), current.root))

    def _with_inherited(self, source: Source, pub: Publication) -> list[str]:
        """The bind's flags: the requested ones and the per-mount flags of the mount holding the source
        (the staging mount; for a device node, /dev's), which a bind keeps. A read-only staging cannot
        give the read-write publish asked for, so that is refused, not made read-only."""
        if pub.block:
            shown = os.statvfs(source.path).f_flag
            inherited = [name for name, bit in _ST_FLAGS.items() if shown & bit]
        else:
            staged = self._mounter.mount_at(pub.staging)
            inherited = [f for f in staged.options if f in _ST_FLAGS] if staged else []
        if "ro" in inherited and not pub.readonly and not pub.block:
            raise FailedPreconditionError(
                f"the volume is staged read-only at {pub.staging}; publish it read-only (readonly, a "
                "read-only access mode or the ro flag), or stage it read-write"
            )
        if any(f in ("relatime", "strictatime") for f in pub.bind_flags):  # asked for: replaces noatime
            inherited = [f for f in inherited if f != "noatime"]
        return list(dict.fromkeys([*pub.bind_flags, *inherited]))

    def _bind(self, parent: int, source: Source, pub: Publication) -> None:
        """Bind right after re-checking that no symbolic link was planted on the way to the target (in
        `parent`, its directory's fd) or to the staging path it binds, since they were checked."""
        paths.check_reaches(pub.target, parent)
        if not pub.block:
            paths.recheck(pub.staging, self._roots)
        self._mounter.bind(source.path, pub.target, pub.bind_flags)

    def _sync_block_readonly(self, source: Source) -> None:
        """A read-only bind of a device node does not stop writes through it, so the device itself is
        made read-only while every publish of it is read-only (and writable again otherwise)."""
        publishes = self._mounts_of(source.numbers, source.root)
        want = bool(publishes) and all(m.readonly for m in publishes)
        if devices.device_readonly(source.path) != want:
            devices.set_device_readonly(source.path, want)


def _check_published(current: MountInfo, source: Source, pub: Publication) -> None:
    """`current` at the target is what this publish makes: the source, with the flags of the bind."""
    if (current.major, current.minor) != source.numbers or current.root != source.root:
        raise AlreadyExistsError(f"{pub.target} already holds another volume ({_shown(current)})")
    wanted = {f for f in pub.bind_flags if f in PER_MOUNT_FLAGS}
    present = {f for f in current.options if f in PER_MOUNT_FLAGS}
    if current.readonly != ("ro" in pub.bind_flags) or wanted != present:
        raise AlreadyExistsError(f"the volume is already published at {pub.target} with other options")


def _shown(mount: MountInfo) -> str:
    """What `mount` binds, for a message: a device node bind shows devtmpfs as its source."""
    if mount.fs_type == "devtmpfs":
        return os.path.join("/dev", mount.root.lstrip("/"))
    return mount.source


def _create_target(parent: int, target: str, block: bool) -> bool:
    """Create the mount point in `parent` (its directory's fd): a directory, or an empty file for block.
    True when it was created; an existing one of the right kind is used as it is."""
    name = os.path.basename(target)
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if block:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            os.close(os.open(name, flags, 0o640, dir_fd=parent))
        else:
            os.mkdir(name, 0o750, dir_fd=parent)
        return True
    if stat.S_ISLNK(st.st_mode):  # check_path refused a link: this one was planted since
        raise InvalidParameterError(f"target_path {target} is a symbolic link; nothing was mounted")
    if block and not stat.S_ISREG(st.st_mode):
        raise FailedPreconditionError(f"target_path {target} exists and is not a regular file")
    if not block and not stat.S_ISDIR(st.st_mode):
        raise FailedPreconditionError(f"target_path {target} exists and is not a directory")
    return False


def _remove_target(parent: int, target: str) -> None:
    """Remove an unmounted target from `parent` (its directory's fd): an empty directory or an empty
    regular file. Missing -> OK; anything else (a symbolic link included) is left in place."""
    name = os.path.basename(target)
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(name, dir_fd=parent)
        except OSError as exc:
            raise FailedPreconditionError(f"{target} is not empty after unmounting; left in place") from exc
    elif stat.S_ISREG(st.st_mode) and st.st_size == 0:
        os.unlink(name, dir_fd=parent)
    else:
        raise FailedPreconditionError(
            f"{target} is not a directory or empty file the driver created; left in place"
        )
