"""`ballast-csi recover-state`: rebuild the local backend's state database from the files in a data dir.

`recover_state(data_dir)` rebuilds `state.db` from the backing files it finds. Whatever rows can still be
read from the old database (names, creation arguments, mutable parameters, snapshot sources, groups,
attachments, health marks, expands in progress) are kept for files that exist. A file nobody can name
gets the name `recovered-<id>`; one an intact old database has no record of is marked DATA_LOSS
(health.py: it may be a torn copy). Records whose file is gone are dropped. A file a delete cut short set
aside (`<id>.img.deleting`, files.doomed) is kept with its record unless the old database says the
record is gone; start-up then names it back. No volume or snapshot file is ever removed or modified. It
takes the data dir's owner lock, so it never runs beside a driver serving the controller from the same
data dir.

The new database is built under another name (`state.db.building`), made single-file and durable, and
renamed `state.db.new` once complete; only then is the old one (with its WAL) kept under a name nothing
else has (`state.db.broken-<UTC time>[-<n>]`, hard links: never deleted, never replacing anything) and
the new one renamed into place. So a run cut short anywhere -- killed, interrupted, out of space --
leaves `state.db` as it was, or (in the instant between the old database's removal and the rename) no
`state.db`, which the driver refuses to start on and which the next run completes from `state.db.new`.
Running it again is always right. The failpoints `recover.volume-recorded`, `recover.built` and
`recover.old-kept` (docs/recovery.md) kill it at those steps.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from csi.backends.local import files
from csi.backends.local.health import Ledger
from csi.backends.local.layout import IMAGE_SUFFIX, SNAPSHOT_ID, VOLUME_ID, Layout
from csi.backends.local.rows import GroupRow, SnapshotRow
from csi.backends.local.startup import lock_data_dir, open_read_only
from csi.backends.local.state import NameTaken, Store
from csi.failures import DriverError, FailedPreconditionError
from shim import failpoints

SIDE_FILES = ("-wal", "-shm")
TABLES = ("volumes", "snapshots", "groups", "attachments", "health_marks", "growth")
LISTS = ("attachments", "health_marks", "growth")  # rows without an id of their own


# ---------------------------------------------------------------------------- rebuild


@dataclass
class Salvage:
    """Rows still readable from the old database, by table (empty when unreadable)."""

    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    health_marks: list[dict[str, Any]] = field(default_factory=list)
    growth: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)  # tables read whole from a database that checks out

    def lacks(self, table: str, row_id: str) -> bool:
        """Whether the old database says `table` has no row `row_id` (a damaged one says nothing)."""
        return table in self.read and row_id not in getattr(self, table)


def salvage(db: str) -> Salvage:
    """Read what can be read from a (possibly corrupt) database, one table at a time."""
    out = Salvage()
    try:
        if os.stat(db).st_size == 0:
            return out
    except FileNotFoundError:
        return out  # any other OSError (EIO): the old rows may be there; stop, and rebuild nothing
    try:
        con = open_read_only(db, timeout=5.0)
    except sqlite3.Error as exc:
        out.problems.append(f"cannot open the old database: {exc}")
        return out
    con.row_factory = sqlite3.Row
    try:
        try:
            intact = [r[0] for r in con.execute("PRAGMA quick_check")] == ["ok"]
        except sqlite3.Error:
            intact = False
        for table in TABLES:
            try:
                rows = [dict(r) for r in con.execute(f"SELECT * FROM {table}")]
            except sqlite3.Error as exc:
                out.problems.append(f"table {table} unreadable: {exc}")
                continue
            if intact:
                out.read.add(table)
            if table in LISTS:
                setattr(out, table, rows)
            else:
                getattr(out, table).update({str(r["id"]): r for r in rows if r.get("id")})
    finally:
        con.close()
    return out


def _present(path: str) -> bool:
    """Whether `path` exists (as os.path.lexists), but an error other than its absence (EIO) is raised:
    a journal that cannot be looked at is not one that is not there."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _free_name(db: str, stamp: str) -> str:
    """`<db>.broken-<stamp>`, with `-2`, `-3`... while that name (or its -wal/-shm) is taken."""
    n = 1
    while True:
        name = f"{db}.broken-{stamp}" + (f"-{n}" if n > 1 else "")
        if not any(_present(name + side) for side in ("", *SIDE_FILES)):
            return name
        n += 1


def _keep(path: str, target: str) -> None:
    """Give `path` the name `target` as well (a hard link, which never replaces an entry), leaving it in
    place; a directory, which cannot be linked, is renamed (`target` was checked free under the lock)."""
    if os.path.isdir(path) and not os.path.islink(path):
        if _present(target):
            raise FileExistsError(f"{target} exists")
        os.rename(path, target)
    else:
        os.link(path, target, follow_symlinks=False)


