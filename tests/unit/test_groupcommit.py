"""Group commit (csi/backends/local/groupcommit.py): shared syncs, and every caller still waits for its own.

Real SQLite in WAL mode on a temp dir; threads that arrive together. What is asserted is what the
callers can observe (results, errors, committed rows, the number of commits and directory fsyncs), never
how long anything took.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from csi.backends.local import groupcommit
from csi.backends.local.groupcommit import DirectorySync, FileFirst, Transactions


def commits(con: sqlite3.Connection) -> list[str]:
    """The COMMIT statements `con` runs from now on, as SQLite traces them."""
    seen: list[str] = []
    con.set_trace_callback(lambda sql: seen.append(sql) if sql.strip().upper() == "COMMIT" else None)
    return seen


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, threading.Lock]]:
    con = sqlite3.connect(tmp_path / "t.db", isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (name TEXT PRIMARY KEY)")
    con.execute("CREATE TABLE child (p TEXT REFERENCES t(name) DEFERRABLE INITIALLY DEFERRED)")
    yield con, threading.Lock()
    con.close()


def committed(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM t")}


def insert(name: str) -> Callable[[sqlite3.Connection], str]:
    def work(con: sqlite3.Connection) -> str:
        con.execute("INSERT INTO t (name) VALUES (?)", (name,))
        return name

    return work


class HeldCommits(Transactions):
    """Holds the first commit until `release` is set, so that later callers queue behind it."""

    def __init__(self, con: sqlite3.Connection, lock: threading.Lock) -> None:
        super().__init__(con, lock, lambda exc: exc)
        self.release = threading.Event()
        self.started = threading.Event()

    def _commit(self, batch: list[groupcommit._Work[object]]) -> None:
        self.started.set()
        self.release.wait(30)
        super()._commit(batch)


def test_a_caller_alone_commits_at_once(db: tuple[sqlite3.Connection, threading.Lock]) -> None:
    con, lock = db
    tx, done = Transactions(con, lock, lambda exc: exc), commits(con)
    assert [tx.run(insert(f"v{i}")) for i in range(5)] == [f"v{i}" for i in range(5)]
    assert len(done) == 5 and committed(con) == {f"v{i}" for i in range(5)}


def test_callers_queued_behind_a_commit_share_the_next_one(
    db: tuple[sqlite3.Connection, threading.Lock],
) -> None:
    con, lock = db
    tx, done = HeldCommits(con, lock), commits(con)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(tx.run, insert("first"))
        assert tx.started.wait(10)
        queued = [pool.submit(tx.run, insert(f"q{i}")) for i in range(8)]
        while len(tx._queue) < 8:  # all eight queued behind the held commit
            threading.Event().wait(0.01)
        assert not any(f.done() for f in queued), "a caller returned before its commit"
        tx.release.set()
        assert first.result() == "first"
        assert sorted(f.result() for f in queued) == sorted(f"q{i}" for i in range(8))
    assert len(done) == 2, "the eight queued callers did not share one commit"
    assert committed(con) == {"first", *(f"q{i}" for i in range(8))}


def test_a_failing_work_fails_alone_and_leaves_nothing(
    db: tuple[sqlite3.Connection, threading.Lock],
) -> None:
    con, lock = db
    con.execute("INSERT INTO t (name) VALUES ('taken')")
    tx = HeldCommits(con, lock)

    def half_then_fail(c: sqlite3.Connection) -> str:
        c.execute("INSERT INTO t (name) VALUES ('half')")
        c.execute("INSERT INTO t (name) VALUES ('taken')")
        return "never"

    with ThreadPoolExecutor(4) as pool:
        pool.submit(tx.run, insert("opener"))
        assert tx.started.wait(10)
        good = pool.submit(tx.run, insert("good"))
        bad = pool.submit(tx.run, half_then_fail)
        while len(tx._queue) < 2:
            threading.Event().wait(0.01)
        tx.release.set()
        assert good.result() == "good"
        with pytest.raises(sqlite3.IntegrityError):
            bad.result()
    assert committed(con) == {"taken", "opener", "good"}, "the failed work's first statement survived"


def test_a_failed_commit_fails_every_caller_of_the_batch(
    db: tuple[sqlite3.Connection, threading.Lock],
) -> None:
    con, lock = db
    tx = HeldCommits(con, lock)

    def orphan(c: sqlite3.Connection) -> str:  # a deferred foreign key: the COMMIT itself fails
        c.execute("INSERT INTO child (p) VALUES ('nobody')")
        return "orphan"

    con.execute("PRAGMA foreign_keys=ON")
    with ThreadPoolExecutor(4) as pool:
        pool.submit(tx.run, insert("opener"))
        assert tx.started.wait(10)
        fine = pool.submit(tx.run, insert("innocent"))
        broken = pool.submit(tx.run, orphan)
        while len(tx._queue) < 2:
            threading.Event().wait(0.01)
        tx.release.set()
        for future in (fine, broken):
            with pytest.raises(sqlite3.IntegrityError):
                future.result()
    assert committed(con) == {"opener"}


def test_files_are_durable_before_their_records(
    db: tuple[sqlite3.Connection, threading.Lock], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    con, lock = db
    steps: list[str] = []
    monkeypatch.setattr(groupcommit, "_fsync_directory", lambda d: steps.append(f"dir {Path(d).name}"))
    tx = Transactions(con, lock, lambda exc: exc)

    def work(c: sqlite3.Connection) -> str:
        steps.append("record")
        return insert("a")(c)

    first = FileFirst(lambda: steps.append("file"), str(tmp_path), lambda: steps.append("written"))
    assert tx.run(work, first) == "a"
    assert steps == ["file", f"dir {tmp_path.name}", "written", "record"]

    def refuse() -> None:
        raise OSError("no space")

    with pytest.raises(OSError, match="no space"):
        tx.run(insert("b"), FileFirst(refuse, str(tmp_path), lambda: steps.append("never")))
    assert "never" not in steps and committed(con) == {"a"}


def test_a_file_that_fails_in_a_batch_keeps_its_record_out_and_its_neighbours_in(
    db: tuple[sqlite3.Connection, threading.Lock], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls batched behind a held commit, one whose file cannot be written (ENOSPC): that call
    fails and its record is never committed; the other's file and record are."""
    con, lock = db
    monkeypatch.setattr(groupcommit, "_fsync_directory", lambda d: None)
    tx = HeldCommits(con, lock)
    written: list[str] = []

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def first(name: str, prepare: Callable[[], None]) -> FileFirst:
        return FileFirst(prepare, str(tmp_path), lambda: written.append(name))

    with ThreadPoolExecutor(3) as pool:
        pool.submit(tx.run, insert("opener"))
        assert tx.started.wait(10)
        good = pool.submit(tx.run, insert("good"), first("good", lambda: None))
        bad = pool.submit(tx.run, insert("bad"), first("bad", full))
        while len(tx._queue) < 2:  # both queued behind the held commit: they form one batch
            threading.Event().wait(0.01)
        tx.release.set()
        assert good.result() == "good"
        with pytest.raises(OSError, match="No space"):
            bad.result()
    assert written == ["good"]
    assert committed(con) == {"opener", "good"}, "a call whose file failed still got its record"


