"""The mount system calls through ctypes: mount(2)/umount2(2) (`Libc`), and a bind mount with per-mount
flags made in one step as seen from its target (`bind`, Linux 5.12+).

mount(2) cannot bind and set flags at once: a bind, then a bind remount. A process killed between the
two leaves the target bound without its flags (a "read-only" publish writable). Here the bind is a
detached clone of the source (open_tree(2) OPEN_TREE_CLONE), held only by a file descriptor; its flags
are set while detached (mount_setattr(2)), and it is attached at the target last (move_mount(2)). A crash
before the attach frees the clone with the process: the target holds nothing or the finished mount.

`bind(source, target, set_bits)` returns False when the kernel (or a seccomp filter) lacks these
calls: the caller then uses mount(2). mount_setattr changes only the flags it names; every other
per-mount flag is kept from the source's mount, as a plain bind keeps them.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

from csi.filesystems import (
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_RELATIME,
    MS_STRICTATIME,
)

# asm-generic numbers: one table for every architecture from open_tree on (Linux 5.2+).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_FDCWD, AT_EMPTY_PATH = 1, -100, 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
MOUNT_ATTR__ATIME, MOUNT_ATTR_NOATIME, MOUNT_ATTR_STRICTATIME = 0x70, 0x10, 0x20
MOUNT_ATTR_RELATIME, MOUNT_ATTR_NODIRATIME = 0x0, 0x80
UNSUPPORTED = (errno.ENOSYS, errno.EPERM)  # no such call, or a seccomp profile that predates it

# MS_* bit -> (MOUNT_ATTR_* to set, to clear); superblock flags (sync, dirsync, lazytime) are not
# per-mount: a bind remount ignores them too.
_ATTRS: dict[int, tuple[int, int]] = {
    MS_RDONLY: (MOUNT_ATTR_RDONLY, 0),
    MS_NOSUID: (MOUNT_ATTR_NOSUID, 0),
    MS_NODEV: (MOUNT_ATTR_NODEV, 0),
    MS_NOEXEC: (MOUNT_ATTR_NOEXEC, 0),
    MS_NODIRATIME: (MOUNT_ATTR_NODIRATIME, 0),
    MS_NOATIME: (MOUNT_ATTR_NOATIME, MOUNT_ATTR__ATIME),
    MS_STRICTATIME: (MOUNT_ATTR_STRICTATIME, MOUNT_ATTR__ATIME),
    MS_RELATIME: (MOUNT_ATTR_RELATIME, MOUNT_ATTR__ATIME),
}


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def attributes(set_bits: int) -> tuple[int, int]:
    """(MOUNT_ATTR_* to set, to clear) for the per-mount MS_* bits in `set_bits`."""
    attr_set = attr_clr = 0
    for bit, (on, off) in _ATTRS.items():
        if set_bits & bit:
            attr_set, attr_clr = attr_set | on, attr_clr | off
    return attr_set, attr_clr


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _call(number: int, *args: object) -> int:
    result = int(_syscall(ctypes.c_long(number), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


class Libc:
    """mount(2)/umount2(2) through ctypes."""

    def __init__(self) -> None:
        # The interpreter's own symbols include libc; ctypes.util.find_library would run ldconfig in a
        # subprocess, about 10 ms of start-up.
        lib = ctypes.CDLL(None, use_errno=True)
        self._mount = lib.mount
        self._mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self._umount2 = lib.umount2
        self._umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

    def mount(self, source: str | None, target: str, fs_type: str | None, flags: int, data: str) -> None:
        rc = self._mount(
            source.encode() if source else None,
            target.encode(),
            fs_type.encode() if fs_type else None,
            flags,
            data.encode() if data else None,
        )
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)

    def umount2(self, target: str, flags: int) -> None:
        if self._umount2(target.encode(), flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)


def bind(source: str, target: str, set_bits: int, before_attach: Callable[[], None] | None = None) -> bool:
    """Bind `source` at `target` with the per-mount MS_* bits of `set_bits`, attached already flagged.
    False: these calls are unavailable and nothing was done. `before_attach()` runs just before the
    attach (a failpoint). OSError: the bind failed; nothing is mounted at the target."""
    try:
        tree = _call(
            SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), os.fsencode(source),
            ctypes.c_uint(OPEN_TREE_CLONE | os.O_CLOEXEC),
        )  # fmt: skip
    except OSError as exc:
        if exc.errno in UNSUPPORTED:
            return False
        raise OSError(exc.errno, exc.strerror, source) from exc
    try:
        attr_set, attr_clr = attributes(set_bits)
        if attr_set or attr_clr:
            attr = _MountAttr(attr_set, attr_clr, 0, 0)
            try:
                _call(
                    SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"", ctypes.c_uint(AT_EMPTY_PATH),
                    ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                )  # fmt: skip
            except OSError as exc:
                if exc.errno in UNSUPPORTED:  # Linux 5.2 to 5.11: open_tree without mount_setattr
                    return False
                raise OSError(exc.errno, exc.strerror, target) from exc
        if before_attach is not None:
            before_attach()
        try:
            _call(
                SYS_MOVE_MOUNT, ctypes.c_int(tree), b"", ctypes.c_int(AT_FDCWD), os.fsencode(target),
                ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
            )  # fmt: skip
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, target) from exc
        return True
    finally:
        os.close(tree)  # unattached, the clone goes with its last descriptor
