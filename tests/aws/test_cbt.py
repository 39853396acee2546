"""Changed blocks of EBS snapshots through the EBS direct APIs, against moto's real HTTP server.

moto 5.2.5 serves ListSnapshotBlocks and ListChangedBlocks for snapshots written through the EBS direct
APIs themselves (StartSnapshot, PutSnapshotBlock, CompleteSnapshot), which EC2 DescribeSnapshots also
lists; it does not tie them to snapshots EC2 CreateSnapshot made, and it answers in 512-byte blocks
(real EBS: 512 KiB), with no paging and without honouring StartingBlockIndex. So the snapshots here are
written block by block, the driver reads BlockSize from every answer, and paging is checked by answering
the client's calls directly (docs/aws.md names these gaps).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi import failures
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.cli import main
from csi.config import parse_args
from csi.extents import Range
from csi.server import Driver
from tests.motoserver import ZONE, make_client

MOTO_BLOCK = 512  # what moto reports as BlockSize
LAST = GiB // MOTO_BLOCK - 1  # the last block of a 1 GiB snapshot


def _put(ebs: Any, snapshot_id: str, index: int, data: bytes) -> None:
    ebs.put_snapshot_block(
        SnapshotId=snapshot_id,
        BlockIndex=index,
        BlockData=data,
        DataLength=len(data),
        Checksum=base64.b64encode(hashlib.sha256(data).digest()).decode(),
        ChecksumAlgorithm="SHA256",
    )


def _snapshot(ebs: Any, blocks: dict[int, bytes]) -> str:
    sid = str(ebs.start_snapshot(VolumeSize=1)["SnapshotId"])
    for index, data in sorted(blocks.items()):
        _put(ebs, sid, index, data)
    ebs.complete_snapshot(SnapshotId=sid, ChangedBlocksCount=len(blocks))
    return sid


BASE = {i: bytes([i % 251]) * MOTO_BLOCK for i in (0, 1, 5, 6, 7, 100, LAST)}
CHANGED = (1, 6, LAST)  # first-page, middle and last block
TARGET = {**BASE, **{i: b"\xff" * MOTO_BLOCK for i in CHANGED}}


@pytest.fixture
def ebs(moto_endpoint: str, account: str) -> Any:
    return make_client(moto_endpoint, account, "ebs")


@pytest.fixture
def cbt(make_backend: Callable[..., AwsBackend], ebs: Any) -> AwsBackend:
    return make_backend(ebs_client=ebs)


@pytest.fixture
def pair(ebs: Any) -> tuple[str, str]:
    return _snapshot(ebs, BASE), _snapshot(ebs, TARGET)


def test_allocated_blocks_are_exact_and_merged(cbt: AwsBackend, pair: tuple[str, str]) -> None:
    blocks = cbt.snapshot_allocated(pair[0], 0, MOTO_BLOCK, {})
    assert blocks.volume_bytes == GiB
    assert list(blocks.ranges) == [
        Range(0, 2 * MOTO_BLOCK),
        Range(5 * MOTO_BLOCK, 3 * MOTO_BLOCK),
        Range(100 * MOTO_BLOCK, MOTO_BLOCK),
        Range(LAST * MOTO_BLOCK, MOTO_BLOCK),
    ]


def test_changed_blocks_include_the_first_page_and_the_last_block(
    cbt: AwsBackend, pair: tuple[str, str]
) -> None:
    assert list(cbt.snapshot_delta(*pair, 0, MOTO_BLOCK, {}).ranges) == [
        Range(i * MOTO_BLOCK, MOTO_BLOCK) for i in CHANGED
    ]


def test_a_resumed_delta_skips_what_ends_before_the_offset(cbt: AwsBackend, pair: tuple[str, str]) -> None:
    """moto ignores StartingBlockIndex, so this also shows the driver filters what comes back."""
    resumed = cbt.snapshot_delta(*pair, 2 * MOTO_BLOCK, MOTO_BLOCK, {})
    assert list(resumed.ranges) == [Range(6 * MOTO_BLOCK, MOTO_BLOCK), Range(LAST * MOTO_BLOCK, MOTO_BLOCK)]


def test_a_larger_block_size_widens_and_merges(cbt: AwsBackend, pair: tuple[str, str]) -> None:
    widened = list(cbt.snapshot_delta(*pair, 0, 4096, {}).ranges)
    assert widened == [Range(0, 4096), Range(GiB - 4096, 4096)]  # blocks 1 and 6 share the first 4 KiB


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param(lambda b, p: b.snapshot_delta("snap-00000000000000000", p[1], 0, 512, {}),
                     failures.NotFoundError, id="unknown-base"),
        pytest.param(lambda b, p: b.snapshot_allocated("not-a-snapshot", 0, 512, {}),
                     failures.NotFoundError, id="malformed-id"),
        pytest.param(lambda b, p: b.snapshot_allocated(p[0], GiB + 1, 512, {}),
                     failures.OutOfRangeError, id="offset-past-the-end"),
    ],
)  # fmt: skip
def test_bad_requests(
    cbt: AwsBackend, pair: tuple[str, str], call: Callable[..., Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        call(cbt, pair)


def test_a_target_taken_before_the_base_is_invalid(cbt: AwsBackend, ebs: Any) -> None:
    older = _snapshot(ebs, BASE)
    time.sleep(1.1)  # EC2 start times have whole seconds
    newer = _snapshot(ebs, TARGET)
    with pytest.raises(failures.InvalidParameterError, match="swap"):
        cbt.snapshot_delta(newer, older, 0, MOTO_BLOCK, {})


def test_moto_cannot_list_blocks_of_a_snapshot_ec2_made(cbt: AwsBackend, ec2: Any) -> None:
    """The gap docs/aws.md names: the request fails (never an empty, complete-looking answer)."""
    vid = cbt.create_volume("v", DiskOptions(size_bytes=GiB)).id
    sid = ec2.create_snapshot(VolumeId=vid)["SnapshotId"]
    with pytest.raises(failures.DriverError):
        list(cbt.snapshot_allocated(sid, 0, 512, {}).ranges)


def _answer(ebs: Any, operation: str, pages: list[dict[str, Any]], seen: list[dict[str, Any]]) -> None:
    """Answer the client's next calls of `operation` with `pages` (the paging real EBS does); `seen`
    gets the parameters of each call."""

    class Http:
        status_code = 200
        headers: dict[str, str] = {}

    def record(params: dict[str, Any], **kwargs: Any) -> None:
        seen.append(dict(params))

    def answer(**kwargs: Any) -> Any:
        return (Http(), pages.pop(0)) if pages else None

    ebs.meta.events.register(f"provide-client-params.ebs.{operation}", record)
    ebs.meta.events.register(f"before-call.ebs.{operation}", answer)


def test_pages_are_followed_with_next_token(cbt: AwsBackend, pair: tuple[str, str], ebs: Any) -> None:
    block = 512 * 1024
    seen: list[dict[str, Any]] = []
    pages = [
        {
            "ChangedBlocks": [{"BlockIndex": 0}, {"BlockIndex": 1}],
            "BlockSize": block,
            "VolumeSize": 1,
            "NextToken": "p2",
        },
        {"ChangedBlocks": [{"BlockIndex": 2}, {"BlockIndex": 9}], "BlockSize": block, "VolumeSize": 1},
    ]
    _answer(ebs, "ListChangedBlocks", pages, seen)
    ranges = list(cbt.snapshot_delta(*pair, block, block, {}).ranges)
    assert ranges == [Range(block, 2 * block), Range(9 * block, block)]
    assert [s.get("NextToken") for s in seen] == [None, "p2"]
    assert seen[0]["StartingBlockIndex"] == 1 and seen[0]["MaxResults"] == 10000


def test_blocks_out_of_order_across_pages_fail_the_stream(
    cbt: AwsBackend, pair: tuple[str, str], ebs: Any
) -> None:
    pages = [
        {"Blocks": [{"BlockIndex": 5}], "BlockSize": MOTO_BLOCK, "VolumeSize": 1, "NextToken": "p2"},
        {"Blocks": [{"BlockIndex": 3}], "BlockSize": MOTO_BLOCK, "VolumeSize": 1},
    ]
    _answer(ebs, "ListSnapshotBlocks", pages, [])
    ranges = cbt.snapshot_allocated(pair[0], 0, MOTO_BLOCK, {}).ranges
    with pytest.raises(failures.DriverError, match="returned block 3 after block 5"):
        list(ranges)


@pytest.fixture
def served(tmp_path: Path, cbt: AwsBackend) -> Iterator[str]:
    endpoint = f"unix://{tmp_path}/csi.sock"
    config, _ = parse_args(
        ["--backend", "aws", "--endpoint", endpoint, "--zone", ZONE, "--snapshot-metadata-block-size", "4Ki"]
    )
    driver = Driver(config, backend=cbt)
    driver.start()
    yield endpoint
    driver.stop(grace=1)


@pytest.mark.usefixtures("restore_root_logging")
def test_get_metadata_delta_over_grpc_and_snapshot_diff(
    served: str, pair: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with grpc.insecure_channel(served) as channel:
        stub = csi_pb2_grpc.SnapshotMetadataStub(channel)
        req = csi_pb2.GetMetadataDeltaRequest(
            base_snapshot_id=pair[0], target_snapshot_id=pair[1], max_results=1
        )
        responses = list(stub.GetMetadataDelta(req, timeout=60))
    assert [(b.byte_offset, b.size_bytes) for r in responses for b in r.block_metadata] == [
        (0, 4096),
        (GiB - 4096, 4096),
    ]
    assert {(r.block_metadata_type, r.volume_capacity_bytes) for r in responses} == {
        (csi_pb2.VARIABLE_LENGTH, GiB)
    }
    assert main(["snapshot-diff", pair[0], pair[1], "--endpoint", served, "--output", "json"]) == 0
    assert '"changed_bytes": 8192' in capsys.readouterr().out
