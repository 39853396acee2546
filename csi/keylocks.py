"""Per-key mutual exclusion for work that must not interleave on one object (a volume's file, an EBS
volume's attachments), while work on other keys runs in parallel.

Unlike csi.inflight (which refuses a duplicate at once), `KeyedLocks.hold` waits. A lock exists only
while a thread holds or waits for it, so the table never grows with the number of keys ever seen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


class _Entry:
    """One key's lock and how many threads hold or wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class KeyedLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @contextmanager
    def hold(self, *keys: str) -> Iterator[None]:
        """Hold the locks of all `keys` for the block. Several keys are taken in sorted order, so two
        callers naming the same keys never deadlock; no key holds nothing."""
        names = sorted(set(keys))
        with self._guard:
            entries = [self._entries.setdefault(k, _Entry()) for k in names]
            for entry in entries:
                entry.users += 1
        try:
            with ExitStack() as stack:
                for entry in entries:
                    stack.enter_context(entry.lock)
                yield
        finally:
            with self._guard:
                for name, entry in zip(names, entries, strict=True):
                    entry.users -= 1
                    if not entry.users:
                        del self._entries[name]

    def __len__(self) -> int:
        """Keys currently held or waited for."""
        with self._guard:
            return len(self._entries)
