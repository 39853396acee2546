"""Group commit: concurrent callers share one durability point, and each still waits for its own.

A durable create costs three waits for the disk (the new file's fsync, its directory's, and the state
database's WAL sync); under concurrency most of them can be shared, because one sync covers every
change made before it started:

- `DirectorySync.sync()` returns once an fsync of the directory that *started after the call* has
  finished. Callers arriving while one runs wait for the next, which the first of them starts for all.
- `Transactions.run(work, FileFirst(prepare, directory, written))` runs `prepare()` (writing and
  fsyncing a new file), then syncs `directory`, calls `written()` (a crash point), then runs `work(db)`
  in a write transaction, and returns once that transaction has
  committed (the WAL synced, with synchronous=FULL): the order docs/recovery.md ("Power loss") needs.
  Calls queued while a batch runs form the next batch: their files are written one after another
  (on a journaling filesystem the first fsync commits them all, so the rest return at once), each
  directory is synced once, and their works share one transaction, each in its own savepoint. A
  failed `prepare` or `work` fails that call alone (its statements rolled back, its error raised to
  it); a failed COMMIT is raised to every call of the batch. No call returns before the commit holding
  its work; a call alone runs at once, so nobody waits for a batch to fill.

Leadership passes along the waiting callers (no thread of its own): the caller that finds nobody
committing runs the queue, then wakes the next queued caller to run what arrived meanwhile. The other
callers sleep once, instead of contending for the interpreter lock over each of their system calls.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


class FileFirst(NamedTuple):
    """What must be durable before a record is written: the file `prepare` makes (and fsyncs) and its
    name in `directory`; `written` runs once both are (the crash point between file and record)."""

    prepare: Callable[[], None]
    directory: str
    written: Callable[[], None]


class DirectorySync:
    """Shared fsyncs of one directory (new or removed names in it become durable)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._cond = threading.Condition()
        self._next = 1  # the generation the next fsync to start will have
        self._done = 0  # the newest generation finished
        self._running = False

    def sync(self) -> None:
        """Return once a directory fsync that started after this call has completed."""
        with self._cond:
            need = self._next  # an fsync started from now on covers what the caller did before
            while self._done < need:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                generation, self._next = self._next, self._next + 1
                try:
                    self._cond.release()
                    try:
                        _fsync_directory(self.directory)
                    finally:
                        self._cond.acquire()
                    self._done = generation
                finally:
                    self._running = False
                    self._cond.notify_all()


class _Syncs:
    """One DirectorySync per directory, for the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_path: dict[str, DirectorySync] = {}

    def of(self, directory: str) -> DirectorySync:
        with self._lock:
            found = self._by_path.get(directory)
            if found is None:
                found = self._by_path[directory] = DirectorySync(directory)
            return found


_SYNCS = _Syncs()


def sync_directory(directory: str) -> None:
    """DirectorySync.sync() of `directory`, shared with every caller in this process."""
    _SYNCS.of(directory).sync()


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Work(Generic[T]):
    __slots__ = ("done", "error", "first", "fn", "lead", "result")

    def __init__(self, fn: Callable[[sqlite3.Connection], T], first: FileFirst | None) -> None:
        self.fn, self.first = fn, first
        self.done = threading.Event()
        self.lead = False  # woken to commit the queue rather than with a result
        self.result: T | None = None
        self.error: BaseException | None = None


class Transactions:
    """Group-committed write transactions on one connection, guarded by `lock` (which readers of the
    connection take too, so they never see a batch before it is committed). `failed(exc)` maps an
    error of BEGIN/COMMIT to the one raised to callers (the store's disk-full message)."""

    def __init__(
        self,
        db: sqlite3.Connection,
        lock: threading.Lock,
        failed: Callable[[BaseException], BaseException],
    ) -> None:
        self._db, self._lock, self._failed = db, lock, failed
        self._queue_lock = threading.Lock()
        self._queue: list[_Work[Any]] = []
        self._committing = False

    def run(self, fn: Callable[[sqlite3.Connection], T], first: FileFirst | None = None) -> T:
        """`first` made durable, then `fn(db)` inside a committed transaction: its result once durable,
        or the error of the first step that failed."""
        work: _Work[T] = _Work(fn, first)
        with self._queue_lock:
            self._queue.append(work)
            lead = not self._committing
            self._committing = True
        while not lead:
            work.done.wait()
            if not work.lead:
                break
            work.lead, lead = False, True
            work.done.clear()
        if lead:
            self._lead()
            work.done.wait()
        if work.error is not None:
            raise work.error
        return work.result  # type: ignore[return-value]

    def _lead(self) -> None:
        """Commit the queue as one transaction, then hand leadership to the next queued caller."""
        with self._queue_lock:
            batch, self._queue = self._queue, []
        try:
            self._prepare(batch)
            self._commit([w for w in batch if w.error is None])
        except BaseException as exc:  # e.g. a ROLLBACK that failed too: nothing of the batch committed
            for work in batch:
                work.error = work.error or exc
        finally:  # whatever happened, the queue keeps moving and every caller of the batch is answered
            with self._queue_lock:
                if self._queue:
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.done.set()
                else:
                    self._committing = False
            for work in batch:
                work.done.set()

    @staticmethod
    def _prepare(batch: list[_Work[Any]]) -> None:
        """Each work's file, then each named directory once, then the crash points, before any record."""
        firsts = [(w, w.first) for w in batch if w.first is not None]
        for work, first in firsts:
            try:
                first.prepare()
            except BaseException as exc:
                work.error = exc
        for directory in dict.fromkeys(f.directory for w, f in firsts if w.error is None):
            try:
                _SYNCS.of(directory).sync()
            except BaseException as exc:
                for work, first in firsts:
                    if first.directory == directory and work.error is None:
                        work.error = exc
        for work, first in firsts:
            if work.error is None:
                first.written()

    def _commit(self, batch: list[_Work[Any]]) -> None:
        """One transaction for the batch; each work in its own savepoint when it has company."""
        if not batch:
            return
        db = self._db
        alone = len(batch) == 1
        with self._lock:
            try:
                db.execute("BEGIN IMMEDIATE")
                for work in batch:
                    self._apply(db, work, alone)
                if all(w.error is not None for w in batch):
                    db.execute("ROLLBACK")
                    return
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                failure = self._failed(exc)
                for work in batch:
                    if work.error is None:
                        work.error = failure

    @staticmethod
    def _apply(db: sqlite3.Connection, work: _Work[Any], alone: bool) -> None:
        """Run one work; its failure undoes its own statements only (its savepoint, or the transaction
        when it is alone, which _commit then rolls back)."""
        if alone:
            try:
                work.result = work.fn(db)
            except BaseException as exc:
                work.error = exc
            return
        db.execute("SAVEPOINT work")
        try:
            work.result = work.fn(db)
        except BaseException as exc:
            work.error = exc
            db.execute("ROLLBACK TO work")
        db.execute("RELEASE work")
