"""Which loop device is bound to which file: the read side of csi.loop, binding nothing.

Contracts:
- `devices_for(stat)` scans every bound device for one whose backing inode is that file's (one
  LOOP_GET_STATUS64 each); `devices_of(path)` / `bound(path)` answer the same without the scan when
  nobody holds the file open: the kernel grants a write lease only then (`unheld`), and a bound device
  holds its backing file open.
- `backed_by(path)` answers from sysfs names without opening a device (for unprivileged processes),
  `backed_under(dir)` for every file in a directory. A backing file unlinked while bound keeps its
  device: sysfs then names it `<path> (deleted)`, which `backed_by(path, unlinked=True)` also finds,
  and with `renamed` the names of a file renamed from `path` (`<path><suffix>`, perhaps unlinked).
- `maps(dev, file)` is True when `dev` is bound to `file` itself (the same inode, not merely the same
  path name), read with one ioctl.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import signal
import stat
from collections.abc import Sequence

LOOP_GET_STATUS64 = 0x4C05
LO_NAME_SIZE = 64
SYS_BLOCK = "/sys/block"
_LOOP_NAME = re.compile(r"^loop\d+$")
UNLINKED = " (deleted)"  # what the kernel appends to the name of a backing file unlinked while bound


class LoopInfo64(ctypes.Structure):
    _fields_ = [
        ("lo_device", ctypes.c_uint64),
        ("lo_inode", ctypes.c_uint64),
        ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64),
        ("lo_sizelimit", ctypes.c_uint64),
        ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32),
        ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32),
        ("lo_file_name", ctypes.c_char * LO_NAME_SIZE),
        ("lo_crypt_name", ctypes.c_char * LO_NAME_SIZE),
        ("lo_encrypt_key", ctypes.c_uint8 * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    ]


def bound_devices() -> list[str]:
    """/dev/loopN of every loop device currently bound to a file."""
    try:
        names = os.listdir(SYS_BLOCK)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if _LOOP_NAME.match(name) and os.path.exists(os.path.join(SYS_BLOCK, name, "loop")):
            out.append(f"/dev/{name}")
    return sorted(out, key=lambda d: int(d[len("/dev/loop") :]))


def status(device: str) -> LoopInfo64 | None:
    """LOOP_GET_STATUS64 of `device`; None when it is unbound, gone, or cannot tell (EIO when the
    filesystem holding its backing file has failed): such a device maps no file a caller can use, and one
    broken device of somebody else's must not fail every scan on the node."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = LoopInfo64()
        fcntl.ioctl(fd, LOOP_GET_STATUS64, info)
        return info
    except OSError:
        return None
    finally:
        os.close(fd)


def _same_inode(info: LoopInfo64 | None, st: os.stat_result) -> bool:
    return info is not None and info.lo_inode == st.st_ino and info.lo_device == st.st_dev


def devices_for(st: os.stat_result) -> list[str]:
    """Bound loop devices whose backing inode is (st_dev, st_ino)."""
    return [device for device in bound_devices() if _same_inode(status(device), st)]


def unopened(fd: int) -> bool:
    """True when no other open file refers to the inode open at `fd`, so no loop device is bound to it (a
    bound device holds its backing file open). fcntl(2): "a write lease may be placed on a file only if
    there are no other open file descriptors for the file". The lease is given back at once; another open
    meanwhile waits for that (with O_NONBLOCK it fails, EWOULDBLOCK). The kernel tells a lease holder of
    such an open with a signal: SIGIO by default, which would end this process, so this file's is set to
    SIGURG, which nothing here handles and whose default is to ignore it. False when the kernel refuses
    the lease (EAGAIN) or cannot tell here (leases disabled, a filesystem without them, neither owner nor
    CAP_LEASE): the caller then scans."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    except OSError:
        return False
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return True


def holders(fd: int) -> list[str]:
    """Bound loop devices backed by the file open at `fd`: none without a scan when nobody else holds
    the file open, else the devices whose backing inode is the file's."""
    return [] if unopened(fd) else devices_for(os.fstat(fd))


