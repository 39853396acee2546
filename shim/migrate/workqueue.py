"""A work queue with client-go's guarantees: a key is queued at most once, never processed by two
workers at once, and a key added while it is being processed runs again after it is done.
`add_after` schedules a key for later (an earlier schedule of the same key wins).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._delayed: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        self._closed = False
        self._cond = threading.Condition()

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: str) -> None:
        if self._closed:
            return
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            due = self._clock() + max(0.0, delay)
            if self._due.get(key, float("inf")) <= due:
                return
            self._due[key] = due
            heapq.heappush(self._delayed, (due, key))
            self._cond.notify()

    def _promote_locked(self) -> float | None:
        """Move due keys into the queue; seconds until the next one is due (None: none waiting)."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            due, key = heapq.heappop(self._delayed)
            if self._due.get(key) == due:
                del self._due[key]
                self._add_locked(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> str | None:
        """The next key (the caller must call done(key)), or None on timeout or shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                wait = self._promote_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key)

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def idle(self) -> bool:
        """Nothing queued, scheduled or being processed."""
        with self._cond:
            return not (self._queue or self._due or self._processing)
