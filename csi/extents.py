"""Which parts of a file hold data, and which parts of two files differ: the OS layer of changed-block
tracking. grpc-free; no state.

- `allocated(path, start, block)`: block-aligned ranges holding data (SEEK_DATA/SEEK_HOLE), holes and
  unwritten extents skipped.
- `changed(base, target, start, block, ...)`: block-aligned ranges where the two files' bytes differ.
  With `share_aware` (the data dir reflinks, so snapshots of one volume share the extents nobody wrote
  since), FIEMAP tells which ranges map to the same physical blocks in both files; those are equal
  without reading them. Every other range holding data on either side is read and compared, a block
  at a time, so the answer is exact either way; only the amount read differs. `ReadStats` counts it.

Ranges are (offset, length) with offset and length multiples of `block` (the last range is cut at the
file's size if the size is not a multiple), ascending and never overlapping or touching: adjacent
blocks are merged. Nothing before the block holding `start` is reported.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import itertools
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
# Physical address unknown or not a plain block run: such an extent never counts as shared.
FIEMAP_EXTENT_OPAQUE = 0x2 | 0x4 | 0x8 | 0x80 | 0x200 | 0x400
_HEADER = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count, pad
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
_BATCH = 256
READ_CHUNK = 4 * 1024 * 1024


class Range(NamedTuple):
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


class Mapping(NamedTuple):
    """One FIEMAP extent: [logical, logical+length) at `physical` (None: no comparable address)."""

    logical: int
    length: int
    physical: int | None


class ReadStats:
    """Bytes a `changed` call read from each file (holes and shared extents are never read)."""

    def __init__(self) -> None:
        self.bytes_read = 0


class Abandoned(Exception):
    """The caller no longer wants the ranges (`changed`'s `wanted` answered False): the scan stopped."""


def always() -> bool:
    """A `wanted` that never stops a scan."""
    return True


class ExtentMapUnsupported(OSError):
    """The filesystem does not answer FIEMAP."""


def data_segments(fd: int, start: int, end: int) -> Iterator[Range]:
    """Maximal [a, b) within [start, end) that SEEK_DATA/SEEK_HOLE report as data."""
    pos = start
    while pos < end:
        try:
            begin = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole up to the end of the file
                return
            raise
        if begin >= end:
            return
        stop = min(os.lseek(fd, begin, os.SEEK_HOLE), end)
        yield Range(begin, stop - begin)
        pos = stop


def extent_map(fd: int, start: int, end: int) -> list[Mapping]:
    """Written extents overlapping [start, end), in logical order, flushed first (FIEMAP_FLAG_SYNC).
    Unwritten (preallocated) extents read as zeros and are left out, like holes."""
    out: list[Mapping] = []
    pos = start
    while pos < end:
        request = bytearray(_HEADER.size + _BATCH * _EXTENT.size)
        _HEADER.pack_into(request, 0, pos, end - pos, FIEMAP_FLAG_SYNC, 0, _BATCH, 0)
        try:
            fcntl.ioctl(fd, FS_IOC_FIEMAP, request, True)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                raise ExtentMapUnsupported(exc.errno, f"FIEMAP: {exc.strerror}") from exc
            raise
        mapped = _HEADER.unpack_from(request, 0)[3]
        if mapped == 0:
            break
        last = False
        for i in range(mapped):
            logical, physical, length, _, _, flags, _, _, _ = _EXTENT.unpack_from(
                request, _HEADER.size + i * _EXTENT.size
            )
            last = bool(flags & FIEMAP_EXTENT_LAST)
            pos = logical + length
            if not flags & FIEMAP_EXTENT_UNWRITTEN:
                out.append(Mapping(logical, length, None if flags & FIEMAP_EXTENT_OPAQUE else physical))
        if last:
            break
    return out


def _align(start: int, block: int) -> int:
    return start - start % block


def aligned(segments: Iterable[Range], block: int, size: int) -> Iterator[Range]:
    """Ascending segments widened to whole blocks (cut at `size`), merged where they touch."""
    current: Range | None = None
    for seg in segments:
        lo = _align(seg.offset, block)
        hi = min(size, -(-seg.end // block) * block)
        if current is not None and lo <= current.end:
            current = Range(current.offset, max(current.end, hi) - current.offset)
            continue
        if current is not None:
            yield current
        current = Range(lo, hi - lo)
    if current is not None:
        yield current


def allocated(path: str, start: int, block: int) -> Iterator[Range]:
    """Block ranges of `path` holding data, from the block containing `start`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        yield from aligned(data_segments(fd, _align(start, block), size), block, size)
    finally:
        os.close(fd)


class _Side(NamedTuple):
    fd: int
    size: int
    data: list[Range]
    ends: list[int]  # data[i].end, for bisection
    extents: list[Mapping] | None


def _physical_at(extents: list[Mapping], offset: int) -> int | None:
    """Physical address of logical `offset` (None: a hole, or no comparable address)."""
    lo, hi = 0, len(extents)
    while lo < hi:
        mid = (lo + hi) // 2
        ext = extents[mid]
        if ext.logical + ext.length <= offset:
            lo = mid + 1
        elif ext.logical > offset:
            hi = mid
        else:
            return None if ext.physical is None else ext.physical + offset - ext.logical
    return None


def _boundaries(side: _Side) -> Iterator[int]:
    for seg in side.data:
        yield seg.offset
        yield seg.end
    for ext in side.extents or ():
        yield ext.logical
        yield ext.logical + ext.length


def _candidates(base: _Side, target: _Side, start: int, size: int) -> Iterator[Range]:
    """Pieces of [start, size) where either side holds data, minus pieces both sides map to the same
    physical blocks (only when both extent maps are known)."""
    inner = {c for side in (base, target) for c in _boundaries(side) if start < c < size}
    cuts = sorted({start, size} | inner)
    for lo, hi in itertools.pairwise(cuts):
        in_base, in_target = _holds(base, lo), _holds(target, lo)
        if not (in_base or in_target):
            continue
        if in_base and in_target and base.extents is not None and target.extents is not None:
            shared = _physical_at(base.extents, lo)
            if shared is not None and shared == _physical_at(target.extents, lo):
                continue
        yield Range(lo, hi - lo)


def _holds(side: _Side, offset: int) -> bool:
    i = bisect.bisect_right(side.ends, offset)
    return i < len(side.data) and side.data[i].offset <= offset


def _read(side: _Side, offset: int, length: int, stats: ReadStats) -> bytes:
    """`length` bytes at `offset`; holes and the part past the end read as zeros without a read."""
    out = bytearray(length)
    end = offset + length
    i = bisect.bisect_right(side.ends, offset)
    while i < len(side.data) and side.data[i].offset < end:
        seg = side.data[i]
        lo, hi = max(seg.offset, offset), min(seg.end, end)
        chunk = os.pread(side.fd, hi - lo, lo)
        stats.bytes_read += len(chunk)
        out[lo - offset : lo - offset + len(chunk)] = chunk
        i += 1
    return bytes(out)


def _differing(
    base: _Side, target: _Side, window: Range, block: int, stats: ReadStats, wanted: Callable[[], bool]
) -> Iterator[Range]:
    """Blocks inside the block-aligned `window` whose bytes differ, compared READ_CHUNK at a time."""
    step = max(block, READ_CHUNK - READ_CHUNK % block)
    pos = window.offset
    while pos < window.end:
        if not wanted():
            raise Abandoned(f"stopped at offset {pos}: the ranges are no longer wanted")
        length = min(step, window.end - pos)
        old, new = _read(base, pos, length, stats), _read(target, pos, length, stats)
        if old != new:
            for at in range(0, length, block):
                if old[at : at + block] != new[at : at + block]:
                    yield Range(pos + at, min(block, length - at))
        pos += length


def _side(fd: int, share_aware: bool) -> _Side:
    size = os.fstat(fd).st_size
    data = list(data_segments(fd, 0, size))
    extents = None
    if share_aware:
        try:
            extents = extent_map(fd, 0, size)
        except ExtentMapUnsupported:
            extents = None
    return _Side(fd, size, data, [seg.end for seg in data], extents)


def changed(
    base_path: str,
    target_path: str,
    start: int,
    block: int,
    *,
    share_aware: bool,
    stats: ReadStats | None = None,
    wanted: Callable[[], bool] = always,
) -> Iterator[Range]:
    """Block ranges, from the block holding `start` to the end of `target_path`, whose bytes differ
    from `base_path` (past the end of the base, anything but zeros differs). `wanted` is asked before
    each read: False stops the scan with Abandoned (long unchanged stretches yield nothing for long)."""
    counter = stats if stats is not None else ReadStats()
    base_fd = os.open(base_path, os.O_RDONLY)
    try:
        target_fd = os.open(target_path, os.O_RDONLY)
        try:
            base = _side(base_fd, share_aware)
            target = _side(target_fd, share_aware)
            size = target.size
            windows = aligned(_candidates(base, target, _align(start, block), size), block, size)
            merged = _merge(
                w for window in windows for w in _differing(base, target, window, block, counter, wanted)
            )
            yield from merged
        finally:
            os.close(target_fd)
    finally:
        os.close(base_fd)


def _merge(ranges: Iterator[Range]) -> Iterator[Range]:
    current: Range | None = None
    for r in ranges:
        if current is not None and r.offset == current.end:
            current = Range(current.offset, current.length + r.length)
            continue
        if current is not None:
            yield current
        current = r
    if current is not None:
        yield current


def fixed(ranges: Iterable[Range], block: int) -> Iterator[Range]:
    """Merged ranges split back into single blocks (the FIXED_LENGTH form)."""
    for r in ranges:
        for at in range(r.offset, r.end, block):
            yield Range(at, min(block, r.end - at))
