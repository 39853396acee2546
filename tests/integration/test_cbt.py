"""Changed-block tracking end to end on the local backend: a block volume staged and published on a real
loop device, known blocks written through it between two snapshots, and GetMetadataDelta over the real
socket returning exactly those blocks.

Runs twice: with the data dir on xfs with reflink (the reflink path: unchanged extents are shared and
not read) and on ext4 (no reflink: the fallback path reads and compares data ranges); each filesystem is
made on a loop device by the test. Checked on both: the first and the last block, ranges on both sides
of a max_results boundary, exact offsets and lengths, FIXED_LENGTH and VARIABLE_LENGTH describing the
same bytes, a resumed stream continuing where an interrupted one stopped, and `ballast-csi snapshot-diff`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2, csi_pb2_grpc
from csi.extents import Range
from csi.snapshot_metadata import MetadataSettings, SnapshotMetadataService
from tests.conformance.driver import DRIVER
from tests.integration.conftest import NodeEnv, block_cap, loop_filesystem, running_node_env

pytestmark = [pytest.mark.root, pytest.mark.slow]

MiB = 1024**2
BLOCK = 64 * 1024  # the local backend's block size for changed-block metadata
SIZE = 64 * MiB
BASE_DATA = 32 * MiB  # the first half of the volume holds data before the base snapshot
# Writes between the snapshots: (offset, length). First block, an unaligned write over blocks 7-9, single
# blocks on both sides of the max_results=2 message boundary, a block in the never-written second half,
# and the last byte of the volume.
WRITES = [
    (100, 10),
    (7 * BLOCK + 100, 2 * BLOCK),
    (20 * BLOCK, BLOCK),
    (22 * BLOCK, 1),
    (40 * MiB, 4096),
    (SIZE - 1, 1),
]
EXPECTED = [
    Range(0, BLOCK),
    Range(7 * BLOCK, 3 * BLOCK),
    Range(20 * BLOCK, BLOCK),
    Range(22 * BLOCK, BLOCK),
    Range(40 * MiB, BLOCK),
    Range(SIZE - BLOCK, BLOCK),
]


class Snapshots:
    def __init__(self, env: NodeEnv, base: str, target: str, reflinks: bool) -> None:
        self.env, self.base, self.target, self.reflinks = env, base, target, reflinks
        self.stub = csi_pb2_grpc.SnapshotMetadataStub(env.client.channel)

    def request(self, starting_offset: int = 0, max_results: int = 0) -> csi_pb2.GetMetadataDeltaRequest:
        return csi_pb2.GetMetadataDeltaRequest(
            base_snapshot_id=self.base,
            target_snapshot_id=self.target,
            starting_offset=starting_offset,
            max_results=max_results,
        )


def _write(path: str, writes: list[tuple[int, bytes]]) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, data in writes:
            os.pwrite(fd, data, offset)
        os.fsync(fd)  # through the block device's cache into the backing file
    finally:
        os.close(fd)


def _snapshot(env: NodeEnv, name: str, volume_id: str, reflinks: bool) -> str:
    """The volume stays published as a raw block device, which no freeze holds. With reflink the copy
    is atomic and taken as it is; without (ext4) only as `consistency: best-effort`, which is exact
    here, as nothing writes meanwhile."""
    params = {} if reflinks else {"consistency": "best-effort"}
    req = csi_pb2.CreateSnapshotRequest(name=name, source_volume_id=volume_id, parameters=params)
    return str(env.client.controller.CreateSnapshot(req, timeout=60).snapshot.snapshot_id)


@pytest.fixture(
    params=[
        pytest.param(("xfs", ["-m", "reflink=1"], True), id="xfs-reflink"),
        pytest.param(("ext4", [], False), id="ext4-fallback"),
    ]
)
def snapshots(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Snapshots]:
    fs_type, options, reflinks = request.param
    (tmp_path / "fs").mkdir()
    with (
        loop_filesystem(tmp_path / "fs", fs_type, 400 * MiB, options) as mnt,
        running_node_env(tmp_path / "node", data_dir=mnt / "data") as env,
    ):
        vol = env.volume(size=SIZE)
        env.stage(vol, block_cap())
        env.publish(vol, block_cap())
        rng = random.Random(15)
        _write(vol.target, [(off, rng.randbytes(MiB)) for off in range(0, BASE_DATA, MiB)])
        base = _snapshot(env, "base", vol.id, reflinks)
        _write(vol.target, [(off, rng.randbytes(n)) for off, n in WRITES])
        target = _snapshot(env, "target", vol.id, reflinks)
        yield Snapshots(env, base, target, reflinks)


def _ranges(responses: list[Any]) -> list[Range]:
    return [Range(b.byte_offset, b.size_bytes) for r in responses for b in r.block_metadata]


def _blocks(ranges: list[Range]) -> set[int]:
    return {offset for r in ranges for offset in range(r.offset, r.end, BLOCK)}


def test_delta_is_exactly_the_written_blocks(snapshots: Snapshots) -> None:
    responses = list(snapshots.stub.GetMetadataDelta(snapshots.request(max_results=2), timeout=120))
    assert [len(r.block_metadata) for r in responses] == [2, 2, 2]
    assert _ranges(responses) == EXPECTED
    assert {(r.block_metadata_type, r.volume_capacity_bytes) for r in responses} == {
        (csi_pb2.VARIABLE_LENGTH, SIZE)
    }
    blocks = snapshots.env.driver.backend.blocks  # type: ignore[attr-defined]
    assert blocks.reflinks() is snapshots.reflinks
    changed = sum(r.length for r in EXPECTED)
    if snapshots.reflinks:  # only the changed blocks are read, from both snapshots at most
        assert blocks.last_read.bytes_read <= 2 * changed
    else:  # every data range of both snapshots is read
        assert blocks.last_read.bytes_read >= 2 * BASE_DATA


def test_fixed_and_variable_describe_the_same_bytes(snapshots: Snapshots, tmp_path: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    backend = snapshots.env.driver.backend
    csi_pb2_grpc.add_SnapshotMetadataServicer_to_server(
        SnapshotMetadataService(backend, MetadataSettings(fixed=True, block_size=BLOCK)), server
    )
    server.add_insecure_port(f"unix://{tmp_path}/fixed.sock")
    server.start()
    try:
        with grpc.insecure_channel(f"unix://{tmp_path}/fixed.sock") as channel:
            stub = csi_pb2_grpc.SnapshotMetadataStub(channel)
            fixed = list(stub.GetMetadataDelta(snapshots.request(max_results=3), timeout=120))
    finally:
        server.stop(None)
    assert {r.block_metadata_type for r in fixed} == {csi_pb2.FIXED_LENGTH}
    assert all(len(r.block_metadata) <= 3 for r in fixed)
    fixed_ranges = _ranges(fixed)
    assert {r.length for r in fixed_ranges} == {BLOCK}
    assert [r.offset for r in fixed_ranges] == sorted(_blocks(EXPECTED))
    variable = _ranges(list(snapshots.stub.GetMetadataDelta(snapshots.request(), timeout=120)))
    assert _blocks(fixed_ranges) == _blocks(variable)


def test_an_interrupted_stream_resumes_where_it_stopped(snapshots: Snapshots) -> None:
    call = snapshots.stub.GetMetadataDelta(snapshots.request(max_results=2), timeout=120)
    first = next(call)
    call.cancel()  # the stream breaks after one message
    received = _ranges([first])
    resume = received[-1].end
    rest = _ranges(
        list(snapshots.stub.GetMetadataDelta(snapshots.request(starting_offset=resume), timeout=120))
    )
    assert received + rest == EXPECTED
    inside = _ranges(
        list(snapshots.stub.GetMetadataDelta(snapshots.request(starting_offset=8 * BLOCK + 5), timeout=120))
    )
    # resuming inside a range: from the block that holds the offset (nothing ends before it)
    assert inside == [Range(8 * BLOCK, 2 * BLOCK), *EXPECTED[2:]]


def test_allocated_blocks_of_the_target(snapshots: Snapshots) -> None:
    req = csi_pb2.GetMetadataAllocatedRequest(snapshot_id=snapshots.target)
    ranges = _ranges(list(snapshots.stub.GetMetadataAllocated(req, timeout=120)))
    assert ranges == [Range(0, BASE_DATA), Range(40 * MiB, BLOCK), Range(SIZE - BLOCK, BLOCK)]


def test_snapshot_diff_prints_the_ranges(snapshots: Snapshots) -> None:
    endpoint = f"unix://{snapshots.env.socket}"
    argv = [str(DRIVER), "snapshot-diff", snapshots.base, snapshots.target, "--endpoint", endpoint]
    table = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"{len(EXPECTED)} range(s), {sum(r.length for r in EXPECTED)} bytes changed" in table
    assert f"{7 * BLOCK:>16} {3 * BLOCK:>12} {10 * BLOCK:>16}" in table
    doc = json.loads(
        subprocess.run(
            [*argv, "--output", "json"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
    )
    assert [Range(r["offset"], r["length"]) for r in doc["ranges"]] == EXPECTED
    assert doc["volume_capacity_bytes"] == SIZE and doc["block_metadata_type"] == "VARIABLE_LENGTH"
    failed = subprocess.run(
        [*argv[:2], "snap-missing", snapshots.target, *argv[4:]], capture_output=True, text=True, timeout=120
    )
    assert failed.returncode == 1 and "NOT_FOUND" in failed.stderr and failed.stdout == ""


def test_an_io_error_on_the_data_dir_is_internal_not_a_missing_file(tmp_path: Path) -> None:
    """The data dir's xfs shut down (as after a metadata I/O error): every stat and open of a snapshot
    file fails with EIO while the file is still there. That is a failed read (INTERNAL, retry once the
    filesystem is back), never FAILED_PRECONDITION "the file ... is missing"."""
    (tmp_path / "fs").mkdir()
    with (
        loop_filesystem(tmp_path / "fs", "xfs", 400 * MiB, ["-m", "reflink=1"]) as mnt,
        running_node_env(tmp_path / "node", data_dir=mnt / "data") as env,
    ):
        vol = env.volume(size=SIZE)
        base, target = (_snapshot(env, name, vol.id, True) for name in ("base", "target"))
        stub = csi_pb2_grpc.SnapshotMetadataStub(env.client.channel)
        subprocess.run(["xfs_io", "-x", "-c", "shutdown", str(mnt)], check=True)
        for call, request in [
            (stub.GetMetadataAllocated, csi_pb2.GetMetadataAllocatedRequest(snapshot_id=target)),
            (
                stub.GetMetadataDelta,
                csi_pb2.GetMetadataDeltaRequest(base_snapshot_id=base, target_snapshot_id=target),
            ),
        ]:
            with pytest.raises(grpc.RpcError) as failed:
                list(call(request, timeout=60))
            assert failed.value.code() == grpc.StatusCode.INTERNAL, failed.value.details()
            assert "missing" not in (failed.value.details() or "")
