"""ownership.py: what a root process creates in a data dir is the data dir owner's; a process that is not
root never chowns. The root cases chown for real (to nobody), so they need root; the others fake the
process's euid and refuse every chown."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from csi.backends.base import DiskOptions
from csi.backends.local import LocalBackend, files, ownership
from csi.backends.local.freeze_service import FreezeServer
from csi.backends.local.layout import Layout
from csi.backends.local.quiesce import LocalQuiescer
from csi.backends.local.startup import lock_data_dir
from csi.backends.local.state import Store
from tests.conftest import require_root

NOBODY = 65534
MiB = 1024**2


def owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


@pytest.fixture
def nobodys(tmp_path: Path) -> Path:
    """As root: a data dir that belongs to nobody:nogroup."""
    require_root()
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    return data


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    """Closes what a test opened (stores, locks, sockets), even when it fails."""
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """This process seen as uid 1000; every chown is recorded (and refused, as it would be)."""
    chowns: list[Any] = []

    def chown(*args: Any, **kwargs: Any) -> None:
        chowns.append(args)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "chown", chown)
    return chowns


# ---------------------------------------------------------------------------- the helpers, as root


def _path(data: Path, stack: ExitStack) -> Path:
    (data / "f").write_bytes(b"")
    ownership.hand_over(str(data / "f"), str(data))
    return data / "f"


def _fd(data: Path, stack: ExitStack) -> Path:
    fd = os.open(data / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    stack.callback(os.close, fd)
    ownership.hand_over(fd, str(data))
    return data / "f"


def _symlink(data: Path, stack: ExitStack) -> Path:
    (data / "target").write_bytes(b"")
    (data / "link").symlink_to(data / "target")
    ownership.hand_over(str(data / "link"), str(data))
    assert owner(data / "target") == (0, 0), "the symlink's target was chowned"
    return data / "link"


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_path, id="a-path"),
        pytest.param(_fd, id="an-open-file-descriptor"),
        pytest.param(_symlink, id="a-symlink-itself-not-its-target"),
    ],
)
def test_hand_over_gives_the_owner_of_the_directory(
    nobodys: Path, closing: ExitStack, make: Callable[[Path, ExitStack], Path]
) -> None:
    assert owner(make(nobodys, closing)) == (NOBODY, NOBODY)


def test_create_file_makes_a_file_of_the_directory_owner_and_leaves_an_existing_one(nobodys: Path) -> None:
    ownership.create_file(str(nobodys / "new"), 0o600, str(nobodys))
    assert owner(nobodys / "new") == (NOBODY, NOBODY)
    assert (os.stat(nobodys / "new").st_mode & 0o777, (nobodys / "new").read_bytes()) == (0o600, b"")
    (nobodys / "old").write_bytes(b"kept")
    ownership.create_file(str(nobodys / "old"), 0o600, str(nobodys))
    assert (owner(nobodys / "old"), (nobodys / "old").read_bytes()) == ((0, 0), b"kept")


def test_make_dir_hands_over_only_a_directory_it_makes(nobodys: Path) -> None:
    ownership.make_dir(str(nobodys / "new"), 0o700, str(nobodys))
    assert owner(nobodys / "new") == (NOBODY, NOBODY)
    (nobodys / "old").mkdir()
    ownership.make_dir(str(nobodys / "old"), 0o700, str(nobodys))
    assert owner(nobodys / "old") == (0, 0)
    (nobodys / "file").write_bytes(b"")
    with pytest.raises(FileExistsError):
        ownership.make_dir(str(nobodys / "file"), 0o700, str(nobodys))


# ---------------------------------------------------------------------------- every entry of a data dir


def _subdirectories(layout: Layout, stack: ExitStack) -> list[str]:
    layout.create()
    return ["volumes", "snapshots"]


def _state_db(layout: Layout, stack: ExitStack) -> list[str]:
    stack.callback(Store(layout.state_db).close)  # WAL: -wal and -shm exist while it is open
    return ["state.db", "state.db-wal", "state.db-shm"]  # the side files: SQLite's own doing, as root


def _owner_lock(layout: Layout, stack: ExitStack) -> list[str]:
    stack.callback(os.close, lock_data_dir(layout, "test"))
    return ["owner.lock"]


def _freeze_socket(layout: Layout, stack: ExitStack) -> list[str]:
    server = FreezeServer(layout, LocalQuiescer())
    server.start()
    stack.callback(server.close)
    return ["freeze.sock"]


def _images(layout: Layout, stack: ExitStack) -> list[str]:
    layout.create()
    files.create_sparse(layout.volume_file("lv-" + "0" * 32), MiB)
    files.copy(layout.volume_file("lv-" + "0" * 32), layout.snapshot_file("ls-" + "0" * 32))
    return [f"volumes/lv-{'0' * 32}.img", f"snapshots/ls-{'0' * 32}.img"]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_subdirectories, id="volumes-and-snapshots-dirs"),
        pytest.param(_state_db, id="state-db-with-its-wal-and-shm"),
        pytest.param(_owner_lock, id="owner-lock"),
        pytest.param(_freeze_socket, id="freeze-socket"),
        pytest.param(_images, id="sparse-volume-and-copied-snapshot-files"),
    ],
)
def test_what_a_root_process_creates_is_the_data_dir_owners(
    nobodys: Path, closing: ExitStack, make: Callable[[Layout, ExitStack], list[str]]
) -> None:
    made = make(Layout(str(nobodys)), closing)
    assert {name: owner(nobodys / name) for name in made} == dict.fromkeys(made, (NOBODY, NOBODY))


# ---------------------------------------------------------------------------- not root, or chown refused


def _hand_over(data: Path) -> None:
    (data / "f").write_bytes(b"")
    ownership.hand_over(str(data / "f"), str(data))


def _create_file(data: Path) -> None:
    ownership.create_file(str(data / "f"), 0o600, str(data))
    assert not (data / "f").exists(), "the caller's own open creates it"


def _make_dir(data: Path) -> None:
    ownership.make_dir(str(data / "d"), 0o700, str(data))
    assert (data / "d").is_dir()


def _a_backend(data: Path) -> None:
    backend = LocalBackend.open(str(data / "data"))
    try:
        disk = backend.create_volume("v", DiskOptions(size_bytes=MiB))
        backend.create_snapshot("s", disk.id, {})
    finally:
        backend.close()


@pytest.mark.parametrize(
    "act",
    [
        pytest.param(_hand_over, id="hand-over"),
        pytest.param(_create_file, id="create-file-creates-nothing"),
        pytest.param(_make_dir, id="make-dir-still-makes-the-dir"),
        pytest.param(_a_backend, id="opening-a-backend-and-creating-volumes-and-snapshots"),
    ],
)
def test_a_process_that_is_not_root_never_chowns(
    tmp_path: Path, not_root: list[Any], act: Callable[[Path], None]
) -> None:
    act(tmp_path)
    assert not_root == []


def test_a_refused_chown_is_logged_not_raised(
    tmp_path: Path, not_root: list[Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    data = tmp_path / "data"
    data.mkdir()
    os.lchown(data, NOBODY, NOBODY)  # not root's, so the entry must be given away
    (data / "f").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="ballast.local"):
        ownership.hand_over(str(data / "f"), str(data))
    assert len(not_root) == 1
    assert f"could not give {data / 'f'} the owner of {data}" in caplog.text


def test_root_in_a_directory_of_its_own_makes_no_chown(
    tmp_path: Path, not_root: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual single-user data dir: what root creates is root's already, so no system call is spent."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "getegid", lambda: os.stat(tmp_path).st_gid)
    (tmp_path / "f").write_bytes(b"")
    ownership.hand_over(str(tmp_path / "f"), str(tmp_path))
    assert not_root == []
