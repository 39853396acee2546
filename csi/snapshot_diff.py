"""`ballast-csi snapshot-diff BASE TARGET --endpoint ...`: the changed ranges between two snapshots, asked
of a running driver over its SnapshotMetadata service (GetMetadataDelta) and printed as a table or JSON.

It reads the whole stream before printing anything, so a stream that fails prints no partial answer: the
error goes to stderr with the offset to resume from (--starting-offset), and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NamedTuple

import grpc

from csi._proto import csi_pb2, csi_pb2_grpc


class Diff(NamedTuple):
    block_type: str
    capacity: int
    ranges: list[tuple[int, int]]

    @property
    def changed_bytes(self) -> int:
        return sum(length for _, length in self.ranges)


def _target(endpoint: str) -> str:
    if endpoint.startswith("tcp://"):
        return endpoint[len("tcp://") :]
    return endpoint if endpoint.startswith("unix:") else f"unix://{endpoint}"


def _secrets(path: str) -> dict[str, str]:
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        loaded: Any = json.load(fh)
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ValueError(f"{path} must hold a JSON object of strings")
    return {str(k): v for k, v in loaded.items()}


def fetch(
    endpoint: str, request: csi_pb2.GetMetadataDeltaRequest, timeout: float, into: list[tuple[int, int]]
) -> Diff:
    """The whole delta; ranges are appended to `into` as they arrive (so a caller sees how far a failed
    stream got). grpc.RpcError when the stream fails."""
    block_type, capacity = "UNKNOWN", 0
    with grpc.insecure_channel(_target(endpoint)) as channel:
        stub = csi_pb2_grpc.SnapshotMetadataStub(channel)
        for response in stub.GetMetadataDelta(request, timeout=timeout):
            block_type = csi_pb2.BlockMetadataType.Name(response.block_metadata_type)
            capacity = response.volume_capacity_bytes
            into.extend((b.byte_offset, b.size_bytes) for b in response.block_metadata)
    return Diff(block_type, capacity, into)


def render_table(diff: Diff) -> str:
    share = 100.0 * diff.changed_bytes / diff.capacity if diff.capacity else 0.0
    lines = [
        f"block type: {diff.block_type}    volume: {diff.capacity} bytes ({diff.capacity / 1024**3:.2f} GiB)",
        f"{'OFFSET':>16} {'LENGTH':>12} {'END':>16}",
        *(f"{offset:>16} {length:>12} {offset + length:>16}" for offset, length in diff.ranges),
        f"{len(diff.ranges)} range(s), {diff.changed_bytes} bytes changed ({share:.2f}% of the volume)",
    ]
    return "\n".join(lines)


def render_json(diff: Diff, base: str, target: str) -> str:
    return json.dumps(
        {
            "base_snapshot_id": base,
            "target_snapshot_id": target,
            "block_metadata_type": diff.block_type,
            "volume_capacity_bytes": diff.capacity,
            "changed_bytes": diff.changed_bytes,
            "ranges": [{"offset": o, "length": n} for o, n in diff.ranges],
        },
        indent=2,
    )


def run_snapshot_diff(ns: argparse.Namespace, endpoint: str) -> int:
    try:
        secrets = _secrets(ns.secrets_file)
    except (OSError, ValueError) as exc:
        print(f"ballast-csi: --secrets-file: {exc}", file=sys.stderr)
        return 2
    request = csi_pb2.GetMetadataDeltaRequest(
        base_snapshot_id=ns.base,
        target_snapshot_id=ns.target,
        starting_offset=ns.starting_offset,
        max_results=ns.max_results,
        secrets=secrets,
    )
    received: list[tuple[int, int]] = []
    try:
        diff = fetch(endpoint, request, ns.timeout, received)
    except grpc.RpcError as err:
        resume = received[-1][0] + received[-1][1] if received else ns.starting_offset
        print(
            f"ballast-csi: snapshot-diff failed after {len(received)} range(s): {err.code().name}: "
            f"{err.details()}; resume with --starting-offset {resume}",
            file=sys.stderr,
        )
        return 1
    print(render_table(diff) if ns.output == "table" else render_json(diff, ns.base, ns.target))
    return 0