def _replace(layout: Layout, stamp: str) -> str | None:
    """Keep the old database and its -wal/-shm under a free `broken-` name, then remove them (the main
    file first: without it the driver refuses to start) and rename the complete `state.db.new` into
    place. Returns the kept name of the old database, None when there was none."""
    db = layout.state_db
    present = [side for side in ("", *SIDE_FILES) if _present(db + side)]
    kept = _free_name(db, stamp)
    for side in present:
        _keep(db + side, kept + side)
    files.sync_dir(layout.data_dir)
    for side in present:
        files.remove(db + side)  # a stale WAL must not meet the new database
    failpoints.hit("recover.old-kept")
    os.rename(layout.rebuilt_db, db)
    files.sync_dir(layout.data_dir)
    return kept if "" in present else None


def _discard(db: str) -> None:
    """Remove a database this command was building, with its journals (never the old database)."""
    for side in ("", *SIDE_FILES, "-journal"):
        files.remove(db + side)


def _single_file(db: str) -> None:
    """Fold `db`'s WAL into it and switch it to a rollback journal, so the file alone holds every row and
    can be renamed; then make it durable. The driver turns WAL on again when it opens it."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        mode = con.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
    finally:
        con.close()
    if mode != "delete":
        raise sqlite3.OperationalError(f"{db} could not leave WAL mode (it is {mode!r})")
    fd = os.open(db, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json(value: Any, default: Any) -> Any:
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return default
    return parsed if isinstance(parsed, type(default)) else default


@dataclass
class Report:
    volumes: int = 0
    named: int = 0
    snapshots: int = 0
    sourceless: int = 0  # snapshots whose source volume the old database could no longer give
    groups: int = 0
    attachments: int = 0
    marks: int = 0
    dropped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a record was given that the operator must know
    ignored: list[str] = field(default_factory=list)
    kept_as: str | None = None
    read_from: str = ""
    problems: list[str] = field(default_factory=list)


def recover_state(data_dir: str, now: Callable[[], float] = time.time) -> Report:
    """Rebuild `<data_dir>/state.db` from the files in volumes/ and snapshots/ (see the module doc).
    Refuses (FailedPreconditionError) while a driver holds the data dir."""
    layout = Layout(data_dir)
    if not os.path.isdir(layout.volumes_dir):
        raise FailedPreconditionError(
            f"{layout.volumes_dir} does not exist; is {data_dir} a Ballast data dir?"
        )
    owner = lock_data_dir(layout, "recover-state")
    try:
        return _rebuild(layout, now)
    finally:
        os.close(owner)


def _rebuild(layout: Layout, now: Callable[[], float]) -> Report:
    _discard(layout.building_db)  # what a run killed while building left; ours, never the old database
    # no state.db but a complete state.db.new: a run was cut between removing the old database and
    # renaming its new one into place, and the rows to keep are in the new one (else none are left)
    cut = not _present(layout.state_db) and _present(layout.rebuilt_db)
    source = layout.rebuilt_db if cut else layout.state_db
    old = salvage(source)
    report = Report(read_from=source, problems=list(old.problems))
    try:
        _build(layout, old, report)
        _single_file(layout.building_db)
    except BaseException:
        _discard(layout.building_db)
        raise
    os.rename(layout.building_db, layout.rebuilt_db)  # replaces only a stale one of our own
    files.sync_dir(layout.data_dir)
    failpoints.hit("recover.built")
    report.kept_as = _replace(layout, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now())))
    return report


def _build(layout: Layout, old: Salvage, report: Report) -> None:
    """Fill a new database at `layout.building_db` from the files and what `old` still knows."""
    store = Store(layout.building_db)
    try:
        vol_ids = _recover_volumes(store, layout.volumes_dir, old, report, VOLUME_ID.fullmatch)
        snap_ids = _recover_snapshots(store, layout.snapshots_dir, old, report, SNAPSHOT_ID.fullmatch)
        for a in old.attachments:
            if a.get("volume_id") in vol_ids:
                store.attach(
                    str(a["volume_id"]), str(a["node_id"]), bool(a["readonly"]), multi_node=True, limit=0
                )
                report.attachments += 1
        report.marks = Ledger(store).carry(
            [(m["volume_id"], m["reason"], m["message"], m["since"]) for m in old.health_marks],
            {g["volume_id"]: g["from_size"] for g in old.growth},
            vol_ids,
        )
        report.dropped += sorted(f"volume {v}" for v in set(old.volumes) - vol_ids)
        report.dropped += sorted(f"snapshot {s}" for s in set(old.snapshots) - snap_ids)
    finally:
        store.close()


def _images(
    directory: str, old: Salvage, report: Report, valid: Callable[[str], object]
) -> list[tuple[str, str]]:
    """(id, file name) of the image files in `directory` with an id we issue (the others: `ignored`), and
    of the files a delete cut short set aside (`<id>.img.deleting`: `notes`) unless the old database says
    the record is gone (the delete was acknowledged: start-up removes the file). Otherwise the delete
    never happened and start-up names it back (startup.reconcile): its record stays, attachments and all."""
    kind = os.path.basename(directory)  # "volumes" or "snapshots", as the tables
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    found = {Layout.id_of(n): n for n in names if n.endswith(IMAGE_SUFFIX)}
    aside = [
        (Layout.id_of(n.removesuffix(files.DOOMED)), n)
        for n in names
        if n.endswith(IMAGE_SUFFIX + files.DOOMED)
    ]
    for rid, n in aside:
        if rid not in found and valid(rid) and not old.lacks(kind, rid):
            found[rid] = n
            report.notes.append(f"kept {kind[:-1]} {rid}: a delete cut short set its file aside; the next "
                                "start names it back")  # fmt: skip
    report.ignored += [os.path.join(directory, n) for i, n in sorted(found.items()) if not valid(i)]
    return [(i, n) for i, n in sorted(found.items()) if valid(i)]


def _recover_volumes(
    store: Store, directory: str, old: Salvage, report: Report, valid: Callable[[str], object]
) -> set[str]:
    done: set[str] = set()
    for vid, entry in _images(directory, old, report, valid):
        st = os.stat(os.path.join(directory, entry))
        row = old.volumes.get(vid, {})
        size = max(int(row.get("size") or 0), st.st_size)
        spec = _json(row.get("spec"), {}) or {
            "size": size,
            "parameters": {},
            "context": {},
            "mutable": {},
            "source": None,
            "multi_node": False,
        }
        mutable = _json(row.get("mutable"), {})
        created = float(row.get("created") or st.st_mtime)
        name = str(row.get("name") or "")
        try:
            store.insert_volume(vid, name or f"recovered-{vid}", size, spec, mutable, created)
        except NameTaken:
            store.insert_volume(vid, f"recovered-{vid}", size, spec, mutable, created)
            name = ""
        report.volumes += 1
        report.named += bool(name)
        if old.lacks("volumes", vid):  # a copy cut short is such a file too: it may be torn
            report.notes.append(f"marked volume {vid} DATA_LOSS: {Ledger(store).mark_unrecorded(vid)}")
        done.add(vid)
        failpoints.hit("recover.volume-recorded")
    return done


def _recover_snapshots(
    store: Store, directory: str, old: Salvage, report: Report, valid: Callable[[str], object]
) -> set[str]:
    rows: dict[str, SnapshotRow] = {}
    for sid, entry in _images(directory, old, report, valid):
        st = os.stat(os.path.join(directory, entry))
        r = old.snapshots.get(sid, {})
        rows[sid] = SnapshotRow(
            0,
            sid,
            str(r.get("name") or ""),
            str(r.get("source_volume_id") or ""),
            max(int(r.get("size") or 0), st.st_size),
            float(r.get("created") or st.st_mtime),
            str(r.get("group_id") or ""),
        )
    report.sourceless = sum(not s.source_volume_id for s in rows.values())
    grouped = {s.id for s in rows.values() if s.group_id in old.groups}
    for gid, g in old.groups.items():
        members = [s for s in rows.values() if s.group_id == gid]
        if members:
            # parameters: never empty when recorded (consistency); None for a group that predates them
            volume_ids, parameters = (
                tuple(_json(g.get("volume_ids"), [])),
                _json(g.get("parameters"), {}) or None,
            )
            group = GroupRow(gid, str(g["name"]), volume_ids, float(g["created"]), parameters)
            store.insert_snapshots(members, group)
            report.groups += 1
            report.snapshots += len(members)
    for snap in rows.values():
        if snap.id in grouped:
            continue
        try:
            store.insert_snapshots([snap._replace(group_id="")])
        except NameTaken:
            store.insert_snapshots([snap._replace(group_id="", name="")])
        report.snapshots += 1
    return set(rows)


_UNFINISHED = "the old database was not replaced and no file was touched; run recover-state again"


def run_recover(data_dir: str, out: TextIO = sys.stdout) -> int:
    """`ballast-csi recover-state`: rebuild, print what happened; 0 on success, 1 with a message (nothing
    is lost then, and a run once the cause is fixed completes the rebuild: see the module doc)."""
    try:
        r = recover_state(data_dir)
    except (OSError, sqlite3.Error, DriverError) as exc:
        print(f"ballast-csi recover-state: {exc}; {_UNFINISHED}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ballast-csi recover-state: interrupted; {_UNFINISHED}", file=sys.stderr)
        return 1
    db = Layout(data_dir).state_db
    print(
        f"rebuilt {db}: {r.volumes} volume(s) ({r.named} with their "
        f"original names), {r.snapshots} snapshot(s), {r.groups} group snapshot(s), "
        f"{r.attachments} attachment(s)",
        file=out,
    )
    if r.sourceless:
        print(
            f"{r.sourceless} snapshot(s) whose source volume is unknown: they restore as before, but list "
            "without a source_volume_id and GetMetadataDelta refuses them",
            file=out,
        )
    if r.marks:
        print(f"kept {r.marks} health mark(s): `ballast-csi clear-health` clears one once checked", file=out)
    if r.read_from != db:
        print(f"completed an interrupted run: the old rows were read from {r.read_from}", file=out)
    if r.kept_as:
        print(f"the old database is kept as {r.kept_as}", file=out)
    for line in r.problems:
        print(f"old database: {line}", file=out)
    for item in r.dropped:
        print(f"dropped {item}: its file is gone", file=out)
    for line in r.notes:
        print(line, file=out)
    for path in r.ignored:
        print(f"ignored {path}: not a file name this driver issues", file=out)
    return 0
