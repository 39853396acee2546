"""Pure request checks shared by the services. Each raises csi.errors.InvalidArgument (or the code the
CSI spec names) with a message saying what to fix; none touches the filesystem or the backend."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from csi._proto import csi_pb2
from csi.errors import InvalidArgument, OutOfRange

AccessMode = csi_pb2.VolumeCapability.AccessMode

# Spec "Size Limits": strings 128 bytes, maps 4 KiB.
MAX_STRING_BYTES = 128
MAX_MAP_BYTES = 4096

SINGLE_NODE_MODES = frozenset(
    {
        AccessMode.SINGLE_NODE_WRITER,
        AccessMode.SINGLE_NODE_READER_ONLY,
        AccessMode.SINGLE_NODE_SINGLE_WRITER,
        AccessMode.SINGLE_NODE_MULTI_WRITER,
    }
)
READ_ONLY_MODES = frozenset({AccessMode.SINGLE_NODE_READER_ONLY, AccessMode.MULTI_NODE_READER_ONLY})
MULTI_NODE_MODES = frozenset(
    {
        AccessMode.MULTI_NODE_READER_ONLY,
        AccessMode.MULTI_NODE_SINGLE_WRITER,
        AccessMode.MULTI_NODE_MULTI_WRITER,
    }
)
MULTI_NODE_WRITER_MODES = frozenset({AccessMode.MULTI_NODE_SINGLE_WRITER, AccessMode.MULTI_NODE_MULTI_WRITER})


def require(value: object, field: str) -> None:
    """Spec: a missing REQUIRED field is INVALID_ARGUMENT."""
    if not value:
        raise InvalidArgument(f"{field} is required")


def check_string(value: str, field: str) -> None:
    """Within the spec's 128-byte limit and free of control characters the spec bans (U+0000-U+001F...)."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        raise InvalidArgument(f"{field} is longer than {MAX_STRING_BYTES} bytes")
    if any((ord(c) < 0x20 and c not in "\t\n\r") or 0x7F <= ord(c) <= 0x9F for c in value):
        raise InvalidArgument(f"{field} contains control characters")


def check_map(values: Mapping[str, str], field: str) -> None:
    """Spec: maps are limited to 4 KiB in total (keys plus values)."""
    size = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in values.items()
    )
    if size > MAX_MAP_BYTES:
        raise InvalidArgument(f"{field} is larger than {MAX_MAP_BYTES} bytes")


def is_block(cap: csi_pb2.VolumeCapability) -> bool:
    return cap.WhichOneof("access_type") == "block"


def check_capability(cap: csi_pb2.VolumeCapability, field: str = "volume_capability") -> None:
    """One capability: an access type, a known access mode, and no multi-node writers on a filesystem
    (a filesystem mounted read-write on two hosts at once is corrupted)."""
    kind = cap.WhichOneof("access_type")
    if kind is None:
        raise InvalidArgument(f"{field}: access_type (block or mount) is required")
    mode = cap.access_mode.mode
    if mode == AccessMode.UNKNOWN:
        raise InvalidArgument(f"{field}: access_mode is required")
    if mode not in AccessMode.Mode.values():
        raise InvalidArgument(f"{field}: unknown access mode {mode}")
    if kind == "mount" and mode in MULTI_NODE_WRITER_MODES:
        raise InvalidArgument(
            f"{field}: {AccessMode.Mode.Name(mode)} is only supported with block access; "
            "a filesystem cannot be written from several nodes"
        )


def check_capabilities(caps: Iterable[csi_pb2.VolumeCapability], field: str = "volume_capabilities") -> None:
    caps = list(caps)
    require(caps, field)
    for i, cap in enumerate(caps):
        check_capability(cap, f"{field}[{i}]")


def capacity_bytes(cr: csi_pb2.CapacityRange, *, default: int, granularity: int, minimum: int = 0) -> int:
    """Bytes to provision for a CapacityRange: at least required_bytes rounded up to `granularity`,
    never above limit_bytes. Neither set -> `default`. Spec: unsatisfiable -> OUT_OF_RANGE."""
    required, limit = cr.required_bytes, cr.limit_bytes
    if required < 0 or limit < 0:
        raise OutOfRange("capacity_range values must not be negative")
    if limit and required > limit:
        raise OutOfRange(f"required_bytes {required} is larger than limit_bytes {limit}")
    want = required or (min(default, limit) if limit else default)
    want = max(want, minimum)
    size = -(-want // granularity) * granularity
    if limit and size > limit:
        if required:
            raise OutOfRange(
                f"the smallest size this backend allocates at or above {required} bytes is {size} bytes, "
                f"which exceeds limit_bytes {limit}"
            )
        size = (limit // granularity) * granularity
        if size < max(minimum, 1):
            raise OutOfRange(
                f"limit_bytes {limit} is below the minimum volume size {max(minimum, granularity)}"
            )
    return size
