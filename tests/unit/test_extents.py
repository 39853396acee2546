"""csi.extents on plain files (no reflink needed): allocated ranges, exact deltas, resume, edge blocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csi.extents import READ_CHUNK, Abandoned, Range, ReadStats, allocated, changed, fixed

KiB = 1024
BLOCK = 64 * KiB


def _file(path: Path, size: int, writes: dict[int, bytes]) -> str:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        for offset, data in writes.items():
            os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(path)


def _copy_with(src: str, dst: Path, writes: dict[int, bytes], size: int | None = None) -> str:
    data = Path(src).read_bytes()
    fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size or len(data))
        for seg_start in range(0, len(data), BLOCK):  # keep holes as holes
            chunk = data[seg_start : seg_start + BLOCK]
            if chunk.strip(b"\0"):
                os.pwrite(fd, chunk, seg_start)
        for offset, payload in writes.items():
            os.pwrite(fd, payload, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return str(dst)


@pytest.mark.parametrize(
    ("writes", "start", "expected"),
    [
        pytest.param({}, 0, [], id="all-hole"),
        pytest.param({0: b"x"}, 0, [Range(0, BLOCK)], id="first-byte"),
        pytest.param({5 * BLOCK - 1: b"x"}, 0, [Range(4 * BLOCK, BLOCK)], id="last-byte"),
        pytest.param({BLOCK - 1: b"xy"}, 0, [Range(0, 2 * BLOCK)], id="straddles-a-boundary"),
        pytest.param({0: b"x", 3 * BLOCK: b"y"}, BLOCK + 5, [Range(3 * BLOCK, BLOCK)], id="resumed"),
        pytest.param(
            {0: b"x", 3 * BLOCK: b"y"}, 3 * BLOCK + 7, [Range(3 * BLOCK, BLOCK)], id="resume-inside"
        ),
    ],
)
def test_allocated(tmp_path: Path, writes: dict[int, bytes], start: int, expected: list[Range]) -> None:
    path = _file(tmp_path / "snap", 5 * BLOCK, writes)
    assert list(allocated(path, start, BLOCK)) == expected


@pytest.mark.parametrize(
    ("base_writes", "target_writes", "start", "expected"),
    [
        pytest.param({0: b"a" * BLOCK}, {}, 0, [], id="unchanged"),
        pytest.param({0: b"a"}, {0: b"b"}, 0, [Range(0, BLOCK)], id="first-block"),
        pytest.param({}, {8 * BLOCK - 1: b"z"}, 0, [Range(7 * BLOCK, BLOCK)], id="last-block-into-a-hole"),
        pytest.param(
            {}, {2 * BLOCK: b"q" * (2 * BLOCK)}, 0, [Range(2 * BLOCK, 2 * BLOCK)], id="adjacent-blocks-merge"
        ),
        pytest.param({3 * BLOCK: b"same"}, {3 * BLOCK: b"same"}, 0, [], id="rewritten-with-equal-bytes"),
        pytest.param({}, {BLOCK: b"\0" * 10}, 0, [], id="zeros-over-a-hole-are-no-change"),
        pytest.param(
            {}, {0: b"1", 6 * BLOCK: b"2"}, BLOCK, [Range(6 * BLOCK, BLOCK)], id="resume-skips-earlier-blocks"
        ),
    ],
)
def test_changed_exact(
    tmp_path: Path,
    base_writes: dict[int, bytes],
    target_writes: dict[int, bytes],
    start: int,
    expected: list[Range],
) -> None:
    base = _file(tmp_path / "base", 8 * BLOCK, base_writes)
    target = _copy_with(base, tmp_path / "target", target_writes)
    assert list(changed(base, target, start, BLOCK, share_aware=False)) == expected
    assert list(changed(base, target, start, BLOCK, share_aware=True)) == expected  # no shared extents here


def test_growth_between_snapshots_reports_only_written_tail(tmp_path: Path) -> None:
    base = _file(tmp_path / "base", 4 * BLOCK, {0: b"a"})
    target = _copy_with(base, tmp_path / "target", {6 * BLOCK: b"tail"}, size=8 * BLOCK)
    assert list(changed(base, target, 0, BLOCK, share_aware=False)) == [Range(6 * BLOCK, BLOCK)]


def test_unaligned_size_cuts_the_last_block(tmp_path: Path) -> None:
    size = 3 * BLOCK + 100
    base = _file(tmp_path / "base", size, {})
    target = _copy_with(base, tmp_path / "target", {size - 1: b"!"})
    assert list(changed(base, target, 0, BLOCK, share_aware=False)) == [Range(3 * BLOCK, 100)]


def test_without_sharing_every_data_byte_is_read(tmp_path: Path) -> None:
    base = _file(tmp_path / "base", 16 * BLOCK, {0: b"a" * (4 * BLOCK)})
    target = _copy_with(base, tmp_path / "target", {10 * BLOCK: b"b"})
    stats = ReadStats()
    assert list(changed(base, target, 0, BLOCK, share_aware=False, stats=stats)) == [Range(10 * BLOCK, BLOCK)]
    # both copies of the 4 data blocks, plus the target's changed block; holes are never read
    assert stats.bytes_read >= 2 * 4 * BLOCK + 1
    assert stats.bytes_read <= 2 * 4 * BLOCK + BLOCK


def test_a_scan_no_longer_wanted_stops_within_one_read(tmp_path: Path) -> None:
    """An unchanged stretch yields nothing for as long as it takes to read it; `wanted` is asked before
    every read, so a caller that left stops the scan at once instead of at the next change."""
    size = 4 * READ_CHUNK
    base = _file(tmp_path / "base", size, {0: b"a" * size})
    target = _copy_with(base, tmp_path / "target", {size - 1: b"!"})
    asked: list[int] = []
    stats = ReadStats()

    def wanted() -> bool:
        asked.append(stats.bytes_read)
        return len(asked) < 2

    with pytest.raises(Abandoned):
        list(changed(base, target, 0, BLOCK, share_aware=False, stats=stats, wanted=wanted))
    assert stats.bytes_read == 2 * READ_CHUNK, "one chunk of each file, then it stopped"


def test_fixed_splits_into_single_blocks() -> None:
    merged = [Range(0, 3 * BLOCK), Range(5 * BLOCK, 100)]
    assert list(fixed(iter(merged), BLOCK)) == [
        Range(0, BLOCK),
        Range(BLOCK, BLOCK),
        Range(2 * BLOCK, BLOCK),
        Range(5 * BLOCK, 100),
    ]
