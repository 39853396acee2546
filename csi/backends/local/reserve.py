"""Room kept back for deletes: `<data-dir>/state.reserve`, a file of RESERVE_BYTES whose blocks are
allocated (posix_fallocate), not merely a sparse length.

On a full filesystem SQLite cannot append a transaction to the state database's WAL, so without this
DeleteVolume and DeleteSnapshot -- the calls that free space -- would fail like every other change. A
transaction that only removes records is retried once after `release()` gave the reserve's blocks
back (state.Store); the volume or snapshot file deleted after it frees real space, and the next write
that finds room allocates the reserve again (`keep()`).

Sizing: opening a database whose -shm file is gone (a clean stop removes it) takes 32 KiB; a WAL frame
is one 4 KiB page plus 24 bytes, and a delete writes a handful of pages (its table and index leaves),
so 1 MiB holds the -shm and dozens of deletes. It is not meant to cover a checkpoint: SQLite
checkpoints after a commit and ignores a checkpoint that fails, and copying a delete's pages back into
state.db takes no new blocks.

Not kept for: a filesystem that compresses or deduplicates zeros, or one without fallocate where the C
library writes zeros instead (the reserve then may hold less than its size). Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from csi.backends.local import ownership
from csi.backends.local.files import space

log = logging.getLogger("ballast.local")

RESERVE_BYTES = 1024 * 1024


class Reserve:
    """The reserve file at `path` (in the data dir, whose owner it is handed to when root creates it)."""

    def __init__(self, path: str, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size
        self._directory = os.path.dirname(os.path.abspath(path))
        self._lock = threading.Lock()
        self._kept = False  # allocated, as far as this process knows

    def keep(self) -> None:
        """Allocate the reserve unless it is: all of it or none (a failed allocation is truncated
        away). Best effort and cheap while kept: without room it stays released until a later call
        finds room. Never raises."""
        with self._lock:
            if not self._kept:
                self._kept = self._allocate()

    def _allocate(self) -> bool:
        try:
            ownership.create_file(self.path, 0o600, self._directory)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("cannot create the space reserve %s: %s", self.path, exc)
            return False
        try:
            st = os.fstat(fd)
            if st.st_size >= self.size and st.st_blocks * 512 >= self.size:
                return True
            if space(self._directory).free < self.size:
                return False  # no room yet; trying would only make the filesystem flush its journal
            os.posix_fallocate(fd, 0, self.size)
            return True
        except OSError as exc:
            log.info("the space reserve %s stays released for now: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            return False
        finally:
            os.close(fd)

    def release(self) -> bool:
        """Give the reserve's blocks back to the filesystem (truncate and fsync, so ext4 may reuse them
        at once). True when it held any, i.e. a retry now has more room than the failed attempt."""
        with self._lock:
            self._kept = False
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            try:
                held = os.fstat(fd).st_blocks * 512
                if not held:
                    return False
                os.ftruncate(fd, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        log.warning(
            "the filesystem holding %s is full: released the %d-byte space reserve so that deletes can "
            "be recorded; it is allocated again once there is room",
            self._directory,
            held,
        )
        return True

    def make_room(self) -> None:
        """Before the state database is opened: release the reserve when less than its size is free,
        so SQLite can create its -shm and -wal files and start-up its repairs."""
        if space(self._directory).free < self.size:
            self.release()
