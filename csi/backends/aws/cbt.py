"""Changed-block tracking of EBS snapshots through the EBS direct APIs (boto3's `ebs` client):
ListSnapshotBlocks for the allocated blocks of a snapshot, ListChangedBlocks for the blocks that differ
between two snapshots of one volume.

EBS answers in blocks of its own size (512 KiB; BlockSize in every answer, which is what is used), in
pages of up to 10000 block indexes followed with NextToken. The ranges are widened to the block size the
driver reports in (csi.extents.aligned) and merged. Both snapshots are looked up with DescribeSnapshots
first, so a missing one is NOT_FOUND and one still pending is FAILED_PRECONDITION before any stream
starts. Requests go through ec2.Ec2 (retries, one error table; errors.AWS_ERRORS names the EBS codes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from csi.backends.aws import params as P
from csi.backends.aws.ec2 import Ec2
from csi.backends.base import GiB
from csi.backends.reporting import BlockMap
from csi.extents import Range, aligned
from csi.failures import DriverError, FailedPreconditionError, InvalidParameterError, OutOfRangeError

EBS_BLOCK = 512 * 1024
PAGE_SIZE = 10000  # the most ListSnapshotBlocks / ListChangedBlocks return per call


class _Listing:
    """One EBS listing: the operation, its arguments, and the key of the block list in the answer."""

    def __init__(self, ebs: Ec2, operation: str, args: Mapping[str, str], key: str) -> None:
        self.ebs, self.operation, self.args, self.key = ebs, operation, dict(args), key

    def call(self, **extra: Any) -> dict[str, Any]:
        return self.ebs.call(self.operation, **self.args, MaxResults=PAGE_SIZE, **extra)


class EbsBlocks:
    def __init__(self, ec2: Ec2, ebs: Ec2) -> None:
        self._ec2 = ec2
        self._ebs = ebs

    def _completed(self, snapshot_id: str) -> dict[str, Any]:
        snap = self._ec2.describe_snapshot(snapshot_id)
        if snap.get("State") != "completed":
            raise FailedPreconditionError(
                f"snapshot {snapshot_id} is {snap.get('State', 'not ready')}; EBS serves its blocks once it "
                "has completed"
            )
        return snap

    def allocated(self, snapshot_id: str, start: int, block: int) -> BlockMap:
        sid = P.snapshot_id(snapshot_id)
        self._completed(sid)
        return self._walk(
            _Listing(self._ebs, "list_snapshot_blocks", {"SnapshotId": sid}, "Blocks"), start, block
        )

    def delta(self, base_id: str, target_id: str, start: int, block: int) -> BlockMap:
        base, target = P.snapshot_id(base_id), P.snapshot_id(target_id)
        first, second = self._completed(base), self._completed(target)
        if first.get("StartTime") and second.get("StartTime") and second["StartTime"] < first["StartTime"]:
            raise InvalidParameterError(
                f"target snapshot {target} was taken before base snapshot {base}; swap them"
            )
        args = {"FirstSnapshotId": base, "SecondSnapshotId": target}
        return self._walk(_Listing(self._ebs, "list_changed_blocks", args, "ChangedBlocks"), start, block)

    def _walk(self, listing: _Listing, start: int, block: int) -> BlockMap:
        """The first page is read now (its errors and the volume size decide the request); the rest as
        the ranges are consumed."""
        first = listing.call(StartingBlockIndex=start // EBS_BLOCK)
        size = int(first.get("BlockSize") or EBS_BLOCK)
        if size > EBS_BLOCK and start >= size:  # a larger block than EBS documents: ask again from there
            first = listing.call(StartingBlockIndex=start // size)
        volume = int(first.get("VolumeSize", 0)) * GiB
        if start > volume:
            raise OutOfRangeError(f"starting_offset {start} is past the end of the volume ({volume} bytes)")
        ranges = (
            Range(i * size, min(size, volume - i * size))
            for i in _indexes(listing, first)
            if (i + 1) * size > start  # an endpoint may ignore StartingBlockIndex
        )
        return BlockMap(volume, aligned(ranges, block, volume))


def _indexes(listing: _Listing, page: dict[str, Any]) -> Iterator[int]:
    """Block indexes of every page, ascending (an answer out of order is an error, never skipped)."""
    last = -1
    while True:
        for index in sorted(int(b["BlockIndex"]) for b in page.get(listing.key, [])):
            if index <= last:
                raise DriverError(f"EBS {listing.operation} returned block {index} after block {last}")
            last = index
            yield index
        token = page.get("NextToken")
        if not token:
            return
        page = listing.call(NextToken=token)
