"""The optional, read-only part of the Backend interface: volume and storage health, and the block
metadata of snapshots (CSI SnapshotMetadata).

Each operation is offered only when its BackendCapabilities flag is on (named in brackets below); the
driver checks the flag before calling, so the defaults here, which raise UnsupportedError or report
nothing, are reached only by a misconfigured backend. Like the rest of the interface: plain values in,
records out, csi.failures errors raised, no grpc.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from csi.backends.paging import Page
from csi.extents import Range, always
from csi.failures import UnsupportedError
from csi.health import Issue, StorageIssue, VolumeHealth


class BlockMap(NamedTuple):
    """Allocated or changed ranges of a snapshot.

    `ranges` is lazy: ascending, never overlapping, aligned to the block size asked for (the last range
    may end at `volume_bytes`), and it raises a csi.failures error rather than ending early when it
    cannot go on. Everything that can be checked before the first range is checked before a BlockMap is
    returned, so a bad request fails with its own code instead of a broken stream."""

    volume_bytes: int
    ranges: Iterator[Range]


class Reporting:
    def volume_health(self, volume_id: str) -> tuple[Issue, ...]:
        """[volume_health] The known issues of one volume as the storage system sees it; () when none.
        Missing -> NotFoundError."""
        raise UnsupportedError("this backend does not report volume health")

    def list_volume_health(self, max_entries: int = 0, starting_token: str = "") -> Page[VolumeHealth]:
        """[volume_health] Every volume with at least one issue (healthy ones are left out, as the spec
        asks), in a stable order; `max_entries` 0 means all. Foreign token -> InvalidTokenError."""
        raise UnsupportedError("this backend does not report volume health")

    def storage_health(self) -> list[StorageIssue]:
        """[storage_health] Issues of the storage this node reaches, independent of any one volume."""
        return []

    def snapshot_allocated(
        self, snapshot_id: str, start: int, block: int, secrets: Mapping[str, str]
    ) -> BlockMap:
        """[snapshot_metadata] Ranges of the snapshot that hold data, from the block containing `start`.
        Missing snapshot -> NotFoundError; `start` past the volume -> OutOfRangeError; block metadata
        unavailable for it -> FailedPreconditionError. `secrets` come from the request; never log them."""
        raise UnsupportedError("this backend does not serve snapshot metadata")

    def snapshot_delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        secrets: Mapping[str, str],
        wanted: Callable[[], bool] = always,
    ) -> BlockMap:
        """[snapshot_metadata] Ranges whose bytes differ between two snapshots of one volume (the target
        taken after the base), from the block containing `start`. A missing snapshot -> NotFoundError;
        snapshots of different volumes, or in the wrong order -> InvalidParameterError; otherwise as
        snapshot_allocated. `wanted` (the call is still alive) is asked while a long stretch without a
        change is scanned; False may end the ranges with extents.Abandoned."""
        raise UnsupportedError("this backend does not serve snapshot metadata")
