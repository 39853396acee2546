"""`ballast-csi recover-state`: rebuild the local backend's state database from the files in a data dir.

`recover_state(data_dir)` rebuilds `state.db` from the backing files it finds. The old database (and its
WAL) is renamed aside, never deleted; whatever rows can still be read from it (names, creation
arguments, mutable parameters, snapshot sources, groups, attachments) are kept for files that exist.
A file nobody can name gets the name `recovered-<id>`. Records whose file is gone are dropped. No
volume or snapshot file is ever removed or modified. It takes the data dir's owner lock, so it never
runs beside a driver serving the controller from the same data dir.
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

from csi.backends.local.layout import SNAPSHOT_ID, VOLUME_ID, Layout
from csi.backends.local.startup import lock_data_dir, open_read_only
from csi.backends.local.state import GroupRow, NameTaken, SnapshotRow, Store
from csi.failures import FailedPreconditionError

SIDE_FILES = ("-wal", "-shm")
TABLES = ("volumes", "snapshots", "groups", "attachments")


# ---------------------------------------------------------------------------- rebuild


@dataclass
class Salvage:
    """Rows still readable from the old database, by table (empty when unreadable)."""

    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def salvage(db: str) -> Salvage:
    """Read what can be read from a (possibly corrupt) database, one table at a time."""
    out = Salvage()
    if not os.path.exists(db) or os.path.getsize(db) == 0:
        return out
    try:
        con = open_read_only(db, timeout=5.0)
    except sqlite3.Error as exc:
        out.problems.append(f"cannot open the old database: {exc}")
        return out
    con.row_factory = sqlite3.Row
    try:
        for table in TABLES:
            try:
                rows = [dict(r) for r in con.execute(f"SELECT * FROM {table}")]
            except sqlite3.Error as exc:
                out.problems.append(f"table {table} unreadable: {exc}")
                continue
            if table == "attachments":
                out.attachments = rows
            else:
                getattr(out, table).update({str(r["id"]): r for r in rows if r.get("id")})
    finally:
        con.close()
    return out


def _move_aside(db: str, stamp: str) -> str | None:
    """Rename the database and its WAL/SHM files to `<db>.broken-<stamp>`; returns the new name."""
    if not os.path.exists(db):
        for side in SIDE_FILES:  # a WAL without its database is useless to SQLite; keep it anyway
            if os.path.exists(db + side):
                os.rename(db + side, f"{db}.broken-{stamp}{side}")
        return None
    target = f"{db}.broken-{stamp}"
    os.rename(db, target)
    for side in SIDE_FILES:
        if os.path.exists(db + side):
            os.rename(db + side, target + side)
    return target


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
    groups: int = 0
    attachments: int = 0
    dropped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    kept_as: str | None = None
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
    old = salvage(layout.state_db)
    report = Report(problems=list(old.problems))
    report.kept_as = _move_aside(layout.state_db, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now())))
    store = Store(layout.state_db)
    try:
        vol_ids = _recover_volumes(store, layout.volumes_dir, old, report, VOLUME_ID.fullmatch)
        snap_ids = _recover_snapshots(store, layout.snapshots_dir, old, report, SNAPSHOT_ID.fullmatch)
        for a in old.attachments:
            if a.get("volume_id") in vol_ids:
                store.attach(
                    str(a["volume_id"]),
                    str(a["node_id"]),
                    bool(a["readonly"]),
                    multi_node=True,
                    limit=0,
                )
                report.attachments += 1
        report.dropped += sorted(f"volume {v}" for v in set(old.volumes) - vol_ids)
        report.dropped += sorted(f"snapshot {s}" for s in set(old.snapshots) - snap_ids)
    finally:
        store.close()
    return report


def _recover_volumes(
    store: Store, directory: str, old: Salvage, report: Report, valid: Callable[[str], object]
) -> set[str]:
    done: set[str] = set()
    for entry in Layout.images(directory):
        vid = Layout.id_of(entry)
        if not valid(vid):
            report.ignored.append(os.path.join(directory, entry))
            continue
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
        done.add(vid)
    return done


def _recover_snapshots(
    store: Store, directory: str, old: Salvage, report: Report, valid: Callable[[str], object]
) -> set[str]:
    rows: dict[str, SnapshotRow] = {}
    for entry in Layout.images(directory):
        sid = Layout.id_of(entry)
        if not valid(sid):
            report.ignored.append(os.path.join(directory, entry))
            continue
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
    grouped = {s.id for s in rows.values() if s.group_id in old.groups}
    for gid, g in old.groups.items():
        members = [s for s in rows.values() if s.group_id == gid]
        if members:
            group = GroupRow(gid, str(g["name"]), tuple(_json(g.get("volume_ids"), [])), float(g["created"]))
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


def run_recover(data_dir: str, out: TextIO = sys.stdout) -> int:
    """`ballast-csi recover-state`: rebuild, print what happened; 0 on success, 1 with a message."""
    try:
        r = recover_state(data_dir)
    except (OSError, sqlite3.Error, FailedPreconditionError) as exc:
        print(f"ballast-csi recover-state: {exc}", file=sys.stderr)
        return 1
    print(
        f"rebuilt {Layout(data_dir).state_db}: {r.volumes} volume(s) ({r.named} with their "
        f"original names), {r.snapshots} snapshot(s), {r.groups} group snapshot(s), "
        f"{r.attachments} attachment(s)",
        file=out,
    )
    if r.kept_as:
        print(f"the old database is kept as {r.kept_as}", file=out)
    for line in r.problems:
        print(f"old database: {line}", file=out)
    for item in r.dropped:
        print(f"dropped {item}: its file is gone", file=out)
    for path in r.ignored:
        print(f"ignored {path}: not a file name this driver issues", file=out)
    return 0
