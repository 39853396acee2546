"""Changed-block tracking of local snapshots (the SnapshotMetadata service), over csi.extents.

- allocated: the ranges of the snapshot file holding data (SEEK_DATA/SEEK_HOLE).
- delta: the ranges whose bytes differ between two snapshots of one volume. Which path a data dir takes
  is decided once, by trying a reflink in its snapshots directory:
  * reflink (xfs with reflink=1, btrfs): snapshots share the extents nobody wrote since, and FIEMAP
    shows it, so only ranges mapped to different physical blocks are read and compared;
  * fallback (ext4, xfs without reflink, tmpfs): every range holding data in either file is read and
    compared.
  The answer is exact either way; only the bytes read differ (`last_read` counts them per stream).

A stream reads its snapshot files through descriptors it opens with its first range. A snapshot deleted
after that does not end it: the stream finishes from the open file, which is the snapshot as it was
taken (its space is freed when the stream ends). One deleted before -> NotFoundError; a read that fails
-> DriverError. Either aborts the stream with a status, never cuts it short.

The target must not be older than the base: (created, seq) is the order in which their images were
taken, since snapshots.py copies, stamps and records a volume's snapshots under its lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

from csi import extents
from csi.backends.local import files
from csi.backends.local.layout import Layout
from csi.backends.local.rows import SnapshotRow
from csi.backends.local.state import Store
from csi.backends.reporting import BlockMap
from csi.failures import (
    DriverError,
    FailedPreconditionError,
    InvalidParameterError,
    NotFoundError,
    OutOfRangeError,
)

log = logging.getLogger("ballast.local")
BLOCK_SIZE = 64 * 1024  # the granularity deltas are computed in unless the driver asks for another


class LocalBlocks:
    def __init__(self, layout: Layout, store: Store) -> None:
        self._layout = layout
        self._store = store
        self._reflinks: bool | None = None
        self.last_read = extents.ReadStats()

    def reflinks(self) -> bool:
        """Whether this data dir takes the reflink path (tried once, then remembered)."""
        if self._reflinks is None:
            self._reflinks = files.can_reflink(self._layout.snapshots_dir)
            log.info(
                "changed blocks of %s: %s",
                self._layout.data_dir,
                "reflink path (unchanged extents are shared and not read)"
                if self._reflinks
                else "fallback path (the data dir cannot reflink: data ranges are read and compared)",
            )
        return self._reflinks

    def _snapshot(self, snapshot_id: str, start: int) -> tuple[SnapshotRow, str]:
        path = self._layout.snapshot_file(snapshot_id)
        row = self._store.snapshot(snapshot_id)
        if row is None:
            raise NotFoundError(f"snapshot {snapshot_id} not found")
        if start > row.size:
            raise OutOfRangeError(
                f"starting_offset {start} is past the end of snapshot {snapshot_id} ({row.size} bytes)"
            )
        try:
            os.stat(path)
        except FileNotFoundError as exc:
            raise FailedPreconditionError(f"the file of snapshot {snapshot_id} ({path}) is missing") from exc
        except OSError as exc:  # EIO and the like: the file is there, but the data dir fails to read it
            raise DriverError(f"reading snapshot {snapshot_id} failed: {exc.strerror or exc}; retry") from exc
        return row, path

    def allocated(self, snapshot_id: str, start: int, block: int) -> BlockMap:
        row, path = self._snapshot(snapshot_id, start)
        return BlockMap(row.size, _guarded(extents.allocated(path, start, block), snapshot_id))

    def delta(
        self,
        base_id: str,
        target_id: str,
        start: int,
        block: int,
        wanted: Callable[[], bool] = extents.always,
    ) -> BlockMap:
        if base_id == target_id:
            raise InvalidParameterError("base_snapshot_id and target_snapshot_id name the same snapshot")
        base, base_path = self._snapshot(base_id, 0)
        target, target_path = self._snapshot(target_id, start)
        unknown = [row.id for row in (base, target) if not row.source_volume_id]
        if unknown:  # spec: the target is "a second snapshot in the same volume", which cannot be told
            raise FailedPreconditionError(
                f"the source volume of snapshot(s) {', '.join(unknown)} is unknown: recover-state rebuilt "
                "the state database without their record, and a delta compares two snapshots of one volume"
            )
        if base.source_volume_id != target.source_volume_id:
            raise InvalidParameterError(
                f"snapshots {base_id} and {target_id} are of different volumes ({base.source_volume_id}, "
                f"{target.source_volume_id}); a delta compares two snapshots of one volume"
            )
        if (target.created, target.seq) < (base.created, base.seq):
            raise InvalidParameterError(
                f"target snapshot {target_id} was taken before base snapshot {base_id}"
            )
        self.last_read = extents.ReadStats()
        ranges = extents.changed(
            base_path,
            target_path,
            start,
            block,
            share_aware=self.reflinks(),
            stats=self.last_read,
            wanted=wanted,
        )
        return BlockMap(target.size, _guarded(ranges, f"{base_id} or {target_id}"))


def _guarded(ranges: Iterator[extents.Range], what: str) -> Iterator[extents.Range]:
    """The ranges, with a failure to read a snapshot file turned into a DriverError (INTERNAL)."""
    try:
        yield from ranges
    except FileNotFoundError as exc:
        raise NotFoundError(f"snapshot {what} was deleted before its block metadata could be read") from exc
    except OSError as exc:
        raise DriverError(
            f"reading snapshot {what} failed: {exc.strerror or exc}; retry from the last range received"
        ) from exc
