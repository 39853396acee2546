"""Loop devices backed by regular files, through the kernel's loop ioctls.

Contracts:
- `attach(file)` returns the /dev/loopN already backed by `file` (same st_dev/st_ino), or binds a free
  one (LOOP_CTL_GET_FREE + LOOP_CONFIGURE; autoclear off, direct I/O off, partition scan on). Idempotent.
- `bound(file)` is the device already bound to `file`, or None; it never binds one. `backed_by(path)`
  answers the same from sysfs without opening a device (for unprivileged processes), `backed_under(dir)`
  for every file in a directory. A backing file unlinked while bound keeps its device: sysfs then names
  it `<path> (deleted)`, which `backed_by(path, unlinked=True)` also finds.
- `detach_file(file)` unbinds every loop device backed by `file` or, when the path holds no file any
  more, every one bound to the file since unlinked from it. Idempotent: none -> no-op. A device still
  open elsewhere (mounted) is unbound by the kernel when its last user closes it.
- `maps(dev, file)` is True when `dev` is bound to `file` itself (the same inode, not merely the same
  path name), read with one ioctl.
- `backing_file(dev)` / `device_size(dev)` / `refresh_capacity(dev)` inspect or resize one device
  (`device_size` is csi.devices', offered here so the local backend needs this one module).

No free loop device -> TransientError with what to do. When the ioctls are unavailable (ENOTTY/EINVAL,
e.g. an old kernel without LOOP_CONFIGURE) `losetup` from util-linux is the documented fallback.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import subprocess
import threading
import time

from csi.devices import device_size
from csi.failures import InvalidParameterError, NotFoundError, TransientError

# <linux/loop.h>
LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_GET_STATUS64 = 0x4C05
LOOP_SET_CAPACITY = 0x4C07
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4
LO_FLAGS_PARTSCAN = 8
LO_FLAGS_DIRECT_IO = 16
LO_NAME_SIZE = 64

LOOP_CONTROL = "/dev/loop-control"
SYS_BLOCK = "/sys/block"
_LOOP_NAME = re.compile(r"^loop\d+$")
UNLINKED = " (deleted)"  # what the kernel appends to the name of a backing file unlinked while bound
_CONFIGURE_RETRIES = 16

__all__ = [
    "attach",
    "backed_by",
    "backed_under",
    "backing_file",
    "bound",
    "detach_file",
    "device_size",
    "maps",
    "refresh_capacity",
]

# Serialises attach/detach inside this process so two callers never bind one file twice.
_lock = threading.Lock()


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


class LoopConfig(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class _Fallback(Exception):
    """The ioctl interface is unavailable here; use losetup."""


def _bound_devices() -> list[str]:
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


def _status(device: str) -> LoopInfo64 | None:
    """LOOP_GET_STATUS64 of `device`; None when it is unbound or gone."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, OSError):
        return None
    try:
        info = LoopInfo64()
        fcntl.ioctl(fd, LOOP_GET_STATUS64, info)
        return info
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise
    finally:
        os.close(fd)


def _same_inode(info: LoopInfo64 | None, st: os.stat_result) -> bool:
    return info is not None and info.lo_inode == st.st_ino and info.lo_device == st.st_dev


def _devices_for(st: os.stat_result) -> list[str]:
    """Bound loop devices whose backing inode is (st_dev, st_ino)."""
    return [device for device in _bound_devices() if _same_inode(_status(device), st)]


def maps(device: str, backing_file: str) -> bool:
    """True when `device` is bound to `backing_file`'s inode; False when it is unbound, bound to another
    file, or the file is gone."""
    try:
        st = os.stat(backing_file)
    except FileNotFoundError:
        return False
    return _same_inode(_status(device), st)


def devices_of(backing_file: str) -> list[str]:
    """Loop devices bound to `backing_file` now ([] when none, or the file is gone). Read-only."""
    try:
        return _devices_for(os.stat(backing_file))
    except FileNotFoundError:
        return []


def bound_files() -> dict[tuple[int, int], list[str]]:
    """Every bound loop device by its backing inode (st_dev, st_ino): one scan for many files."""
    found: dict[tuple[int, int], list[str]] = {}
    for device in _bound_devices():
        info = _status(device)
        if info is not None:
            found.setdefault((info.lo_device, info.lo_inode), []).append(device)
    return found


def _stat_file(backing_file: str) -> os.stat_result:
    try:
        st = os.stat(backing_file)
    except FileNotFoundError as exc:
        raise NotFoundError(f"backing file {backing_file} does not exist") from exc
    if not os.path.isfile(backing_file):
        raise InvalidParameterError(f"{backing_file} is not a regular file")
    return st


def attach(backing_file: str) -> str:
    """Loop device for `backing_file`, reusing one already bound to it. Returns /dev/loopN."""
    with _lock:
        st = _stat_file(backing_file)
        existing = _devices_for(st)
        if existing:
            return existing[0]
        try:
            return _attach_ioctl(backing_file)
        except _Fallback:
            return _losetup("--find", "--show", "--partscan", backing_file, doing=f"attach {backing_file}")


def bound(backing_file: str) -> str | None:
    """The loop device already bound to `backing_file`, or None (a missing file has none). Binds nothing."""
    try:
        st = os.stat(backing_file)
    except FileNotFoundError:
        return None
    existing = _devices_for(st)
    return existing[0] if existing else None


def backed_by(path: str, *, unlinked: bool = False) -> list[str]:
    """Bound loop devices whose backing file, as sysfs names it, is `path`; with `unlinked`, also those
    whose file has since been unlinked from `path`. Needs no privilege (it opens no device), so a
    non-root process can tell whether a file is in use through a loop device."""
    real = os.path.realpath(path)
    return _named(real, real + UNLINKED) if unlinked else _named(real)


