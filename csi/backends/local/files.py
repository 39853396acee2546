"""File operations of the local backend: sparse volume files, block-sharing copies, growth, free space.

Copies try a reflink (ioctl FICLONE: instant and atomic, shares unchanged blocks) and fall back to a
sparse-aware copy that walks data extents with SEEK_DATA/SEEK_HOLE, so holes stay holes. The fallback
reads the source piece by piece: it is point-in-time only while nothing writes the source, which the
caller arranges through `copy`'s `held`.

Durability (docs/recovery.md, "Power loss"): a new file is fsynced, then its directory, before the
function returns, so the caller commits its record only over a file that survives a power cut; a grown
file is fsynced before `grow` returns. Concurrent creators share directory fsyncs (groupcommit.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from csi.backends.local import ownership
from csi.backends.local.groupcommit import sync_directory
from csi.backends.local.reaper import REAPER
from csi.failures import OutOfCapacityError, OutOfRangeError

FICLONE = 0x40049409  # _IOW(0x94, 9, int)
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}
CHUNK = 8 * 1024 * 1024
PROBE_PREFIX = ".reflink-probe-"  # can_reflink's scratch files: start-up removes any a crash leaves


def _no_space(exc: BaseException, path: str) -> OutOfCapacityError | OutOfRangeError | None:
    """ENOSPC/EDQUOT while writing `path` -> the backend error naming the filesystem to free;
    EFBIG (a size past the filesystem's largest file) -> OutOfRangeError."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutOfCapacityError(
            f"no space left on the filesystem holding {os.path.dirname(path)} ({exc.strerror}); "
            "free space there and retry"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return OutOfRangeError(
            f"the requested size is larger than the filesystem holding {os.path.dirname(path)} allows "
            "for one file"
        )
    return None


def sync_dir(directory: str) -> None:
    """Make the names created or removed in `directory` before this call durable: returns once an fsync
    of it that started after the call has finished. Concurrent callers share fsyncs (groupcommit.py)."""
    sync_directory(directory)


def create_sparse(path: str, size: int, *, sync_parent: bool = True) -> None:
    """A new file of `size` bytes with no data blocks, durable (file, then directory) on return; without
    `sync_parent` only the file is synced, and the caller syncs the directory before relying on it.
    Refuses to overwrite (FileExistsError). No space for it -> OutOfCapacityError, and no file is left.
    Made by root, the file is its directory's owner's (ownership.py)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            ownership.hand_over(fd, os.path.dirname(path))
            os.ftruncate(fd, size)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            remove(path)
            raise
    except OSError as exc:
        full = _no_space(exc, path)
        if full is None:
            raise
        raise full from exc
    os.close(fd)
    if sync_parent:
        sync_dir(os.path.dirname(path))


def _reflink(src_fd: int, dst_fd: int) -> bool:
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in _NO_REFLINK:
            return False
        raise
    return True


def _sparse_copy(src_fd: int, dst_fd: int, length: int) -> None:
    pos = 0
    while pos < length:
        try:
            start = os.lseek(src_fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole remains
                break
            raise
        end = os.lseek(src_fd, start, os.SEEK_HOLE)
        offset = start
        while offset < end:
            n = os.copy_file_range(src_fd, dst_fd, min(CHUNK, end - offset), offset, offset)
            if n == 0:
                break
            offset += n
        pos = end


def copy(
    src: str,
    dst: str,
    size: int | None = None,
    *,
    held: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> bool:
    """Point-in-time copy of `src` into the new file `dst`, then grown to `size` if larger.

    A reflink is one atomic step. Where the filesystem cannot reflink, the data is copied piece by
    piece inside `held()` (entered for that copy alone, never around a reflink): the caller's hold on
    the writers of `src`, which is what makes that copy point-in-time; anything it raises fails the
    copy. Returns True when the copy shares blocks (reflink). `dst` is durable (file, then directory)
    on return. Refuses to overwrite `dst`; on failure `dst` is removed. A missing `src` raises
    FileNotFoundError; no space -> OutOfCapacityError, before `held()` when the source's data already
    exceeds the free space; a size the filesystem cannot hold, or a `src` longer than `size` ->
    OutOfRangeError. Made by root, `dst` is its directory's owner's (ownership.py).
    """
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return copy_open(src_fd, src, dst, size, held=held)
    finally:
        os.close(src_fd)


def copy_open(
    src_fd: int,
    src: str,
    dst: str,
    size: int | None = None,
    *,
    held: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> bool:
    """`copy` from the file open at `src_fd` (named `src` in errors), which the caller closes: the file
    stays readable after it is renamed or unlinked."""
    dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        ownership.hand_over(dst_fd, os.path.dirname(dst))
        length = os.fstat(src_fd).st_size
        if size is not None and length > size:  # never a file bigger than its record says
            raise OutOfRangeError(f"{src} is {length} bytes, larger than the {size} asked for")
        shared = _reflink(src_fd, dst_fd)
        if not shared:
            _room_for(src_fd, dst)
            os.ftruncate(dst_fd, length)
            with held():
                _sparse_copy(src_fd, dst_fd, length)
        if size is not None and size > length:
            os.ftruncate(dst_fd, size)
        os.fsync(dst_fd)
    except BaseException as exc:
        os.close(dst_fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        full = _no_space(exc, dst)
        if full is not None:
            raise full from exc
        raise
    os.close(dst_fd)
    sync_dir(os.path.dirname(dst))
    return shared


def _room_for(src_fd: int, dst: str) -> None:
    """A piece-by-piece copy writes every data block of the source: more of them than the free space ->
    OutOfCapacityError at once, so a copy that cannot finish never holds the source's writers. Free as
    for every capacity check here: what unprivileged writers may use (root's reserve is the host's)."""
    needed = os.fstat(src_fd).st_blocks * 512
    _fits(needed, space(os.path.dirname(dst), needed).free, os.path.dirname(dst))


def check_room(sources: Sequence[str], directory: str) -> None:
    """Copies of `sources` into `directory` all made piece by piece need the data of all of them free
    there: more -> OutOfCapacityError, unless the filesystem reflinks (copies then share blocks). For a
    group, whose members are held together before any is copied (the single copy checks itself)."""
    needed = 0
    for source in sources:
        with contextlib.suppress(FileNotFoundError):  # the copy itself says what is missing
            needed += os.stat(source).st_blocks * 512
    free = space(directory, needed).free
    if needed > free and not can_reflink(directory):
        _fits(needed, free, directory)


def _fits(needed: int, free: int, directory: str) -> None:
    if needed > free:
        raise OutOfCapacityError(
            f"the copy needs {needed} bytes (the data of its source), but the filesystem holding "
            f"{directory} has {free} bytes free; free space there (delete unused snapshots or volumes) "
            "and retry"
        )


def grow(path: str, size: int) -> None:
    """Extend `path` to `size` bytes (never shrinks), durable (fsynced) on return. A missing file raises
    FileNotFoundError; a size the filesystem cannot hold raises OutOfRangeError (the file is unchanged)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
            os.fsync(fd)
    except OSError as exc:
        mapped = _no_space(exc, path)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        os.close(fd)


def remove(path: str) -> None:
    """Delete `path`; already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


DOOMED = ".deleting"  # the name suffix of a file whose record a delete is removing


@contextlib.contextmanager
def doomed(paths: Sequence[str]) -> Iterator[None]:
    """Delete the files `paths` along with the records the block deletes: each is renamed
    `<path>.deleting` first, named back when the block raises, and once it returns removed: by the
    background remover (reaper.py) when it holds blocks, so the caller does not wait while they are
    freed, else at once. After a
    crash, start-up reconciliation finishes what it finds: a `.deleting` file whose record is gone is
    removed, one whose record is still there gets its name back. So a crash between a delete's record
    and its file does not leave the deleted data behind as an orphan. The renames that set files aside
    are not synced: after a power loss a file may be back under its own name without a record, and is
    quarantined. Naming them back is synced (their directory) before the block's error goes on."""
    moved = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, path + DOOMED)
            moved.append(path)
    try:
        yield
    except BaseException:
        for path in moved:
            os.rename(path + DOOMED, path)
        for directory in sorted({os.path.dirname(path) for path in moved}):
            sync_dir(directory)  # the record stays, and its file keeps its name through a power loss
        raise
    discard([path + DOOMED for path in moved])


