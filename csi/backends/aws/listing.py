"""ListVolumes paging over one consistent snapshot per listing, so paging through N volumes sweeps the
account once (N / 500 DescribeVolumes calls per listed tag key), not once per page.

The first page of a listing (no starting_token) sweeps EC2 and keeps the records, ordered by volume id,
under a new listing id; its next_token is `lvs:<listing id>:<last volume id returned>`, and every later
page of the listing is served from the same snapshot, after that id. Snapshots are bounded: at most
`keep` listings are held, each for `ttl` seconds after its last page. A token whose snapshot is gone
(expired, evicted, or the driver restarted) starts a fresh sweep and still resumes after its volume id,
so a listing never repeats a volume and never misses one that existed throughout it. Tokens stay well
under the CSI limit of 128 bytes.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from csi.backends.base import Page
from csi.failures import InvalidTokenError

Record = dict[str, Any]
TOKEN = re.compile(r"lvs:([0-9a-f]{12}):(vol-[0-9a-f]{8,17})")


class Listings:
    """Snapshots of `sweep()` (every listed volume's EC2 record) by listing id."""

    def __init__(
        self,
        sweep: Callable[[], list[Record]],
        *,
        keep: int = 8,
        ttl: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sweep = sweep
        self._keep, self._ttl, self._clock = keep, ttl, clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[float, list[str], list[Record]]] = OrderedDict()

    def page(self, max_entries: int, token: str) -> Page[Record]:
        """Up to `max_entries` records (0: all) after the token's position, in volume id order."""
        listing, after = _parse(token)
        snapshot = self._held_snapshot(listing) if listing else None
        if snapshot is None:
            listing, snapshot = self._new_snapshot()
        ids, records = snapshot
        start = bisect.bisect_right(ids, after) if after else 0
        end = start + max_entries if max_entries else len(ids)
        items = records[start:end]
        more = end < len(ids)
        return Page(items=items, next_token=f"lvs:{listing}:{ids[end - 1]}" if more and items else "")

    def _held_snapshot(self, listing: str) -> tuple[list[str], list[Record]] | None:
        now = self._clock()
        with self._lock:
            for key in [k for k, (used, _, _) in self._held.items() if now - used > self._ttl]:
                del self._held[key]
            held = self._held.get(listing)
            if held is None:
                return None
            self._held[listing] = (now, held[1], held[2])
            self._held.move_to_end(listing)
            return held[1], held[2]

    def _new_snapshot(self) -> tuple[str, tuple[list[str], list[Record]]]:
        records = sorted(self._sweep(), key=lambda v: str(v["VolumeId"]))
        ids = [str(v["VolumeId"]) for v in records]
        listing = os.urandom(6).hex()
        with self._lock:
            self._held[listing] = (self._clock(), ids, records)
            while len(self._held) > self._keep:
                self._held.popitem(last=False)
        return listing, (ids, records)


def _parse(token: str) -> tuple[str, str]:
    """(listing id, volume id to resume after) of a starting_token; a token this driver did not issue
    -> InvalidTokenError."""
    if not token:
        return "", ""
    m = TOKEN.fullmatch(token)
    if m is None:
        raise InvalidTokenError(f"starting_token {token!r} was not issued by this driver")
    return m.group(1), m.group(2)
