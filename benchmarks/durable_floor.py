"""The durable floor of a local CreateVolume: the system calls that make a new volume survive a power cut,
made by a plain Python loop with no gRPC and no driver code, timed on the thread's CPU clock (user and
system time) phase by phase.

A create of the local backend has to (docs/recovery.md, "Power loss"): create the sparse file and set its
size, fsync it, fsync its directory, then commit the record (SQLite in WAL mode with synchronous=FULL:
the WAL frames written, then fdatasync). The loop makes the same calls on the same kind of table, so what
the driver spends above this floor and the grpcio floor is its own code. Like the benchmark's rounds, it
creates `count` volumes, then deletes them (the deletes are not timed), round after round in the same
directory and database, as the driver does in its data dir.

Which filesystem holds the files matters: `filesystem_facts` records its type and, for ext4, whether it
has a journal (an ext4 without one checks every recently deleted inode it passes over when it allocates a
new one, so creates after many deletes cost far more kernel CPU).
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

PHASES = ("create file", "fsync file", "fsync directory", "WAL commit")
_TABLE = """CREATE TABLE IF NOT EXISTS volumes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, name TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL, spec TEXT NOT NULL, mutable TEXT NOT NULL, created REAL NOT NULL)"""
_SIZE = 1 << 30


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(directory: Path, count: int) -> dict[str, float]:
    """CPU ms per create of each phase, and their total, over `count` durable creates in `directory`."""
    files = directory / "volumes"
    files.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(directory / "state.db", isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(_TABLE)
        spent = dict.fromkeys(PHASES, 0.0)
        for i in range(count):
            t0 = time.thread_time()
            fd = os.open(files / f"v{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.ftruncate(fd, _SIZE)
            t1 = time.thread_time()
            os.fsync(fd)
            os.close(fd)
            t2 = time.thread_time()
            _fsync_dir(files)
            t3 = time.thread_time()
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT INTO volumes (id, name, size, spec, mutable, created) VALUES (?, ?, ?, ?, ?, ?)",
                (f"v{i}", f"name-{i}", _SIZE, '{"fs_type": ""}', "{}", time.time()),
            )
            db.execute("COMMIT")
            t4 = time.thread_time()
            for phase, (a, b) in zip(PHASES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
                spent[phase] += b - a
        for i in range(count):
            os.unlink(files / f"v{i}")
        _fsync_dir(files)
        db.execute("DELETE FROM volumes")
    finally:
        db.close()
    per = {phase: round(s / count * 1000, 4) for phase, s in spent.items()}
    return {**per, "total": round(sum(spent.values()) / count * 1000, 4)}


def medians(rounds: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}


def filesystem_facts(path: Path) -> dict[str, object]:
    """The type of the filesystem holding `path` (from /proc/self/mounts) and, for ext4, whether it has a
    journal (/sys/fs/ext4/<device>/journal_task names its journal thread, or reads `<none>`)."""
    target, fs_type = "", "unknown"
    real = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        for line in mounts:
            _dev, mnt, kind, *_ = line.split()
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(target):
                target, fs_type = mnt, kind
    facts: dict[str, object] = {"type": fs_type, "mount": target}
    if fs_type == "ext4":
        st = os.stat(real)
        block = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve().name
        task = Path(f"/sys/fs/ext4/{block}/journal_task")
        if task.exists():
            facts["journal"] = task.read_text().strip() != "<none>"
    return facts
