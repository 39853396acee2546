"""How much the local backend may provision: the --capacity bound on the sum of volume sizes, and the
free space of the data dir's filesystem (docs/configuration.md, "Capacity of the local backend").

Volumes are sparse files and reserve nothing (thin provisioning), so their sizes together may exceed
the filesystem. --capacity bounds that sum; the transactions that record a size check it again
(state.Store), so the checks here only refuse before a file is made or copied. Each check costs one
statvfs, or one query of the sum when --capacity is set, whatever the number of volumes.
"""

from __future__ import annotations

from csi.backends.local import files
from csi.backends.local.state import Store
from csi.failures import OutOfCapacityError, OutOfRangeError


class Room:
    def __init__(self, directory: str, store: Store, limit: int, granularity: int) -> None:
        """`directory`: where volume files live; `limit`: --capacity (0: none); `granularity`: the size
        step a request can name."""
        self._directory, self._store = directory, store
        self.limit, self._granularity = limit, granularity

    def check_limit(self, size: int) -> None:
        """Room under --capacity for a new volume of `size` -> else OutOfCapacityError."""
        if not self.limit:
            return
        used = self._store.provisioned_bytes()
        if used + size > self.limit:
            raise OutOfCapacityError(
                f"{size} bytes requested, {max(0, self.limit - used)} of the --capacity limit "
                f"{self.limit} left"
            )

    def check_space(self, size: int, added: int, short: type[OutOfCapacityError | OutOfRangeError]) -> None:
        """The `added` bytes of a volume of `size` must fit in the free space now, or they could never
        all be written: more -> `short`; a volume larger than the whole filesystem -> OutOfRangeError (no
        retry can succeed)."""
        space = files.space(self._directory, added)
        if size > space.size:
            raise OutOfRangeError(
                f"{size} bytes requested, more than the filesystem holding {self._directory} holds"
            )
        if added > space.free:
            raise short(
                f"{added} bytes requested, but the filesystem holding {self._directory} has {space.free} "
                "bytes free; free space there (delete unused snapshots or volumes) or ask for less"
            )

    def largest(self) -> int:
        """The largest volume a create takes now (GetCapacity; Kubernetes schedules on it): the free
        space, within what --capacity leaves, rounded down to a size a request can name. Creating a
        volume does not lower it (a sparse file holds nothing yet); writing into volumes does."""
        room = files.space(self._directory).free
        if self.limit:
            room = min(room, self.limit - self._store.provisioned_bytes())
        return max(0, room - room % self._granularity)
