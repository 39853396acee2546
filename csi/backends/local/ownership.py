"""Who owns what a root driver process creates in a data dir: the owner of the directory it is made in.

In the chart's split layout the controller runs as a non-root user and the node plugin as root, on one
data dir that belongs to the controller's user. An init container hands the data dir to that user when
the controller's pod starts, but not when the container restarts, and the node plugin may create the
subdirectories and the state database after it ran. So whatever a root process creates in the data dir
-- volumes/ and snapshots/, state.db, owner.lock, freeze.sock, backing files -- is handed to the data
dir's owner (uid and gid) as it is created, before anything else relies on it: whichever process
starts first, the other can open everything. SQLite, running as root, gives the database's -wal, -shm
and journal files the database file's owner itself (tests/unit/test_ownership.py checks it).

A process that is not root never chowns: it cannot give files away, and what it creates is its own.
Only what a call creates is handed over; an entry that already exists keeps its owner.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("ballast.local")


def hand_over(entry: str | int, directory: str) -> None:
    """When this process is root (euid 0): give `entry` -- a path (a symlink itself, never what it points
    to) or an open file descriptor -- the uid and gid that own `directory` ("" is the current one).
    Not root: nothing.

    For entries this process has just created. Best effort: a failure (a filesystem that squashes
    root, an owner outside this user namespace) is logged, not raised -- the entry then stays root's,
    as it did before, and a non-root process may be refused it."""
    if os.geteuid() != 0:
        return
    try:
        owner = os.stat(directory or ".")
        if owner.st_uid == 0 and owner.st_gid == os.getegid():
            return  # what root creates there is root's already: the usual single-user data dir
        if isinstance(entry, int):
            os.chown(entry, owner.st_uid, owner.st_gid)
        else:
            os.chown(entry, owner.st_uid, owner.st_gid, follow_symlinks=False)
    except OSError as exc:
        log.warning(
            "could not give %s the owner of %s: %s; a driver running as that user may be refused it",
            entry if isinstance(entry, str) else f"file descriptor {entry}",
            directory,
            exc,
        )


def create_file(path: str, mode: int, directory: str) -> None:
    """As root: create `path` as an empty file (`mode`, less the umask) handed to `directory`'s owner,
    unless something already exists there (then nothing changes). Not root: nothing -- the caller's own
    open creates the file, exactly as it did before. For files another library creates on open (SQLite)
    or that are opened with O_CREAT but not O_EXCL (the owner lock)."""
    if os.geteuid() != 0:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        return
    try:
        hand_over(fd, directory)
    finally:
        os.close(fd)


def make_dir(path: str, mode: int, directory: str) -> None:
    """`os.makedirs(path, mode, exist_ok=True)` for a path whose parent exists: create the directory
    `path` unless it exists (a non-directory there -> FileExistsError, as makedirs), and hand one this
    call created to `directory`'s owner."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    hand_over(path, directory)
