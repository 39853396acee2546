"""Batched Describe calls: concurrent lookups of single volumes, volume names or instances become one
filtered EC2 call per window (`--aws-describe-batch-window`), so that EC2's Describe rate limit, which
is shared by every client of the account in the region, is not spent per waiter.

The first lookup of a kind opens a batch and waits out the window; lookups of the same kind arriving
meanwhile join it. The batch is sent when the window ends, or at once when it holds `MAX_KEYS` keys.
Its callers get the records that match their own key; a record EC2 does not return is simply absent
(the lookups filter by `volume-id`, `tag:CSIVolumeName` or `instance-id` rather than naming ids, so an
unknown id does not fail the whole call the way `VolumeIds=[...]` does). When the call fails (after
ec2.Ec2's retries), every caller of the batch gets the error.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

Records = list[dict[str, Any]]
# EC2 allows at most 200 filter values in one call (FilterLimitExceeded).
MAX_KEYS = 200


class _Batch:
    __slots__ = ("done", "error", "found", "keys")

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.done = threading.Event()
        self.found: dict[str, Records] = {}
        self.error: BaseException | None = None


class Batcher:
    """Merges lookups by key into calls of `fetch(keys) -> {key: records}`, one per window."""

    def __init__(self, fetch: Callable[[list[str]], dict[str, Records]], window: float) -> None:
        self._fetch = fetch
        self._window = window
        self._cond = threading.Condition()
        self._open: _Batch | None = None

    def get(self, key: str) -> Records:
        """The records matching `key` (none: []), from the batch this lookup joined."""
        with self._cond:
            batch = self._open
            leader = batch is None
            if batch is None:
                batch = self._open = _Batch()
            batch.keys.add(key)
            if len(batch.keys) >= MAX_KEYS:
                self._open = None  # full: no one else joins; the leader sends it now
                self._cond.notify_all()
            elif leader:
                self._cond.wait_for(lambda: self._open is not batch, timeout=self._window)
                if self._open is batch:
                    self._open = None
        if leader:
            self._send(batch)
        batch.done.wait()
        if batch.error is not None:
            raise copy.copy(batch.error) from batch.error
        return batch.found.get(key, [])

    def _send(self, batch: _Batch) -> None:
        try:
            batch.found = self._fetch(sorted(batch.keys))
        except BaseException as exc:
            batch.error = exc
        finally:
            batch.done.set()


def grouped(records: Records, key_of: Callable[[dict[str, Any]], str | None]) -> dict[str, Records]:
    """`records` by the key each one answers (records without one are dropped)."""
    out: dict[str, Records] = {}
    for record in records:
        key = key_of(record)
        if key is not None:
            out.setdefault(key, []).append(record)
    return out
