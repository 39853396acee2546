"""What a new volume's backing file holds: nothing (a sparse file), or a block-sharing copy of a snapshot
(restore) or of another volume (clone). The file is durable (file, then directory) when written, and the
caller commits the volume's record only after that (docs/recovery.md, "Power loss").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from csi.backends.base import ContentSource, DiskOptions, SourceKind, fit_source
from csi.backends.local import files
from csi.backends.local.groupcommit import FileFirst
from csi.backends.local.layout import Layout
from csi.backends.local.state import Store
from csi.failures import FailedPreconditionError, NotFoundError, OutOfRangeError
from csi.keylocks import KeyedLocks

# Crash points of CreateVolume by content source: (file written and synced, record committed).
CREATE_FAILPOINTS = {
    None: ("local.create.file-written", "local.create.recorded"),
    SourceKind.VOLUME: ("local.clone.file-written", "local.clone.recorded"),
    SourceKind.SNAPSHOT: ("local.restore.file-written", "local.restore.recorded"),
}


def _source_size(store: Store, source: ContentSource) -> int:
    """Bytes of a content source; missing -> NotFoundError."""
    if source.kind is SourceKind.SNAPSHOT:
        snap = store.snapshot(source.id)
        if snap is None:
            raise NotFoundError(f"source snapshot {source.id} not found")
        return snap.size
    return store.existing_volume(source.id).size


def fitted(store: Store, options: DiskOptions, granularity: int) -> DiskOptions:
    """`options` sized for its content source (base.fit_source). A missing source leaves them as they
    are: a volume made from it before it went still answers its name, and a new one is NotFound
    (source_file)."""
    if options.source is None:
        return options
    try:
        size = _source_size(store, options.source)
    except NotFoundError:
        return options
    return fit_source(options, size, granularity)


def source_file(layout: Layout, store: Store, source: ContentSource, size: int) -> str:
    """The file of a content source; missing -> NotFound, bigger than `size` -> OutOfRange. A source
    volume's size is only settled under its lock (an expand may be growing it)."""
    src_size = _source_size(store, source)
    if src_size > size:
        raise OutOfRangeError(
            f"source {source.kind.value} {source.id} is {src_size} bytes, larger than the requested {size}"
        )
    if source.kind is SourceKind.SNAPSHOT:
        return layout.snapshot_file(source.id)
    return layout.volume_file(source.id)


def file_first(
    layout: Layout, path: str, options: DiskOptions, written: Callable[[], None]
) -> FileFirst | None:
    """For a volume from nothing: its sparse file as the first step of its record's group commit
    (groupcommit.py), so concurrent creates share directory syncs and commits. None for a copy, which
    the caller writes with write_volume_file first (a long copy must not hold up other creates)."""
    if options.source is not None:
        return None
    return FileFirst(
        lambda: files.create_sparse(path, options.size_bytes, sync_parent=False), layout.volumes_dir, written
    )


Hold = Callable[[str, str], AbstractContextManager[object]]


def write_volume_file(
    layout: Layout, store: Store, locks: KeyedLocks, path: str, options: DiskOptions, hold: Hold
) -> None:
    """The new volume's backing file at `path`: sparse, or a copy of its content source. The source's
    record is read and its file opened under its lock, which its delete holds too: a source deleted
    meanwhile is NotFound (CSI CreateVolume: "Source does not exist"), never a file found missing. A
    source volume is copied under its lock, its writes held by `hold(volume id, its file)` while a copy
    that is no reflink runs (files.copy), which makes it point-in-time; a snapshot's file never changes,
    so restores from it copy side by side, from a file that stays readable once opened."""
    if options.source is None:
        files.create_sparse(path, options.size_bytes)
        return
    source = options.source
    with locks.hold(source.id):
        src = source_file(layout, store, source, options.size_bytes)
        try:
            fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise FailedPreconditionError(f"the backing file of source {source.id} is missing") from exc
        if source.kind is SourceKind.VOLUME:
            _copy(fd, src, path, options.size_bytes, lambda: hold(source.id, src))
            return
    _copy(fd, src, path, options.size_bytes, nullcontext)


def _copy(
    fd: int, src: str, path: str, size: int, held: Callable[[], AbstractContextManager[object]]
) -> None:
    """files.copy_open, then the source's fd closed."""
    try:
        files.copy_open(fd, src, path, size, held=held)
    finally:
        os.close(fd)
