"""Attach slots per node, counted over the volumes EC2 reports on the instance and the attaches this
process has in flight to it.

DescribeInstances does not show an attachment before AttachVolume reached EC2, so concurrent publishes of
different volumes to one node would each see the same free slot and together pass the limit. The
Attacher therefore describes the instance and counts inside `NodeSlots.counting(node)`, which holds that
node's guard and yields the volumes this process is attaching to it; `take` reserves the slot before the
guard is let go, and `give_back` (under the guard too, so no count can miss both the reservation and the
attachment that replaces it) ends the reservation once EC2 reports the attachment or the attach failed.
Only the describe-and-count is serialised per node: AttachVolume calls, and the waits for them, of
different volumes run in parallel.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from csi.keylocks import KeyedLocks


class NodeSlots:
    """Attaches in flight in this process, by node; thread safe."""

    def __init__(self) -> None:
        self._nodes = KeyedLocks()
        self._guard = threading.Lock()  # the table itself; each node's entry changes under its guard
        self._flying: dict[str, set[str]] = {}

    @contextmanager
    def counting(self, node_id: str) -> Iterator[frozenset[str]]:
        """Hold the node's guard for the block; yields the volumes being attached to it in this process."""
        with self._nodes.hold(node_id):
            with self._guard:
                flying = frozenset(self._flying.get(node_id, ()))
            yield flying

    def take(self, node_id: str, volume_id: str) -> None:
        """Count `volume_id` as attached to the node until `give_back`. Call it inside `counting`."""
        with self._guard:
            self._flying.setdefault(node_id, set()).add(volume_id)

    def give_back(self, node_id: str, volume_id: str) -> None:
        """End a reservation (the attachment is reported by EC2 now, or failed). Idempotent."""
        with self._nodes.hold(node_id), self._guard:
            flying = self._flying.get(node_id, set())
            flying.discard(volume_id)
            if not flying:
                self._flying.pop(node_id, None)
