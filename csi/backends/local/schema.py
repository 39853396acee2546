"""The tables of the local backend's state database (state.py). `CREATE ... IF NOT EXISTS` throughout:
run on every open, it creates what a new database lacks and leaves an existing one as it is.
health.py keeps its marks (`health_marks`) and expand intents (`growth`) here too.
"""

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
    created REAL NOT NULL
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
