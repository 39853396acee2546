"""Durable state of the local backend: one SQLite database (WAL, synchronous=FULL) in the data dir.

Every mutating method is one transaction, committed before it returns, so a killed driver restarts
knowing exactly which volumes, snapshots, groups and attachments exist. Concurrent creates and deletes
of volumes share commits (groupcommit.Transactions); each still returns only once its own is durable.
Rows carry a monotonically increasing `seq` (never reused), which orders listings and backs paging
tokens.
Thread-safe: one connection guarded by a lock; several processes may share the file (busy timeout).
A database a root process creates is the data dir's owner's, and so are its -wal and -shm files
(ownership.py).
On a full filesystem a transaction fails with StateFull (RESOURCE_EXHAUSTED), but one that only removes
records (deletes, detach) releases the space reserve (reserve.py) and is retried once; every other
write first allocates the reserve again when it was released and there is room.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from csi.backends.local import ownership
from csi.backends.local.groupcommit import FileFirst, T, Transactions
from csi.backends.local.reserve import Reserve
from csi.backends.local.rows import (
    AttachmentRow,
    GroupRow,
    SnapshotRow,
    VolumeRow,
    group_row,
    snapshot_row,
    volume_row,
)
from csi.backends.local.schema import SCHEMA, upgrade
from csi.failures import (
    FailedPreconditionError,
    LimitExceededError,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
)


class NameTaken(Exception):
    """An insert lost a race for a unique name; the caller re-reads the winner."""


class StateFull(OutOfCapacityError):
    """The filesystem holding the state database has no room for a transaction (SQLITE_FULL)."""


def _provisioned(db: sqlite3.Connection) -> int:
    """The volumes' recorded sizes together, read on `db` (inside the caller's transaction, if any)."""
    return int(db.execute("SELECT COALESCE(SUM(size), 0) FROM volumes").fetchone()[0])


def still_published(volume_id: str, nodes: Sequence[str]) -> FailedPreconditionError:
    """DeleteVolume's refusal of a volume still published to `nodes`."""
    return FailedPreconditionError(
        f"volume {volume_id} is still published to node(s) {', '.join(sorted(nodes))}; unpublish it first"
    )


