"""Changed blocks between two reflinked snapshots on a real xfs (reflink=1) made on a loop device (the
`reflink_dir` fixture of tests/integration/conftest.py): the answer is exact and the unchanged, shared
extents are never read."""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path

from csi.extents import Range, ReadStats, allocated, changed, extent_map

MiB = 1024 * 1024
BLOCK = 512 * 1024
FICLONE = 0x40049409


def _reflink(src: Path, dst: Path) -> None:
    with open(src, "rb") as s, open(dst, "wb") as d:
        fcntl.ioctl(d.fileno(), FICLONE, s.fileno())


def _write(path: Path, writes: dict[int, bytes]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, data in writes.items():
            os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def test_delta_is_exact_and_reads_only_changed_blocks(reflink_dir: Path) -> None:
    size = 64 * MiB
    volume = reflink_dir / "volume.img"
    with open(volume, "wb") as f:
        f.truncate(size)
    rng = random.Random(3)
    _write(volume, {off: rng.randbytes(BLOCK) for off in range(0, 32 * MiB, BLOCK)})  # half the volume
    _reflink(volume, reflink_dir / "base.img")

    last = size - BLOCK
    written = {0: BLOCK, 7 * BLOCK + 100: 2 * BLOCK, 40 * MiB: BLOCK, last: BLOCK}  # offset -> length
    _write(volume, {off: rng.randbytes(length) for off, length in written.items()})
    _reflink(volume, reflink_dir / "target.img")
    base, target = str(reflink_dir / "base.img"), str(reflink_dir / "target.img")

    expected = [
        Range(0, BLOCK),
        Range(7 * BLOCK, 3 * BLOCK),  # 100 bytes into block 7 for two blocks: touches 7, 8 and 9
        Range(40 * MiB, BLOCK),
        Range(last, BLOCK),
    ]
    shared_stats, plain_stats = ReadStats(), ReadStats()
    assert list(changed(base, target, 0, BLOCK, share_aware=True, stats=shared_stats)) == expected
    assert list(changed(base, target, 0, BLOCK, share_aware=False, stats=plain_stats)) == expected
    changed_bytes = sum(r.length for r in expected)
    assert shared_stats.bytes_read <= 2 * changed_bytes  # each changed block, from both sides at most
    assert plain_stats.bytes_read >= 2 * 32 * MiB  # the fallback reads every data byte of both
    fd = os.open(target, os.O_RDONLY)
    try:
        assert extent_map(fd, 0, size)  # FIEMAP answers on this filesystem
    finally:
        os.close(fd)


def test_allocated_of_a_reflinked_snapshot(reflink_dir: Path) -> None:
    volume = reflink_dir / "volume.img"
    with open(volume, "wb") as f:
        f.truncate(16 * MiB)
    _write(volume, {BLOCK: b"x" * 10, 10 * MiB: b"y" * BLOCK})
    _reflink(volume, reflink_dir / "snap.img")
    assert list(allocated(str(reflink_dir / "snap.img"), 0, BLOCK)) == [
        Range(BLOCK, BLOCK),
        Range(10 * MiB, BLOCK),
    ]
