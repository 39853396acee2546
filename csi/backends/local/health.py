"""Health of the local backend: its volumes as the storage sees them, and the data dir's filesystem.

A volume's issues (ControllerGetVolumeHealth, ControllerListVolumeHealth):
- its backing file is missing -> INACCESSIBLE (BackingFileMissing);
- its backing file is shorter than its record -> DATA_LOSS (BackingFileShort); start-up grows it;
- start-up found it short and grew it -> DATA_LOSS (BackingFileWasShort) from then on, until the volume
  is deleted or an operator clears the mark with `ballast-csi clear-health` once the data is checked;
- recover-state recorded its file, which the old database had no record of -> DATA_LOSS
  (RecoveredWithoutRecord), the same way: it may be a copy a crash cut short;
- the kernel counted errors in the filesystem on a loop device over the file -> DEGRADED (csi.fshealth).

The ledger keeps two tables in state.db: `health_marks` (the marks above) and `growth` (an expand in
progress, with the size before it), so start-up tells a torn expand, where the file still has its old
size and nothing was lost, from a file that lost data.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from csi import fshealth, loop
from csi.backends.local import files
from csi.backends.local.layout import Layout
from csi.backends.local.rows import VolumeRow
from csi.backends.local.state import Store
from csi.backends.paging import Page, seek_page
from csi.failures import DriverError
from csi.health import Issue, Status, StorageIssue, VolumeHealth, distinct
from csi.mount import Mounter, MountInfo

WAS_SHORT = "BackingFileWasShort"
UNRECORDED = "RecoveredWithoutRecord"


class Mark(NamedTuple):
    volume_id: str
    reason: str
    message: str
    since: float


class Ledger:
    """The health marks and growth intents of one data dir's state database."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def begin_growth(self, volume_id: str, from_size: int) -> None:
        with self._store.tx() as db:
            db.execute("INSERT OR REPLACE INTO growth VALUES (?, ?)", (volume_id, from_size))

    def end_growth(self, volume_id: str) -> None:
        with self._store.tx() as db:
            db.execute("DELETE FROM growth WHERE volume_id = ?", (volume_id,))

    def growth(self) -> dict[str, int]:
        """Expands in progress (or torn by a crash): volume id -> its size before."""
        return {r["volume_id"]: r["from_size"] for r in self._store.query("SELECT * FROM growth")}

    def mark_short(self, volume_id: str, found: int, recorded: int) -> None:
        """Record that start-up found the file `found` bytes long, short of `recorded`. A mark already
        there keeps its first sighting."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        message = (
            f"at start-up on {when} the backing file held {found} of the volume's {recorded} bytes and was "
            f"grown with zeros: bytes {found}..{recorded} are lost. Restore the volume from a snapshot, or "
            f"check its data and clear this with `ballast-csi clear-health {volume_id}`"
        )
        with self._store.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO health_marks VALUES (?, ?, ?, ?)",
                (volume_id, WAS_SHORT, message, time.time()),
            )

    def mark_unrecorded(self, volume_id: str) -> str:
        """Record that recover-state found the volume's file without a record in a database that could
        say: an interrupted copy (clone, restore) looks just like that, torn. Returns the message."""
        message = (
            "recover-state found this volume's file without a record in the old database: it may be a "
            "clone or restore that a crash cut short, holding part of its data. Check its data, then clear "
            f"this with `ballast-csi clear-health {volume_id}`, or delete the volume"
        )
        with self._store.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO health_marks VALUES (?, ?, ?, ?)",
                (volume_id, UNRECORDED, message, time.time()),
            )
        return message

    def marks(self, volume_id: str = "") -> dict[str, list[Mark]]:
        sql, args = "SELECT * FROM health_marks ORDER BY since", []
        if volume_id:
            sql, args = "SELECT * FROM health_marks WHERE volume_id = ? ORDER BY since", [volume_id]
        out: dict[str, list[Mark]] = {}
        for r in self._store.query(sql, args):
            out.setdefault(r["volume_id"], []).append(
                Mark(r["volume_id"], r["reason"], r["message"], r["since"])
            )
        return out

    def clear(self, volume_id: str) -> int:
        """Remove the volume's marks; returns how many there were."""
        with self._store.tx() as db:
            return int(db.execute("DELETE FROM health_marks WHERE volume_id = ?", (volume_id,)).rowcount)

    def carry(
        self, marks: Iterable[tuple[str, str, str, float]], growth: Mapping[str, int], volume_ids: set[str]
    ) -> int:
        """Write another database's marks (volume id, reason, message, since) and growth intents (volume
        id -> size before) of the volumes in `volume_ids` (recover-state); returns the marks written."""
        marks = [m for m in marks if m[0] in volume_ids]
        with self._store.tx() as db:
            db.executemany("INSERT OR IGNORE INTO health_marks VALUES (?, ?, ?, ?)", marks)
            db.executemany(
                "INSERT OR REPLACE INTO growth VALUES (?, ?)",
                [(v, size) for v, size in growth.items() if v in volume_ids],
            )
        return len(marks)

    def settle(self) -> None:
        """After start-up reconciliation: no expand is in progress, and marks of deleted volumes go.
        Writes only when there is something to remove, so a start on a full filesystem writes nothing."""
        stale = self._store.query(
            "SELECT EXISTS (SELECT 1 FROM growth) OR EXISTS "
            "(SELECT 1 FROM health_marks WHERE volume_id NOT IN (SELECT id FROM volumes)) AS stale"
        )
        if not stale[0]["stale"]:
            return
        with self._store.tx() as db:
            db.execute("DELETE FROM growth")
            db.execute("DELETE FROM health_marks WHERE volume_id NOT IN (SELECT id FROM volumes)")