def open_file(path: str, flags: int = os.O_RDONLY) -> int | None:
    """An fd on the regular file at `path`; None when something else is there (never opened, so a FIFO
    cannot hang the caller). Missing -> FileNotFoundError."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None
    return os.open(path, flags | os.O_CLOEXEC | os.O_NOCTTY)


def maps(device: str, backing_file: str) -> bool:
    """True when `device` is bound to `backing_file`'s inode; False when it is unbound, bound to another
    file, or the file is gone."""
    try:
        st = os.stat(backing_file)
    except FileNotFoundError:
        return False
    return _same_inode(status(device), st)


def devices_of(backing_file: str) -> list[str]:
    """Loop devices bound to `backing_file` now ([] when none, or no file is there). Read-only."""
    try:
        return file_devices(backing_file)
    except FileNotFoundError:
        return []


def file_devices(path: str) -> list[str]:
    """Loop devices bound to the file at `path` ([] for anything else there); missing ->
    FileNotFoundError."""
    try:
        fd = open_file(path)
    except PermissionError:  # not readable here: the scan alone tells
        return devices_for(os.stat(path))
    if fd is None:
        return []
    try:
        return holders(fd)
    finally:
        os.close(fd)


def unheld(path: str) -> bool:
    """True when a regular file is at `path` and nothing else holds it open, so no loop device is bound
    to it; False when one may be, or it cannot be told cheaply (then scan). Needs read access only."""
    try:
        fd = open_file(path)
    except OSError:
        return False
    if fd is None:
        return False
    try:
        return unopened(fd)
    finally:
        os.close(fd)


def bound_files() -> dict[tuple[int, int], list[str]]:
    """Every bound loop device by its backing inode (st_dev, st_ino): one scan for many files."""
    found: dict[tuple[int, int], list[str]] = {}
    for device in bound_devices():
        info = status(device)
        if info is not None:
            found.setdefault((info.lo_device, info.lo_inode), []).append(device)
    return found


def bound(backing_file: str) -> str | None:
    """The loop device already bound to `backing_file`, or None (a missing file has none). Binds nothing."""
    existing = devices_of(backing_file)
    return existing[0] if existing else None


def backed_by(path: str, *, unlinked: bool = False, renamed: Sequence[str] = ()) -> list[str]:
    """Bound loop devices whose backing file, as sysfs names it, is `path`; with `unlinked`, also those
    whose file has since been unlinked from `path`, or renamed to `path` + a suffix in `renamed` (and
    perhaps unlinked from there: a file set aside to be deleted). Needs no privilege (it opens no
    device), so a non-root process can tell whether a file is in use through a loop device. A device
    named `path` holds the file there open, so an unheld file answers [] without the scan (not so for
    `unlinked`)."""
    real = os.path.realpath(path)
    if unlinked:
        return named(*gone_names(real, renamed))
    return [] if unheld(real) else named(real)


def gone_names(real: str, renamed: Sequence[str] = ()) -> tuple[str, ...]:
    """The names sysfs gives a file bound at the resolved path `real`: `real` itself, or unlinked from
    it, or renamed to `real` + a suffix in `renamed`, or unlinked from there."""
    return tuple(name + end for name in (real, *(real + s for s in renamed)) for end in ("", UNLINKED))


def named(*names: str) -> list[str]:
    """Bound loop devices whose backing file sysfs names as one of `names`."""
    return [d for d in bound_devices() if backing_file(d) in names]


def backed_under(directory: str) -> list[str]:
    """Bound loop devices whose backing file (as sysfs names it) lies inside `directory`."""
    prefix = os.path.realpath(directory).rstrip("/") + "/"
    return [d for d in bound_devices() if (backing_file(d) or "").startswith(prefix)]


def backing_file(device: str) -> str | None:
    """Path of the file behind `device` (from sysfs, which is not truncated); None when unbound, also
    when it is being unbound meanwhile (sysfs then answers ENODEV): scans of every device meet those."""
    name = os.path.basename(os.path.realpath(device))
    path = os.path.join(SYS_BLOCK, name, "loop", "backing_file")
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            value = fh.read().rstrip("\n")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.ENXIO):
            return None
        raise
    return value or None