def test_a_failed_directory_fsync_fails_the_call_and_writes_no_record(
    db: tuple[sqlite3.Connection, threading.Lock], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new file's name may not be durable: the record must not claim it is."""
    con, lock = db

    def fsync_fails(directory: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(groupcommit, "_fsync_directory", fsync_fails)
    tx = Transactions(con, lock, lambda exc: exc)
    written: list[str] = []
    with pytest.raises(OSError, match="Input/output error"):
        tx.run(insert("a"), FileFirst(lambda: None, str(tmp_path), lambda: written.append("a")))
    assert written == [] and committed(con) == set()


def test_a_directory_sync_covers_only_what_came_before_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller arriving while an fsync runs waits for the next one; callers arriving together share it."""
    entered, release = threading.Event(), threading.Event()
    started: list[int] = []

    def fsync(directory: str) -> None:
        started.append(len(started) + 1)
        entered.set()
        release.wait(10)

    monkeypatch.setattr(groupcommit, "_fsync_directory", fsync)
    sync = DirectorySync(str(tmp_path))
    with ThreadPoolExecutor(6) as pool:
        running = pool.submit(sync.sync)
        assert entered.wait(10)
        late = [pool.submit(sync.sync) for _ in range(5)]
        threading.Event().wait(0.2)
        assert not any(f.done() for f in late), "a caller was covered by an fsync that started before it"
        release.set()
        running.result()
        for f in late:
            f.result()
    assert started == [1, 2], "the five late callers did not share one fsync"


class BrokenOnce(Transactions):
    """The first commit fails beyond what _commit handles itself (as a ROLLBACK that fails would)."""

    broken = True

    def _commit(self, batch: list[groupcommit._Work[object]]) -> None:
        if self.broken:
            self.broken = False
            raise sqlite3.OperationalError("disk I/O error")
        super()._commit(batch)


def in_thread(call: Callable[[], str]) -> str:
    """`call()` in a daemon thread; a call still blocked after 10 s fails the test (and cannot hang it)."""
    answer: list[str | BaseException] = []

    def run() -> None:
        try:
            answer.append(call())
        except BaseException as exc:
            answer.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert answer, "the call is still blocked"
    if isinstance(answer[0], BaseException):
        raise answer[0]
    return answer[0]


def test_a_commit_that_fails_outright_answers_its_caller_and_the_next_call_still_runs(
    db: tuple[sqlite3.Connection, threading.Lock],
) -> None:
    con, lock = db
    tx = BrokenOnce(con, lock, lambda exc: exc)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        in_thread(lambda: tx.run(insert("lost")))
    assert in_thread(lambda: tx.run(insert("next"))) == "next"
    assert committed(con) == {"next"}
