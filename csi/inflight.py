"""Per-key in-flight guard: a concurrent duplicate operation is refused at once, never queued.

Keys are namespaced strings ("create:<name>", "vol:<id>", "publish:<vol>:<node>"). Holding a key never
blocks work on other keys; the only shared lock is held for a set lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from csi.failures import BusyError


class InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._holds = 0

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        """Hold all `keys` for the duration of the block. Any already held -> BusyError (the CO retries)."""
        with self._lock:
            busy = next((k for k in keys if k in self._keys), None)
            if busy is not None:
                raise BusyError(
                    f"an operation on {busy.split(':', 1)[-1]} is already in progress; retry later"
                )
            self._keys.update(keys)
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._keys.difference_update(keys)
                self._holds -= 1

    def __len__(self) -> int:
        """Operations holding keys now (one however many keys it holds)."""
        with self._lock:
            return self._holds
