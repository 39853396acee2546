"""Freezing a mounted filesystem (FIFREEZE) and thawing it again (FITHAW), as `fsfreeze` does.

A frozen filesystem has flushed everything to its device and blocks every new write until it is thawed,
so a copy of the device taken meanwhile is a clean, crash-consistent image. The freeze belongs to the
filesystem (the superblock), not to a process: it outlives the process that froze it, which is why a
driver that starts thaws what it finds frozen (csi.backends.local.quiesce). Both need CAP_SYS_ADMIN.

Contracts:
- `freeze(path)` freezes the filesystem mounted at `path` and returns an open descriptor on it: the
  hold. While it is open the filesystem cannot be unmounted (EBUSY), so the thaw cannot lose its way;
  `thaw_held(fd)` thaws through it and closes it. Already frozen -> FreezeError (EBUSY).
- `thaw(path)` returns True when it thawed the filesystem, False when it was not frozen (EINVAL).
"""

from __future__ import annotations

import errno
import fcntl
import os

FIFREEZE = 0xC0045877  # _IOWR('X', 119, int)
FITHAW = 0xC0045878  # _IOWR('X', 120, int)


class FreezeError(OSError):
    """The filesystem could not be frozen or thawed; the message says which and why."""


def _open(path: str, doing: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FreezeError(exc.errno, f"cannot {doing} the filesystem at {path}: {exc.strerror}") from exc


def _thaw(fd: int, where: str) -> bool:
    """FITHAW through `fd`: True when it thawed, False when the filesystem was not frozen."""
    try:
        fcntl.ioctl(fd, FITHAW, 0)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise FreezeError(exc.errno, f"cannot thaw the filesystem {where}: {exc.strerror}") from exc
    return True


def freeze(path: str) -> int:
    """Freeze the filesystem mounted at `path` (flushes it, then holds every write); returns the hold."""
    fd = _open(path, "freeze")
    try:
        fcntl.ioctl(fd, FIFREEZE, 0)
    except OSError as exc:
        os.close(fd)
        raise FreezeError(exc.errno, f"cannot freeze the filesystem at {path}: {exc.strerror}") from exc
    return fd


def thaw_held(fd: int) -> None:
    """Thaw the filesystem `freeze` returned `fd` for (already thawed is fine), and close `fd`."""
    try:
        _thaw(fd, "held frozen")
    finally:
        os.close(fd)


def thaw(path: str) -> bool:
    """Thaw the filesystem mounted at `path`. True when it was frozen, False when it was not."""
    fd = _open(path, "thaw")
    try:
        return _thaw(fd, f"at {path}")
    finally:
        os.close(fd)
