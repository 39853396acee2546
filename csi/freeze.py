"""Freezing a mounted filesystem (FIFREEZE) and thawing it again (FITHAW), as `fsfreeze` does.

A frozen filesystem has flushed everything to its device and blocks every new write until it is thawed,
so a copy of the device taken meanwhile is a clean, crash-consistent image. The freeze belongs to the
filesystem (the superblock), not to a process: it outlives the process that froze it, which is why a
driver that starts thaws what it finds frozen (csi.backends.local.quiesce). Both need CAP_SYS_ADMIN.

Contracts:
- `freeze(path)` freezes the filesystem mounted at `path`; already frozen -> FreezeError (EBUSY).
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


def _ioctl(path: str, request: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, request, 0)
    finally:
        os.close(fd)


def freeze(path: str) -> None:
    """Freeze the filesystem mounted at `path` (flushes it, then holds every write)."""
    try:
        _ioctl(path, FIFREEZE)
    except OSError as exc:
        raise FreezeError(exc.errno, f"cannot freeze the filesystem at {path}: {exc.strerror}") from exc


def thaw(path: str) -> bool:
    """Thaw the filesystem mounted at `path`. True when it was frozen, False when it was not."""
    try:
        _ioctl(path, FITHAW)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise FreezeError(exc.errno, f"cannot thaw the filesystem at {path}: {exc.strerror}") from exc
    return True
