"""SnapshotMetadata service (CSI v1.10+, alpha): the allocated blocks of a snapshot and the changed
blocks between two snapshots of one volume, each as a server-side stream.

The request does not choose how ranges are described, so the driver does (--snapshot-metadata-block-type,
--snapshot-metadata-block-size): VARIABLE_LENGTH sends merged ranges, FIXED_LENGTH the same bytes split
into blocks of the configured size. Both are computed at that block size, so they describe the same
bytes. Spec contracts kept here:
- ranges ascending and never overlapping, within one message and across messages;
- at most `max_results` ranges per message (0: BATCH), and never more than MAX_PER_MESSAGE, so a
  message stays under gRPC's default 4 MiB receive limit (spec: the plugin "is always free to send
  less than the requested value");
- `starting_offset` resumes: nothing that ends before it is sent;
- errors: a missing argument or a negative max_results -> INVALID_ARGUMENT; an unknown snapshot ->
  NOT_FOUND; a negative offset or one past the volume -> OUT_OF_RANGE; metadata unavailable ->
  FAILED_PRECONDITION; a failure after the first message aborts the stream with a status (csi.errors),
  so a client never mistakes a broken stream for a complete one.
Every check that can be made before the first message is made before it. The request's secrets go to
the backend and nowhere else (csi.logs never logs them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import grpc

from csi import extents
from csi._proto import csi_pb2, csi_pb2_grpc
from csi.backends.base import Backend, BlockMap
from csi.failures import DeadlineError, GaveUpError, InvalidParameterError, OutOfRangeError
from csi.interceptors import deadline_passed
from csi.validation import require_id

BATCH = 1024  # ranges per message when the request sets no max_results
MAX_PER_MESSAGE = 65536  # a BlockMetadata takes at most 24 bytes on the wire: 1.5 MiB a message


class MetadataSettings(NamedTuple):
    """How ranges are described: FIXED_LENGTH blocks of `block_size`, or merged VARIABLE_LENGTH ranges."""

    fixed: bool
    block_size: int

    @property
    def wire_type(self) -> Any:
        return csi_pb2.FIXED_LENGTH if self.fixed else csi_pb2.VARIABLE_LENGTH


def _check(snapshot_ids: list[tuple[str, str]], offset: int, max_results: int) -> None:
    for value, field in snapshot_ids:
        require_id(value, field)
    if offset < 0:
        raise OutOfRangeError(f"starting_offset must not be negative, got {offset}")
    if max_results < 0:
        raise InvalidParameterError(f"max_results must not be negative, got {max_results}")


class SnapshotMetadataService(csi_pb2_grpc.SnapshotMetadataServicer):
    def __init__(self, backend: Backend, settings: MetadataSettings) -> None:
        self._backend = backend
        self._settings = settings

    def GetMetadataAllocated(
        self, request: csi_pb2.GetMetadataAllocatedRequest, context: grpc.ServicerContext
    ) -> Iterator[csi_pb2.GetMetadataAllocatedResponse]:
        """The snapshot's ranges holding data, from `starting_offset`."""
        _check([(request.snapshot_id, "snapshot_id")], request.starting_offset, request.max_results)
        blocks = self._backend.snapshot_allocated(
            request.snapshot_id, request.starting_offset, self._settings.block_size, dict(request.secrets)
        )
        return self._stream(csi_pb2.GetMetadataAllocatedResponse, blocks, request.max_results)

    def GetMetadataDelta(
        self, request: csi_pb2.GetMetadataDeltaRequest, context: grpc.ServicerContext
    ) -> Iterator[csi_pb2.GetMetadataDeltaResponse]:
        """The ranges whose bytes differ between the base and the (later) target, from `starting_offset`."""
        ids = [
            (request.base_snapshot_id, "base_snapshot_id"),
            (request.target_snapshot_id, "target_snapshot_id"),
        ]
        _check(ids, request.starting_offset, request.max_results)
        blocks = self._backend.snapshot_delta(
            request.base_snapshot_id,
            request.target_snapshot_id,
            request.starting_offset,
            self._settings.block_size,
            dict(request.secrets),
            wanted=context.is_active,
        )
        return _left_alone(
            context, self._stream(csi_pb2.GetMetadataDeltaResponse, blocks, request.max_results)
        )

    def _stream(self, response: Any, blocks: BlockMap, max_results: int) -> Iterator[Any]:
        """Messages of at most `max_results` ranges; one empty message when there are none, so the
        client still learns the volume's size and the block type."""
        kind, per = self._settings.wire_type, min(max_results or BATCH, MAX_PER_MESSAGE)
        ranges = (
            extents.fixed(blocks.ranges, self._settings.block_size) if self._settings.fixed else blocks.ranges
        )
        batch: list[csi_pb2.BlockMetadata] = []
        sent = False
        for r in ranges:
            batch.append(csi_pb2.BlockMetadata(byte_offset=r.offset, size_bytes=r.length))
            if len(batch) == per:
                yield response(
                    block_metadata_type=kind, volume_capacity_bytes=blocks.volume_bytes, block_metadata=batch
                )
                batch, sent = [], True
        if batch or not sent:
            yield response(
                block_metadata_type=kind, volume_capacity_bytes=blocks.volume_bytes, block_metadata=batch
            )


def _left_alone(context: grpc.ServicerContext, messages: Iterator[Any]) -> Iterator[Any]:
    """The messages, until the scan behind them stops because the client left: then the call ends as the
    client ended it (cancelled, or its deadline passed) instead of running the scan to its end."""
    try:
        yield from messages
    except extents.Abandoned:
        if deadline_passed(context):
            raise DeadlineError("the deadline passed while changed blocks were scanned") from None
        raise GaveUpError("the client left while changed blocks were scanned") from None