def _named(*names: str) -> list[str]:
    """Bound loop devices whose backing file sysfs names as one of `names`."""
    return [d for d in _bound_devices() if backing_file(d) in names]


def backed_under(directory: str) -> list[str]:
    """Bound loop devices whose backing file (as sysfs names it) lies inside `directory`."""
    prefix = os.path.realpath(directory).rstrip("/") + "/"
    return [d for d in _bound_devices() if (backing_file(d) or "").startswith(prefix)]


def _attach_ioctl(backing_file: str) -> str:
    try:
        ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise _Fallback(str(exc)) from exc
    try:
        flags = os.O_RDWR
        try:
            fd = os.open(backing_file, flags | os.O_CLOEXEC)
            lo_flags = LO_FLAGS_PARTSCAN
        except PermissionError:
            fd = os.open(backing_file, os.O_RDONLY | os.O_CLOEXEC)
            lo_flags = LO_FLAGS_PARTSCAN | LO_FLAGS_READ_ONLY
        try:
            for _ in range(_CONFIGURE_RETRIES):
                try:
                    number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.ENODEV, errno.ENXIO):
                        raise _no_free(exc) from exc
                    raise
                device = f"/dev/loop{number}"
                if _configure(device, fd, lo_flags, backing_file):
                    return device
                time.sleep(0.01)  # another process took it between GET_FREE and CONFIGURE
            raise TransientError(
                f"could not bind a loop device for {backing_file}: every free device was taken "
                "concurrently; retry"
            )
        finally:
            os.close(fd)
    finally:
        os.close(ctl)


def _no_free(exc: OSError) -> TransientError:
    return TransientError(
        f"no free loop device ({exc.strerror}): detach unused ones (`losetup -a`, `losetup -d`) "
        "or raise the loop module's max_loop limit"
    )


def _configure(device: str, fd: int, lo_flags: int, backing_file: str) -> bool:
    """Bind `fd` to `device`. False when the device was taken meanwhile (EBUSY)."""
    dev_fd = _open_device(device)
    try:
        cfg = LoopConfig()
        cfg.fd = fd
        cfg.info.lo_flags = lo_flags
        name = os.path.abspath(backing_file).encode()[: LO_NAME_SIZE - 1]
        cfg.info.lo_file_name = name
        try:
            fcntl.ioctl(dev_fd, LOOP_CONFIGURE, cfg)
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            if exc.errno not in (errno.EINVAL, errno.ENOTTY):
                raise
        # Kernels before 5.8: LOOP_SET_FD, then the flags through LOOP_SET_STATUS64.
        try:
            fcntl.ioctl(dev_fd, LOOP_SET_FD, fd)
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            if exc.errno in (errno.EINVAL, errno.ENOTTY):
                raise _Fallback(str(exc)) from exc
            raise
        info = LoopInfo64()
        info.lo_flags = lo_flags & ~LO_FLAGS_READ_ONLY
        info.lo_file_name = name
        try:
            fcntl.ioctl(dev_fd, LOOP_SET_STATUS64, info)
        except OSError:
            fcntl.ioctl(dev_fd, LOOP_CLR_FD, 0)
            raise
        return True
    finally:
        os.close(dev_fd)


def _open_device(device: str) -> int:
    for _ in range(50):  # the node may appear a moment after LOOP_CTL_GET_FREE created the device
        try:
            return os.open(device, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            time.sleep(0.01)
    raise TransientError(f"{device} did not appear in /dev; is /dev a devtmpfs?")


def _losetup(*args: str, doing: str) -> str:
    """The fallback when the ioctls are unavailable: run losetup and return its output; a failure ->
    TransientError saying it could not do `doing`."""
    path = shutil.which("losetup")
    if path is None:
        raise TransientError("loop ioctls unavailable and losetup not installed (apt-get install util-linux)")
    result = subprocess.run([path, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise TransientError(f"losetup could not {doing}: {result.stderr.strip()}")
    return result.stdout.strip()


def detach_file(backing_file: str) -> None:
    """Unbind every loop device backed by `backing_file` or, when no file is there any more, by the file
    unlinked from that path while bound (found by the name sysfs gives it, checked again once the device
    is open). None bound -> no-op. One scan of the loop devices either way."""
    with _lock:
        try:
            st = os.stat(backing_file)
        except FileNotFoundError:
            gone = os.path.realpath(backing_file) + UNLINKED
            for device in _named(gone):
                _detach_device(device, gone)
            return
        for device in _devices_for(st):
            _detach_device(device)


def _detach_device(device: str, name: str | None = None) -> None:
    """Unbind `device`; with `name`, only while sysfs still names its backing file so (the device is
    open meanwhile, so it cannot be rebound to another file in between)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if name is not None and backing_file(device) != name:
            return
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # already unbound
            return
        if exc.errno in (errno.EINVAL, errno.ENOTTY):
            _losetup("-d", device, doing=f"detach {device}")
            return
        raise TransientError(f"could not detach {device}: {exc.strerror}") from exc
    finally:
        os.close(fd)


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


def refresh_capacity(device: str) -> None:
    """Make `device` pick up its backing file's current size (LOOP_SET_CAPACITY)."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, LOOP_SET_CAPACITY, 0)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOTTY):
            _losetup("-c", device, doing=f"refresh the capacity of {device}")
            return
        raise TransientError(f"could not refresh the capacity of {device}: {exc.strerror}") from exc
    finally:
        os.close(fd)
