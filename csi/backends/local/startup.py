"""What a process does before it serves a local data dir: take the owner lock, check that the state
database can be trusted, and reconcile the files with it.

`lock_data_dir(layout, holder)` is the data dir's owner lock. The process that reconciles files against
the database (a driver serving the controller) and `recover-state` each take it, so neither can run
beside the other or beside a second reconciler, which could remove a file the first is still creating.

`check_state(layout)` runs before the backend opens `state.db`. It raises StateUnusable -- and the driver
refuses to start -- when the database is unreadable or corrupt, or when it is missing or empty while
volume or snapshot files exist (reconciliation would otherwise remove every file as an orphan). It never
changes anything in the data dir.

`reconcile(layout, store)` finishes what a crash interrupted: a backing file is written before its
record is committed, so a file without a record is left by an interrupted create -- or by a database
older than the files (restored from a copy), whose files hold volumes someone may still need. A delete
sets its file aside as `<file>.deleting` before it deletes the record (files.doomed): such a file is
removed when its record is gone, and named back when it is not. Only an orphan that holds no data
(an interrupted blank create: a sparse file) is removed; one that holds data is moved to
`<data-dir>/orphans/` (the quarantine, docs/recovery.md), never deleted. Each is logged at WARNING.
Files shorter than their record are grown: a file still at the size an expand in progress started from
(the ledger's growth intent) lost nothing; any other short file lost data, and its volume is marked
DATA_LOSS (health.py) before it is grown.

`prepare_node(layout, serve_freezes)` is the node side's start: it thaws the staged filesystems a killed
process left frozen in the middle of a group snapshot and, in the split layout, serves the controller's
freezes (freeze_service.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import urllib.parse

from csi import loop
from csi.backends.local import files, ownership
from csi.backends.local.freeze_service import FreezeServer
from csi.backends.local.health import Ledger
from csi.backends.local.layout import IMAGE_SUFFIX, SNAPSHOT_ID, VOLUME_ID, Layout
from csi.backends.local.quiesce import LocalQuiescer, thaw_staged
from csi.backends.local.state import Store
from csi.failures import FailedPreconditionError, OutOfRangeError

log = logging.getLogger("ballast.local")


class StateUnusable(FailedPreconditionError):
    """The state database cannot be trusted; the message names the recovery command."""


def lock_data_dir(layout: Layout, holder: str) -> int:
    """Take the owner lock for `holder` (a word for the message); returns the fd whose closing releases
    it (so does the process's death). Raises FailedPreconditionError, naming the holder and its pid,
    when another process has the lock. A lock file a root process creates is the data dir's owner's."""
    ownership.create_file(layout.lock_file, 0o600, layout.data_dir)
    fd = os.open(layout.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown process"
        os.close(fd)
        raise FailedPreconditionError(
            f"data dir {layout.data_dir} is in use by {owner}; stop it first, or give this process its own "
            "--data-dir"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"ballast-csi {holder} (pid {os.getpid()})\n".encode(), 0)
    return fd


def _advice(data_dir: str) -> str:
    return (
        f"no volume file was touched. Stop every driver using {data_dir}, then rebuild the state from the "
        f"files with `ballast-csi recover-state --data-dir {data_dir}` (see docs/recovery.md)"
    )


def open_read_only(db: str, timeout: float) -> sqlite3.Connection:
    """A connection that cannot write `db`, whatever characters its path holds."""
    uri = f"file://{urllib.parse.quote(os.path.abspath(db))}?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=timeout)


def check_state(layout: Layout) -> None:
    """Raise StateUnusable when the state database must not be opened as it is. Read-only. The data
    dir's files are listed only when the database is missing or has no volume table (the listing is
    reconcile's job otherwise, and a second one would cost every start a pass over every file)."""
    db, data_dir = layout.state_db, layout.data_dir

    def images() -> list[str]:
        return layout.images(layout.volumes_dir) + layout.images(layout.snapshots_dir)

    try:
        empty = os.path.getsize(db) == 0
    except FileNotFoundError:
        empty = True
    if empty:
        found = images()
        if found:
            raise StateUnusable(
                f"state database {db} is missing or empty, but the data dir holds {len(found)} volume or "
                f"snapshot file(s); refusing to start, because every one would be taken for an orphan; "
                + _advice(data_dir)
            )
        return
    try:
        con = open_read_only(db, timeout=30.0)
        try:
            verdict = [str(r[0]) for r in con.execute("PRAGMA quick_check").fetchall()]
            tables = {str(r[0]) for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise StateUnusable(f"state database {db} is unreadable ({exc}); " + _advice(data_dir)) from exc
    if verdict != ["ok"]:
        raise StateUnusable(
            f"state database {db} is corrupt ({'; '.join(verdict[:3])}); " + _advice(data_dir)
        )
    if "volumes" not in tables and (found := images()):
        raise StateUnusable(
            f"state database {db} has no volume table, but the data dir holds {len(found)} volume or "
            "snapshot file(s); " + _advice(data_dir)
        )


def reconcile(layout: Layout, store: Store) -> None:
    """Remove the files without a committed record that hold no data, quarantine the others (module
    doc); grow files shorter than their record, marking the ones that lost data. One listing of each
    directory (and of the quarantine's), one query of the volumes' sizes, one stat of each volume's
    file and one SEEK_DATA of each orphan: start-up grows with the number of volumes by that much only."""
    sizes = store.volume_sizes()
    for directory, known, pattern in (
        (layout.volumes_dir, sizes.keys(), VOLUME_ID),
        (layout.snapshots_dir, store.snapshot_ids(), SNAPSHOT_ID),
    ):
        with os.scandir(directory) as entries:
            for entry in entries:
                stem = layout.id_of(entry.name.removesuffix(files.DOOMED))
                if entry.name.endswith(IMAGE_SUFFIX + files.DOOMED) and pattern.fullmatch(stem):
                    _finish_delete(entry.path, stem in known)
                    continue
                stem = layout.id_of(entry.name)
                if not (entry.name != stem and pattern.fullmatch(stem) and stem in known):
                    _orphan(layout, entry)
    ledger = Ledger(store)
    growing = ledger.growth()
    for volume_id, recorded in sizes.items():
        path = layout.volume_file(volume_id)
        size = files.size_of(path)
        if size is not None and size < recorded:
            if growing.get(volume_id) != size:
                ledger.mark_short(volume_id, size, recorded)
            try:
                files.grow(path, recorded)
            except OutOfRangeError:  # an expand past the largest file, torn before its undo
                store.set_size(volume_id, size)
    ledger.settle()
    _report_quarantine(layout)


def _finish_delete(path: str, recorded: bool) -> None:
    """A file a delete set aside (files.doomed) when the process died: its record gone, the delete was
    acknowledged or about to be -- remove it; its record still there, the delete never happened -- give
    it its name back."""
    if recorded:
        os.rename(path, path.removesuffix(files.DOOMED))
        log.warning("named %s back: the delete that set it aside did not record itself", path)
    else:  # in the background when it holds blocks: freeing them must not hold up the first Probe
        files.discard([path])
        log.info("removing %s: its record is deleted, and the delete that set it aside died", path)


def _orphan(layout: Layout, entry: os.DirEntry[str]) -> None:
    """A file without a record: removed when it holds no data, else quarantined; logged either way.
    Anything but a regular file (a directory, a symlink) is not ours and is left alone."""
    if not entry.is_file(follow_symlinks=False):
        return
    path, db = entry.path, layout.state_db
    held = loop.backed_by(path)
    if held:  # staged on this host: moving it would hide it from the unstage that releases it
        log.warning("kept %s in place: %s has no record of it, but %s is bound to it; unstage it on the "
                    "node, then see docs/recovery.md", path, db, held[0])  # fmt: skip
        return
    if entry.name.startswith(files.PROBE_PREFIX):
        files.remove(path)
        log.warning("removed %s: a scratch file of the reflink probe, left by a crash", path)
        return
    if files.has_no_data(path):
        files.remove(path)
        log.warning("removed %s: %s has no record of it, and it holds no data (an interrupted create)",
                    path, db)  # fmt: skip
        return
    try:
        where = _quarantine(layout, path)
    except OSError as exc:
        log.warning("kept %s in place: %s has no record of it, it holds data, and it cannot be moved to "
                    "%s (%s); see docs/recovery.md", path, db, layout.orphans_dir, exc)  # fmt: skip
        return
    log.warning(
        "moved %s to %s: %s has no record of it but it holds data (an interrupted copy, or a "
        "volume the database does not know: was it restored from an older copy?); see docs/recovery.md",
        path,
        where,
        db,
    )


def _quarantine(layout: Layout, path: str) -> str:
    """Move `path` (in volumes/ or snapshots/) to the same-named subdirectory of the quarantine; returns
    its new path. Never replaces a quarantined file: a name taken by another file gets a `.<n>` suffix."""
    directory = os.path.join(layout.orphans_dir, os.path.basename(os.path.dirname(path)))
    ownership.make_dir(layout.orphans_dir, 0o700, layout.data_dir)
    ownership.make_dir(directory, 0o700, layout.data_dir)
    name, n = os.path.basename(path), 0
    while True:
        target = os.path.join(directory, f"{name}.{n}" if n else name)
        try:
            files.move_no_replace(path, target)
            return target
        except FileExistsError:
            if os.path.samefile(path, target):  # a crash cut an earlier move between its link and unlink
                files.remove(path)
                return target
        n += 1


def _report_quarantine(layout: Layout) -> None:
    """One WARNING while the quarantine holds files, so it cannot fill the disk unnoticed."""
    held = 0
    for sub in ("volumes", "snapshots"):
        with contextlib.suppress(FileNotFoundError):
            held += len(os.listdir(os.path.join(layout.orphans_dir, sub)))
    if held:
        log.warning(
            "%s holds %d file(s) without a record, kept because they hold data: move them back or "
            'delete them (docs/recovery.md, "Files without a record")',
            layout.orphans_dir,
            held,
        )


def prepare_node(layout: Layout, serve_freezes: bool) -> FreezeServer | None:
    """Thaw what a killed process left frozen; with `serve_freezes`, start the freeze service. A service
    that cannot listen is logged, not fatal: the controller then refuses group snapshots of volumes in
    use, saying the service is not answering."""
    from csi import loop
    from csi.mount import Mounter

    thaw_staged(layout.volumes_dir, Mounter(), loop)
    if not serve_freezes:
        return None
    server = FreezeServer(layout, LocalQuiescer())
    try:
        server.start()
    except OSError as exc:
        log.warning("the freeze service cannot listen at %s: %s", layout.freeze_socket, exc)
        return None
    return server