def discard(paths: Sequence[str]) -> None:
    """Remove files nothing may use again without waiting for their blocks to be freed: one holding
    blocks is handed to the background remover (reaper.py), one holding none is removed at once (the
    unlink is cheaper than the hand-over). Already gone is fine."""
    slow = []
    for path in paths:
        if _allocated(path):
            slow.append(path)
        else:
            remove(path)
    REAPER.put(slow)


def _allocated(path: str) -> bool:
    """Whether `path` holds any block (a volume never written holds none)."""
    try:
        return os.stat(path).st_blocks > 0
    except FileNotFoundError:
        return False


def move_no_replace(src: str, dst: str) -> None:
    """Give the file `src` the name `dst` instead, never replacing an entry there (FileExistsError, and
    nothing changes): a hard link, made durable, then the old name removed. A crash in between leaves
    both names on the one file. Both must be on one filesystem (else OSError EXDEV, nothing changes)."""
    os.link(src, dst, follow_symlinks=False)
    sync_dir(os.path.dirname(dst))
    remove(src)


def size_of(path: str) -> int | None:
    """Apparent size of `path`, None when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def has_no_data(path: str) -> bool:
    """True when `path` has no data extent (SEEK_DATA from 0 finds none, counting data still in the
    page cache): every byte of it reads as zero. False when it has data, or the filesystem cannot say
    (Linux then treats the whole file as data); a missing file -> FileNotFoundError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.lseek(fd, 0, os.SEEK_DATA)
    except OSError as exc:
        return exc.errno == errno.ENXIO
    finally:
        os.close(fd)
    return False


class Space(NamedTuple):
    """The filesystem holding a directory, as an unprivileged writer sees it (its root reserve aside)."""

    size: int  # bytes in use plus `free`: the most all its files together can ever hold
    free: int  # bytes still free to allocate


def space(directory: str, need: int = 0) -> Space:
    """The filesystem holding `directory`, by statvfs. Fewer than `need` bytes free while deleted files
    are still being removed (reaper.py): read again once they are, so a delete's space counts."""
    st = os.statvfs(directory)
    if st.f_bavail * st.f_frsize < need and REAPER.settle():
        st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    return Space((st.f_blocks - st.f_bfree) * st.f_frsize + free, free)


def can_reflink(directory: str) -> bool:
    """Whether files in `directory` can share blocks (FICLONE): tried on two scratch files there, which
    are removed again (start-up reconciliation removes any a crash leaves)."""
    probe = os.path.join(directory, f"{PROBE_PREFIX}{os.getpid()}-{threading.get_ident()}")
    src, dst = probe + "-a", probe + "-b"  # per thread: concurrent probes never remove each other's
    try:
        src_fd = os.open(src, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.pwrite(src_fd, b"\0" * 4096, 0)
            dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                return _reflink(src_fd, dst_fd)
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
    except OSError:
        return False
    finally:
        remove(src)
        remove(dst)
