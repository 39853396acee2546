"""The tables of the local backend's state database (state.py). `CREATE ... IF NOT EXISTS` throughout:
run on every open, it creates what a new database lacks and leaves an existing one as it is; `upgrade`
then adds the columns (ADDED_COLUMNS) that a database made by an older driver lacks.
health.py keeps its marks (`health_marks`) and expand intents (`growth`) here too.
"""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS volumes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    spec TEXT NOT NULL,
    mutable TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS attachments (
    volume_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    readonly INTEGER NOT NULL,
    PRIMARY KEY (volume_id, node_id)
);
CREATE INDEX IF NOT EXISTS attachments_node ON attachments (node_id);
CREATE TABLE IF NOT EXISTS snapshots (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT UNIQUE,
    source_volume_id TEXT NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL,
    group_id TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS snapshots_source ON snapshots (source_volume_id);
CREATE INDEX IF NOT EXISTS snapshots_group ON snapshots (group_id);
CREATE TABLE IF NOT EXISTS groups (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL UNIQUE,
    volume_ids TEXT NOT NULL,
    created REAL NOT NULL,
    parameters TEXT
);
CREATE TABLE IF NOT EXISTS health_marks (
    volume_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    message TEXT NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (volume_id, reason)
);
CREATE TABLE IF NOT EXISTS growth (
    volume_id TEXT PRIMARY KEY,
    from_size INTEGER NOT NULL
);
"""

# (table, column, declaration) of every column added to a table after the table was first shipped. Rows
# that existed before read NULL there, which the reader must take as "not recorded".
ADDED_COLUMNS = (("groups", "parameters", "TEXT"),)


def _missing(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    have: dict[str, set[str]] = {}
    for table, _, _ in ADDED_COLUMNS:
        have.setdefault(table, {r[1] for r in db.execute(f"PRAGMA table_info({table})")})
    return [added for added in ADDED_COLUMNS if added[1] not in have[added[0]]]


def upgrade(db: sqlite3.Connection) -> None:
    """Add the ADDED_COLUMNS a database made by an older driver lacks (ALTER TABLE ... ADD COLUMN keeps
    every row). Checked again inside one write transaction, so two processes opening the file at once
    add each column once. An older driver ignores the new columns, so a downgrade keeps working."""
    if not _missing(db):
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for table, column, declaration in _missing(db):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