class Store:
    def __init__(self, path: str, reserve: Reserve | None = None) -> None:
        """`reserve`: the space reserve this process keeps (the data dir's owner); None: none."""
        self.path = path
        self._reserve = reserve
        self._lock = threading.Lock()
        ownership.create_file(path, 0o644, os.path.dirname(os.path.abspath(path)))  # SQLite's own mode
        self._db = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=30000")
        self._db.executescript(SCHEMA)
        upgrade(self._db)
        # CreateVolume and DeleteVolume records: concurrent ones share a commit (groupcommit.py)
        self.writes = Transactions(self._db, self._lock, self._mapped)

    def _mapped(self, exc: BaseException) -> BaseException:
        """A full disk -> StateFull naming the filesystem to free; anything else as it is."""
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            full = StateFull(
                f"the filesystem holding {os.path.dirname(self.path)} is full, so the state "
                "database cannot record the change; free space there and retry"
            )
            full.__cause__ = exc
            return full
        return exc

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT); rolled back if the block or the COMMIT
        raises, so a failed COMMIT never leaves the connection inside a transaction. A full disk ->
        StateFull naming the filesystem to free. Allocates the space reserve first if it is not."""
        if self._reserve is not None:
            self._reserve.keep()
        with self._bare_tx() as db:
            yield db

    @contextmanager
    def _bare_tx(self) -> Iterator[sqlite3.Connection]:
        """tx() without touching the space reserve."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                mapped = self._mapped(exc)
                if mapped is not exc:
                    raise mapped from exc
                raise

    def _freeing(self, fn: Callable[[sqlite3.Connection], T], *, grouped: bool = False) -> T:
        """`fn(db)` in a transaction (`grouped`: a group commit) that only removes records. On a full
        disk the space reserve is released and `fn` retried once, alone, so the caller can go on to
        delete the files that hold the space; StateFull only when no reserve was left to release."""
        if self._reserve is not None:
            self._reserve.keep()
        try:
            if grouped:
                return self.writes.run(fn)
            with self._bare_tx() as db:
                return fn(db)
        except StateFull:
            if self._reserve is None or not self._reserve.release():
                raise
        with self._bare_tx() as db:
            return fn(db)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    query = _read  # one read statement, for the modules that keep their own tables here (health.py)

    def issued(self, table: str) -> int:
        """The highest `seq` `table` ever gave a row (deleted rows' too): no paging token names more."""
        rows = self._read("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
        return int(rows[0]["seq"]) if rows else 0

    # ---- volumes

    def volume(self, volume_id: str) -> VolumeRow | None:
        rows = self._read("SELECT * FROM volumes WHERE id = ?", (volume_id,))
        return volume_row(rows[0]) if rows else None

    def existing_volume(self, volume_id: str) -> VolumeRow:
        """The volume's row; missing -> NotFoundError."""
        row = self.volume(volume_id)
        if row is None:
            raise NotFoundError(f"volume {volume_id} not found")
        return row

    def volume_by_name(self, name: str) -> VolumeRow | None:
        rows = self._read("SELECT * FROM volumes WHERE name = ?", (name,))
        return volume_row(rows[0]) if rows else None

    def volumes(self, after_seq: int = 0, limit: int = -1) -> list[VolumeRow]:
        rows = self._read("SELECT * FROM volumes WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit))
        return [volume_row(r) for r in rows]

    def volume_sizes(self) -> dict[str, int]:
        """Every volume's recorded size by id (no record decoded): what start-up reconciles against."""
        return {r["id"]: r["size"] for r in self._read("SELECT id, size FROM volumes")}

    def provisioned_bytes(self) -> int:
        """The volumes' recorded sizes together."""
        with self._lock:
            return _provisioned(self._db)

    def insert_volume(
        self,
        volume_id: str,
        name: str,
        size: int,
        spec: dict[str, Any],
        mutable: dict[str, str],
        created: float,
        *,
        capacity_limit: int = 0,
        first: FileFirst | None = None,
    ) -> VolumeRow:
        """Raises NameTaken when another volume already has `name`, and OutOfCapacityError when a
        non-zero `capacity_limit` would be exceeded (checked in the same transaction). `first`: the
        backing file, made durable before the record (groupcommit.py); its errors are raised as they are."""
        spec_text = json.dumps(spec, sort_keys=True)
        row = (volume_id, name, size, spec_text, json.dumps(mutable), created)

        def insert(db: sqlite3.Connection) -> int:
            if capacity_limit:
                used = _provisioned(db)
                if used + size > capacity_limit:
                    raise OutOfCapacityError(
                        f"{size} bytes requested, {max(0, capacity_limit - used)} of the --capacity "
                        f"limit {capacity_limit} left"
                    )
            cursor = db.execute(
                "INSERT INTO volumes (id, name, size, spec, mutable, created) VALUES (?, ?, ?, ?, ?, ?)", row
            )
            return int(cursor.lastrowid or 0)

        if self._reserve is not None:
            self._reserve.keep()
        try:
            seq = self.writes.run(insert, first)
        except sqlite3.IntegrityError as exc:
            raise NameTaken(name) from exc
        except sqlite3.Error as exc:
            mapped = self._mapped(exc)
            if mapped is not exc:
                raise mapped from exc
            raise
        # the committed row, without reading it back: what was inserted, through the same JSON round trip
        return VolumeRow(seq, volume_id, name, size, json.loads(spec_text), dict(mutable), created)

    def delete_volume(self, volume_id: str) -> None:
        """Missing -> NotFoundError; still attached -> FailedPreconditionError naming the nodes. As
        delete_snapshot on a full disk."""

        def delete(db: sqlite3.Connection) -> None:
            gone = db.execute(
                "DELETE FROM volumes WHERE id = ? AND NOT EXISTS "
                "(SELECT 1 FROM attachments WHERE volume_id = ?)",
                (volume_id, volume_id),
            ).rowcount
            if gone:
                return
            if db.execute("SELECT 1 FROM volumes WHERE id = ?", (volume_id,)).fetchone() is None:
                raise NotFoundError(f"volume {volume_id} not found")
            sql = "SELECT node_id FROM attachments WHERE volume_id = ?"
            raise still_published(volume_id, [r["node_id"] for r in db.execute(sql, (volume_id,))])

        self._freeing(delete, grouped=True)

    def set_size(self, volume_id: str, size: int, *, capacity_limit: int = 0) -> None:
        """Record a volume's size. With a non-zero `capacity_limit`, a size that would take the volumes
        together past it -> OutOfRangeError, and a missing volume -> NotFoundError: checked in the
        transaction that writes the size, so concurrent expands and creates (insert_volume) cannot
        overshoot the limit between a check and a write."""
        with self.tx() as db:
            if capacity_limit:
                found = db.execute("SELECT size FROM volumes WHERE id = ?", (volume_id,)).fetchone()
                if found is None:
                    raise NotFoundError(f"volume {volume_id} not found")
                room = capacity_limit - _provisioned(db)  # what the volumes together may still grow by
                if size - int(found["size"]) > room:
                    raise OutOfRangeError(
                        f"growing volume {volume_id} to {size} bytes would exceed the --capacity limit "
                        f"{capacity_limit}: {max(0, room)} more bytes fit under it"
                    )
            db.execute("UPDATE volumes SET size = ? WHERE id = ?", (size, volume_id))

    def set_mutable(self, volume_id: str, mutable: dict[str, str]) -> None:
        with self.tx() as db:
            db.execute("UPDATE volumes SET mutable = ? WHERE id = ?", (json.dumps(mutable), volume_id))

    # ---- attachments

    def attachments(self, volume_ids: Sequence[str] | None = None) -> dict[str, list[AttachmentRow]]:
        if volume_ids is None:
            rows = self._read("SELECT * FROM attachments ORDER BY node_id")
        else:
            marks = ",".join("?" * len(volume_ids))
            rows = self._read(
                f"SELECT * FROM attachments WHERE volume_id IN ({marks}) ORDER BY node_id", volume_ids
            )
        out: dict[str, list[AttachmentRow]] = {}
        for r in rows:
            out.setdefault(r["volume_id"], []).append(
                AttachmentRow(r["volume_id"], r["node_id"], bool(r["readonly"]))
            )
        return out

    def attach(self, volume_id: str, node_id: str, readonly: bool, *, multi_node: bool, limit: int) -> bool:
        """Record an attachment. True if new, False if identical one exists. Another readonly flag ->
        ValueError; attached elsewhere and not multi-node -> FailedPreconditionError; node full ->
        LimitExceededError; volume gone -> NotFoundError."""
        with self.tx() as db:
            if db.execute("SELECT 1 FROM volumes WHERE id = ?", (volume_id,)).fetchone() is None:
                raise NotFoundError(f"volume {volume_id} not found")
            rows = db.execute("SELECT * FROM attachments WHERE volume_id = ?", (volume_id,)).fetchall()
            for r in rows:
                if r["node_id"] == node_id:
                    if bool(r["readonly"]) != readonly:
                        raise ValueError("readonly differs")
                    return False
            if rows and not multi_node:
                raise FailedPreconditionError(
                    f"volume {volume_id} is published to node {rows[0]['node_id']}; its access mode "
                    "allows one node only"
                )
            count = db.execute("SELECT COUNT(*) FROM attachments WHERE node_id = ?", (node_id,)).fetchone()[0]
            if limit and count >= limit:
                raise LimitExceededError(
                    f"node {node_id} already has {count} volumes published, its limit is {limit}"
                )
            db.execute(
                "INSERT INTO attachments (volume_id, node_id, readonly) VALUES (?, ?, ?)",
                (volume_id, node_id, int(readonly)),
            )
            return True

    def detach(self, volume_id: str, node_id: str) -> None:
        """Goes through on a full disk while the space reserve lasts (deleting a volume needs it)."""
        sql = "DELETE FROM attachments WHERE volume_id = ? AND node_id = ?"
        self._freeing(lambda db: db.execute(sql, (volume_id, node_id)))

    # ---- snapshots and groups

    def snapshot(self, snapshot_id: str) -> SnapshotRow | None:
        rows = self._read("SELECT * FROM snapshots WHERE id = ?", (snapshot_id,))
        return snapshot_row(rows[0]) if rows else None

    def snapshot_by_name(self, name: str) -> SnapshotRow | None:
        rows = self._read("SELECT * FROM snapshots WHERE name = ?", (name,))
        return snapshot_row(rows[0]) if rows else None

    def snapshot_ids(self) -> set[str]:
        return {r["id"] for r in self._read("SELECT id FROM snapshots")}

    def latest_snapshot_time(self, volume_ids: Sequence[str]) -> float:
        """The newest `created` among the snapshots of `volume_ids`; 0.0 when they have none."""
        marks = ",".join("?" * len(volume_ids))
        sql = f"SELECT COALESCE(MAX(created), 0.0) AS t FROM snapshots WHERE source_volume_id IN ({marks})"
        return float(self._read(sql, volume_ids)[0]["t"])

    def snapshots(
        self, *, after_seq: int = 0, limit: int = -1, snapshot_id: str = "", source_volume_id: str = ""
    ) -> list[SnapshotRow]:
        where, args = ["seq > ?"], [after_seq]
        if snapshot_id:
            where.append("id = ?")
            args.append(snapshot_id)  # type: ignore[arg-type]
        if source_volume_id:
            where.append("source_volume_id = ?")
            args.append(source_volume_id)  # type: ignore[arg-type]
        sql = f"SELECT * FROM snapshots WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?"
        return [snapshot_row(r) for r in self._read(sql, (*args, limit))]

    def insert_snapshots(self, rows: Sequence[SnapshotRow], group: GroupRow | None = None) -> None:
        """Insert snapshots (and their group) in one transaction. A taken name -> NameTaken."""
        try:
            with self.tx() as db:
                if group is not None:
                    parameters = (
                        None if group.parameters is None else json.dumps(group.parameters, sort_keys=True)
                    )
                    db.execute(
                        "INSERT INTO groups (id, name, volume_ids, created, parameters) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (group.id, group.name, json.dumps(list(group.volume_ids)), group.created, parameters),
                    )
                db.executemany(
                    "INSERT INTO snapshots (id, name, source_volume_id, size, created, group_id) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(s.id, s.name or None, s.source_volume_id, s.size, s.created, s.group_id) for s in rows],
                )
        except sqlite3.IntegrityError as exc:
            raise NameTaken(group.name if group else rows[0].name) from exc

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Goes through on a full disk while the space reserve lasts."""
        self._freeing(lambda db: db.execute("DELETE FROM snapshots WHERE id = ?", (snapshot_id,)))

    def group(self, group_id: str) -> GroupRow | None:
        rows = self._read("SELECT * FROM groups WHERE id = ?", (group_id,))
        return group_row(rows[0]) if rows else None

    def group_by_name(self, name: str) -> GroupRow | None:
        rows = self._read("SELECT * FROM groups WHERE name = ?", (name,))
        return group_row(rows[0]) if rows else None

    def group_members(self, group_id: str) -> list[SnapshotRow]:
        return [
            snapshot_row(r)
            for r in self._read("SELECT * FROM snapshots WHERE group_id = ? ORDER BY seq", (group_id,))
        ]

    def delete_group(self, group_id: str) -> None:
        """Remove a group and its member snapshots in one transaction. As delete_snapshot on a full
        disk."""

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM snapshots WHERE group_id = ?", (group_id,))
            db.execute("DELETE FROM groups WHERE id = ?", (group_id,))

        self._freeing(delete)