def _file_issues(row: VolumeRow, path: str) -> Iterator[Issue]:
    size = files.size_of(path)
    if size is None:
        yield Issue(
            Status.INACCESSIBLE,
            "BackingFileMissing",
            f"the backing file {path} of volume {row.id} is missing; restore it from a backup, or restore "
            "the volume from a snapshot and delete this one",
        )
    elif size < row.size:
        yield Issue(
            Status.DATA_LOSS,
            "BackingFileShort",
            f"the backing file {path} holds {size} of the volume's {row.size} bytes; the rest is lost. The "
            "driver grows it at its next start; restore the volume from a snapshot",
        )


class LocalHealth:
    """Health checks over one data dir."""

    def __init__(self, layout: Layout, store: Store) -> None:
        self._layout = layout
        self._store = store
        self.ledger = Ledger(store)

    def _issues(
        self,
        row: VolumeRow,
        marks: Sequence[Mark],
        loops: Mapping[tuple[int, int], list[str]],
        mounts: list[MountInfo],
    ) -> tuple[Issue, ...]:
        path = self._layout.volume_file(row.id)
        found = [*_file_issues(row, path), *(Issue(Status.DATA_LOSS, m.reason, m.message) for m in marks)]
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return distinct(found)
        for device in loops.get((st.st_dev, st.st_ino), []):
            found.extend(_filesystem(device, mounts))
        return distinct(found)

    def volume(self, volume_id: str) -> tuple[Issue, ...]:
        self._layout.volume_file(volume_id)
        row = self._store.existing_volume(volume_id)
        path = self._layout.volume_file(volume_id)
        loops = {_inode(path): loop.devices_of(path)} if os.path.exists(path) else {}
        marks = self.ledger.marks(volume_id).get(volume_id, [])
        return self._issues(row, marks, loops, _mounts())

    def listing(self, max_entries: int, token: str) -> Page[VolumeHealth]:
        marks, loops, mounts = self.ledger.marks(), loop.bound_files(), _mounts()
        unhealthy = [
            VolumeHealth(row.id, found)
            for row in self._store.volumes()
            if (found := self._issues(row, marks.get(row.id, []), loops, mounts))
        ]
        return seek_page(unhealthy, lambda h: h.volume_id, max_entries, token)

    def storage(self) -> list[StorageIssue]:
        return fshealth.storage_issues(self._layout.data_dir)


def _inode(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _mounts() -> list[MountInfo]:
    return Mounter(syscalls=False).mounts()


def _filesystem(device: str, mounts: Iterable[MountInfo]) -> Iterator[Issue]:
    """The kernel's view of the filesystem on a loop device (mounted where this process sees it, or not)."""
    st = os.stat(device)
    numbers = (os.major(st.st_rdev), os.minor(st.st_rdev))
    mount = next((m for m in mounts if (m.major, m.minor) == numbers), None)
    remounted = mount is not None and fshealth.forced_readonly(mount)
    yield from fshealth.filesystem_issues(numbers, mount.mount_point if mount else None, remounted)


def run_clear_health(data_dir: str, volume_ids: Sequence[str]) -> int:
    """`ballast-csi clear-health`: drop the health marks of volumes whose data an operator checked.
    Safe while the driver runs (the state database is shared). Exit 1 when a volume is unknown, or with
    one line when the state database cannot be used (unreadable or corrupt: recover-state's advice)."""
    import sqlite3  # here: the rest of this module never touches the database itself

    layout = Layout(data_dir)
    unusable = f"state database {layout.state_db} is unusable"
    advice = (
        f"rebuild it from the files with `ballast-csi recover-state --data-dir {data_dir}` (docs/recovery.md)"
    )
    try:
        os.stat(layout.state_db)
        store = Store(layout.state_db)
    except OSError as exc:  # absent, or there but unreadable (EIO): not the same advice
        missing = isinstance(exc, FileNotFoundError)
        print(
            f"ballast-csi: no state database in {data_dir}"
            if missing
            else f"ballast-csi: cannot read {layout.state_db}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    except sqlite3.Error as exc:
        print(f"ballast-csi: {unusable} ({exc}); {advice}", file=sys.stderr)
        return 1
    status = 0
    try:
        ledger = Ledger(store)
        for volume_id in volume_ids:
            try:
                layout.volume_file(volume_id)
                store.existing_volume(volume_id)
            except DriverError as exc:
                print(f"ballast-csi: {exc}", file=sys.stderr)
                status = 1
                continue
            cleared = ledger.clear(volume_id)
            print(
                f"{volume_id}: cleared {cleared} health mark(s)"
                if cleared
                else f"{volume_id}: no health mark"
            )
    except sqlite3.Error as exc:
        print(f"ballast-csi: {unusable} ({exc}); {advice}", file=sys.stderr)
        status = 1
    finally:
        store.close()
    return status
