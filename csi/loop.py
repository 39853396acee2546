"""Loop devices backed by regular files, through the kernel's loop ioctls.

Contracts:
- `attach(file)` returns the /dev/loopN already backed by `file` (same st_dev/st_ino), or binds a free
  one (LOOP_CTL_GET_FREE + LOOP_CONFIGURE; autoclear off, direct I/O off, partition scan on). Idempotent.
  It binds under a shared flock of the file, which the bound device keeps (the kernel holds the file
  open through the fd it was bound with) until it is unbound: an exclusive flock holder (a delete)
  knows no attach binds the file meanwhile.
- `detach_file(file)` unbinds every loop device backed by `file` or, when the path holds no file any
  more (or with `unlinked`), every one bound to a file since unlinked from it; `detach(dev, file)`
  unbinds `dev` if it maps `file`. Idempotent: none -> no-op. A device still open elsewhere (mounted)
  is unbound by the kernel when its last user closes it.
- `device_size(dev)` / `refresh_capacity(dev)` read or resize one device (`device_size` is
  csi.devices', offered here so the local backend needs this one module).
- Finding devices (`bound`, `devices_of`, `backed_by`, `maps`, `backing_file`, ...) is csi.loopfind's,
  offered here alike; it binds nothing.

No free loop device -> TransientError with what to do. When the ioctls are unavailable (ENOTTY/EINVAL,
e.g. an old kernel without LOOP_CONFIGURE) `losetup` from util-linux is the documented fallback.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence

from csi.devices import device_readonly, device_size, set_device_readonly
from csi.failures import InvalidParameterError, NotFoundError, TransientError
from csi.loopfind import (
    LO_NAME_SIZE,
    LoopInfo64,
    backed_by,
    backed_under,
    backing_file,
    bound,
    bound_files,
    devices_of,
    file_devices,
    gone_names,
    holders,
    maps,
    named,
    open_file,
    unheld,
    unopened,
)

# <linux/loop.h>
LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_SET_CAPACITY = 0x4C07
LOOP_CONFIGURE = 0x4C0A
LOOP_CTL_GET_FREE = 0x4C82
LO_FLAGS_READ_ONLY = 1
LO_FLAGS_AUTOCLEAR = 4
LO_FLAGS_PARTSCAN = 8
LO_FLAGS_DIRECT_IO = 16

LOOP_CONTROL = "/dev/loop-control"
_CONFIGURE_RETRIES = 16

__all__ = [
    "attach",
    "backed_by",
    "backed_under",
    "backing_file",
    "bound",
    "bound_files",
    "detach",
    "detach_file",
    "device_size",
    "devices_of",
    "maps",
    "refresh_capacity",
    "unheld",
    "unopened",
]

# Serialises attach/detach inside this process so two callers never bind one file twice.
_lock = threading.Lock()


class LoopConfig(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class _Fallback(Exception):
    """The ioctl interface is unavailable here; use losetup."""


def _open_backing(backing_file: str) -> tuple[int, int]:
    """An fd on `backing_file` for LOOP_CONFIGURE (read-write, or read-only when the file is,
    binding a read-only device) and the loop flags for it. Missing -> NotFoundError; not a regular
    file -> InvalidParameterError."""
    try:
        try:
            fd, lo_flags = open_file(backing_file, os.O_RDWR), LO_FLAGS_PARTSCAN
        except PermissionError:
            fd, lo_flags = open_file(backing_file), LO_FLAGS_PARTSCAN | LO_FLAGS_READ_ONLY
    except FileNotFoundError as exc:
        raise NotFoundError(f"backing file {backing_file} does not exist") from exc
    if fd is None:
        raise InvalidParameterError(f"{backing_file} is not a regular file")
    return fd, lo_flags


def attach(backing_file: str) -> str:
    """Loop device for `backing_file`, reusing one already bound to it. Returns /dev/loopN.

    Binds holding a shared flock on the file (waiting while another holds an exclusive one), and only
    while the file it opened is still the one at `backing_file` (else NotFoundError): a process that
    holds an exclusive flock on the file knows no attach binds it meanwhile, and once it has renamed or
    unlinked the file under that flock, no attach that opened it earlier binds it after. A device this
    binds keeps that shared flock until it is unbound."""
    fd, lo_flags = _open_backing(backing_file)
    try:
        _shared(fd, backing_file)
        with _lock:
            existing = holders(fd)
            if existing:
                return existing[0]
            try:
                return _writable(_attach_ioctl(fd, lo_flags, backing_file))
            except _Fallback:
                return _writable(
                    _losetup("--find", "--show", "--partscan", backing_file, doing=f"attach {backing_file}")
                )
    finally:
        os.close(fd)  # and with it the flock, unless a device bound here holds the file now


def _shared(fd: int, backing_file: str) -> None:
    """A shared flock on the file open at `fd`, once it is still the file at `backing_file`: renamed or
    unlinked meanwhile (the exclusive holder deleting it) -> NotFoundError."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    opened = os.fstat(fd)
    try:
        there = os.stat(backing_file)
    except FileNotFoundError:
        there = None
    if there is None or (there.st_dev, there.st_ino) != (opened.st_dev, opened.st_ino):
        raise NotFoundError(f"backing file {backing_file} was deleted or replaced while being attached")


def _writable(device: str) -> str:
    """`device`, just bound, with the kernel's read-only flag (BLKROSET) off: the flag outlives a
    detach, so one left by a read-only block publish that was never undone (its target unmounted
    behind the driver's back, or a crash) would make every write to the next file bound there fail."""
    if device_readonly(device):
        set_device_readonly(device, False)
    return device


def _attach_ioctl(fd: int, lo_flags: int, backing_file: str) -> str:
    try:
        ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise _Fallback(str(exc)) from exc
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


def detach_file(backing_file: str, *, unlinked: bool = False, renamed: Sequence[str] = ()) -> None:
    """Unbind every loop device backed by `backing_file` or, when no file is there any more or with
    `unlinked`, by a file unlinked from that path while bound (a file replaced behind the driver's back
    leaves one: found by the name sysfs gives it, checked again once the device is open), or renamed
    from it to the path + a suffix in `renamed` (a file set aside to be deleted), perhaps unlinked
    since. None bound -> no-op. Without `unlinked`, at most one scan of the loop devices, none for a
    file nobody holds."""
    with _lock:
        try:
            held = file_devices(backing_file)
        except FileNotFoundError:
            held, unlinked = [], True
        if unlinked:
            real = os.path.realpath(backing_file)
            others = gone_names(real, renamed)[1:]  # the file there now: `held`, proved by its inode
            for device in named(*others):
                _detach_device(device, others)
        for device in held:
            _detach_device(device)


def detach(device: str, backing_file: str) -> bool:
    """Unbind `device` if it maps `backing_file` (the same inode); True when it did. Idempotent."""
    with _lock:
        if not maps(device, backing_file):
            return False
        _detach_device(device)
        return True


def _detach_device(device: str, names: Sequence[str] | None = None) -> None:
    """Unbind `device`; with `names`, only while sysfs still names its backing file one of them (the
    device is open meanwhile, so it cannot be rebound to another file in between)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if names is not None and backing_file(device) not in names:
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
