"""Removes the files of committed deletes in the background, so a delete answers without waiting for
the filesystem to free the file's blocks.

Unlinking a volume file frees every block it holds, in the calling thread: about a millisecond for a
freshly formatted 1 GiB volume, and seconds for a large one full of data, during which the delete
(and the CO's RPC) would wait. By the time a path is handed here its record is deleted and committed
and the file carries its set-aside name (files.doomed), so nothing can use it again; if the process
stops before removing it, start-up reconciliation removes it (startup.py). Until it is removed its
blocks still count as used: `settle()` lets a space check that comes up short wait for the removals
in flight (files.space). A file holding no block is removed at once instead (files.doomed): it has
nothing to free, and the hand-over would cost more than the unlink. One thread for the whole process,
started with the first removal.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Iterable

log = logging.getLogger("ballast.local")


class Reaper:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[str] = collections.deque()
        self._handed = 0  # paths handed over so far
        self._done = 0  # of them, removed (or failed)
        self._thread: threading.Thread | None = None

    def put(self, paths: Iterable[str]) -> None:
        """Remove `paths` (already gone is fine) soon, in this order."""
        paths = list(paths)
        if not paths:
            return
        with self._cond:
            self._queue.extend(paths)
            self._handed += len(paths)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self) -> bool:
        """Wait until every removal handed over before this call is done (not those handed over while
        it waits); True when there were any."""
        with self._cond:
            target = self._handed
            waited = self._done < target
            while self._done < target:
                self._cond.wait()
        return waited

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                path = self._queue.popleft()
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            except OSError as exc:  # left for start-up reconciliation, which removes set-aside files
                log.warning("could not remove %s (removed at the next start): %s", path, exc)
            with self._cond:
                self._done += 1
                self._cond.notify_all()


REAPER = Reaper()
