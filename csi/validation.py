"""Pure request checks shared by the services. Each raises csi.failures.InvalidParameterError (or the
error of the code the CSI spec names) with a message saying what to fix; none touches the filesystem or
the backend."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from csi import keys, values
from csi._proto import csi_pb2
from csi.failures import InvalidParameterError, OutOfRangeError
from csi.filesystems import (
    DEFAULT_FS_TYPE,
    MIN_DEVICE_BYTES,
    mkfs_argv,
    parse_fs_type,
    requested_fs_type,
)
from csi.mkfs_limits import mkfs_floor

AccessMode = csi_pb2.VolumeCapability.AccessMode

# Spec "Size Limits": strings 128 bytes, maps 4 KiB.
MAX_STRING_BYTES = 128
MAX_MAP_BYTES = 4096
INT64_MAX = 2**63 - 1

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
        raise InvalidParameterError(f"{field} is required")


def check_string(value: str, field: str) -> None:
    """Within the spec's 128-byte limit and free of control characters the spec bans (U+0000-U+001F...)."""
    if len(value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
        raise InvalidParameterError(f"{field} is longer than {MAX_STRING_BYTES} bytes")
    if any((ord(c) < 0x20 and c not in "\t\n\r") or 0x7F <= ord(c) <= 0x9F for c in value):
        raise InvalidParameterError(f"{field} contains control characters")


def require_id(value: str, field: str) -> None:
    """A REQUIRED id: present, and within the spec's limits."""
    require(value, field)
    check_string(value, field)


def check_ids(request: Message) -> None:
    """Every id a request carries (`*_id` and `*_ids` fields, in nested messages too) within the spec's
    limits: over 128 bytes or holding control characters -> INVALID_ARGUMENT, in every RPC, before any
    lookup could answer NOT_FOUND. Whether an id is required is the handler's question."""

    def check(value: Any, field: FieldDescriptor, name: str) -> None:
        for item in value if field.is_repeated else [value]:
            check_string(item, name)

    _walk(request, _is_id, check, "")


def check_maps(request: Message) -> None:
    """Every map a request carries, in nested messages too, within the spec's 4 KiB -> else
    INVALID_ARGUMENT. Secrets are exempt: the driver does not read them, and a Kubernetes Secret the CO
    passes on (a certificate bundle, say) may be larger."""
    _walk(request, _is_limited_map, lambda value, _, name: check_map(value, name), "")


Leaf = Callable[[FieldDescriptor], bool]


Check = Callable[[Any, FieldDescriptor, str], None]


def _walk(request: Message, leaf: Leaf, check: Check, prefix: str) -> None:
    for field, nested in _fields(request.DESCRIPTOR, leaf):
        value = getattr(request, field.name)
        if not nested:
            check(value, field, prefix + field.name)
        elif field.is_repeated or request.HasField(field.name):
            for sub in value if field.is_repeated else [value]:
                _walk(sub, leaf, check, f"{prefix}{field.name}.")


@functools.cache
def _fields(message: Descriptor, leaf: Leaf) -> tuple[tuple[FieldDescriptor, bool], ...]:
    """(field, is a message to walk into) for the fields of `message` that are `leaf` fields or messages
    holding one at some depth. Worked out once per message type and kind of leaf."""
    found = []
    for field in message.fields:
        if leaf(field):
            found.append((field, False))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and _holds(field.message_type, leaf, set()):
            found.append((field, True))
    return tuple(found)


def _is_id(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_STRING and field.name.endswith(("_id", "_ids"))


def _is_limited_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    if entry is None or not entry.GetOptions().map_entry:
        return False
    options: Any = field.GetOptions()
    return field.name != "secrets" and not options.Extensions[csi_pb2.csi_secret]


def _holds(message: Descriptor | None, leaf: Leaf, seen: set[str]) -> bool:
    """Whether `message` (not a map entry) has a `leaf` field at some depth; `seen`: types already
    decided or being decided further up (a type that refers to itself)."""
    if message is None or message.full_name in seen or message.GetOptions().map_entry:
        return False
    seen.add(message.full_name)
    return any(
        leaf(f) or (f.type == FieldDescriptor.TYPE_MESSAGE and _holds(f.message_type, leaf, seen))
        for f in message.fields
    )


def check_map(values: Mapping[str, str], field: str) -> None:
    """Spec: maps are limited to 4 KiB in total (keys plus values)."""
    size = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
        for k, v in values.items()
    )
    if size > MAX_MAP_BYTES:
        raise InvalidParameterError(f"{field} is larger than {MAX_MAP_BYTES} bytes")


def is_block(cap: csi_pb2.VolumeCapability) -> bool:
    kind: str | None = cap.WhichOneof("access_type")
    return kind == "block"


def check_capability_form(cap: csi_pb2.VolumeCapability, field: str = "volume_capability") -> None:
    """A well-formed capability: an access type and a known access mode (not UNKNOWN). Whether the
    volume can serve it is check_capability's question."""
    if cap.WhichOneof("access_type") is None:
        raise InvalidParameterError(f"{field}: access_type (block or mount) is required")
    mode = cap.access_mode.mode
    if mode == AccessMode.UNKNOWN:
        raise InvalidParameterError(f"{field}: access_mode is required")
    if mode not in AccessMode.Mode.values():
        raise InvalidParameterError(f"{field}: unknown access mode {mode}")


def check_capability(cap: csi_pb2.VolumeCapability, field: str = "volume_capability") -> None:
    """One capability: well-formed, and no multi-node writers on a filesystem (a filesystem mounted
    read-write on two hosts at once is corrupted)."""
    check_capability_form(cap, field)
    mode = cap.access_mode.mode
    if cap.WhichOneof("access_type") == "mount" and mode in MULTI_NODE_WRITER_MODES:
        raise InvalidParameterError(
            f"{field}: {AccessMode.Mode.Name(mode)} is only supported with block access; "
            "a filesystem cannot be written from several nodes"
        )


def check_capabilities(caps: Iterable[csi_pb2.VolumeCapability], field: str = "volume_capabilities") -> None:
    caps = list(caps)
    require(caps, field)
    for i, cap in enumerate(caps):
        check_capability(cap, f"{field}[{i}]")


def check_not_negative(cr: csi_pb2.CapacityRange) -> None:
    """A negative required_bytes or limit_bytes is no size at all -> INVALID_ARGUMENT, before anything
    compares it with a size (which would answer OUT_OF_RANGE about a bound nobody can ask for)."""
    for field in ("required_bytes", "limit_bytes"):
        if getattr(cr, field) < 0:
            raise InvalidParameterError(
                f"capacity_range.{field} must not be negative, got {getattr(cr, field)}"
            )


def capacity_bytes(cr: csi_pb2.CapacityRange, *, default: int, granularity: int, minimum: int = 0) -> int:
    """Bytes to provision for a CapacityRange: at least required_bytes rounded up to `granularity`,
    never above limit_bytes. Neither set -> `default`. Spec: unsatisfiable -> OUT_OF_RANGE."""
    check_not_negative(cr)
    required, limit = cr.required_bytes, cr.limit_bytes
    if limit and required > limit:
        raise OutOfRangeError(f"required_bytes {required} is larger than limit_bytes {limit}")
    want = required or (min(default, limit) if limit else default)
    want = max(want, minimum)
    size = -(-want // granularity) * granularity
    if size > INT64_MAX:  # rounding up can pass the largest size a CSI message can carry
        raise OutOfRangeError(f"{want} bytes rounded up to {granularity}-byte units does not fit in 64 bits")
    if limit and size > limit:
        if required:
            raise OutOfRangeError(
                f"the smallest size this backend allocates at or above {required} bytes is {size} bytes, "
                f"which exceeds limit_bytes {limit}"
            )
        size = (limit // granularity) * granularity
        if size < max(minimum, 1):
            raise OutOfRangeError(
                f"limit_bytes {limit} is below the minimum volume size {max(minimum, granularity)}"
            )
    return size


def filesystem_floor(
    cr: csi_pb2.CapacityRange, context: Mapping[str, str], caps: Iterable[csi_pb2.VolumeCapability]
) -> int:
    """The least size a volume mounted with `caps` may have, for the filesystem each mount capability
    would get on the node (0 for block access): a volume its mkfs refuses could never be staged. A
    limit_bytes below the filesystem's own floor -> OUT_OF_RANGE naming the filesystem; a size asked for
    (required_bytes, else limit_bytes) below what an mkfs parameter needs (mkfs_limits.mkfs_floor) ->
    INVALID_ARGUMENT naming it. Without either bound the volume is made large enough."""
    check_not_negative(cr)
    wanted = sorted({requested_fs_type(fs, context) or DEFAULT_FS_TYPE for fs in _mounts(caps)})
    floor, fs = max(((MIN_DEVICE_BYTES.get(f, 0), f) for f in wanted), default=(0, ""))
    if cr.limit_bytes and cr.limit_bytes < floor:
        raise OutOfRangeError(
            f"an {fs} filesystem needs a volume of at least {floor} bytes; limit_bytes is {cr.limit_bytes}"
        )
    (least, key), fs = max(((mkfs_floor(f, context), f) for f in wanted), default=((0, ""), ""))
    asked = cr.required_bytes or cr.limit_bytes
    if asked and asked < least:
        raise InvalidParameterError(
            f"parameter {key}={context[key]}: mkfs.{fs} needs a volume of at least {least} bytes for it, "
            f"and {asked} bytes were asked for; ask for a larger volume or change {key}"
        )
    return max(floor, least)


def _mounts(caps: Iterable[csi_pb2.VolumeCapability]) -> list[str]:
    """The fs_type of each mount capability ('' where it names none)."""
    return [c.mount.fs_type for c in caps if c.HasField("mount")]


# ---- StorageClass parameters common to every backend

MAX_PARTITION = 128

# mkfs-related StorageClass parameter -> parser returning the normalised value (ValueError: "expected ...").
# Validated at CreateVolume and carried in volume_context under the same key. These are the ranges of
# any filesystem; what one filesystem takes is filesystems.mkfs_argv's question (check_format).
PARAMETER_PARSERS: dict[str, values.Parser] = {
    keys.BLOCK_SIZE: values.power_of_two(512, 65536),
    keys.INODE_SIZE: values.power_of_two(128, 4096),
    keys.BYTES_PER_INODE: values.whole(1024, 64 * 1024 * 1024),
    keys.NUMBER_OF_INODES: values.whole(1, 2**32 - 1),
    keys.EXT4_BIGALLOC: values.boolean,
    keys.EXT4_CLUSTER_SIZE: values.power_of_two(1024, 64 * 1024 * 1024),
}


def split_parameters(
    parameters: Mapping[str, str], caps: Iterable[csi_pb2.VolumeCapability]
) -> tuple[dict[str, str], dict[str, str]]:
    """(volume_context entries, backend parameters) of CreateVolume parameters for a volume used with
    `caps`.

    `csi.storage.k8s.io/` keys are dropped, except the fs type which (like the in-tree `fsType`) becomes
    volume_context `fsType`; PARAMETER_PARSERS keys are validated (check_format) and kept; everything
    else is returned for Backend.validate_parameters. A bad value -> INVALID_ARGUMENT naming the key.
    """
    context: dict[str, str] = {}
    rest: dict[str, str] = {}
    for key, value in parameters.items():
        if key in (keys.FS_TYPE, keys.FS_TYPE_LEGACY):
            if value:
                context[keys.VC_FS_TYPE] = values.checked(parse_fs_type, key, value)
        elif key in PARAMETER_PARSERS:
            context[key] = values.checked(PARAMETER_PARSERS[key], key, value)
        elif not key.startswith(keys.PREFIX_K8S):
            rest[key] = value
    check_format(context, caps)
    return context, rest


def sidecar_metadata(parameters: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The object names a sidecar passes among the parameters with --extra-create-metadata
    (keys.CLAIM_METADATA, keys.SNAPSHOT_METADATA), those of `names` that are set."""
    return {k: parameters[k] for k in names if parameters.get(k)}


def check_format(context: Mapping[str, str], caps: Iterable[csi_pb2.VolumeCapability]) -> None:
    """The mkfs options of a volume_context as NodeStageVolume will check them (filesystems.mkfs_argv),
    for the filesystem each mount capability would get on the node (filesystems.requested_fs_type);
    without a mount capability, for the fsType parameter or the default. What the node would refuse (an
    unsupported fs type too) -> INVALID_ARGUMENT naming the parameter and what is allowed, so no volume
    is created that can never be staged."""
    for fs in sorted({requested_fs_type(fs, context) for fs in _mounts(caps) or [""]}):
        mkfs_argv("/dev/null", fs, context, "parameter")


def strip_k8s_keys(parameters: Mapping[str, str]) -> dict[str, str]:
    """Parameters without the `csi.storage.k8s.io/` keys the Kubernetes sidecars add."""
    return {k: v for k, v in parameters.items() if not k.startswith(keys.PREFIX_K8S)}


def parse_partition(volume_context: Mapping[str, str]) -> int:
    """The `partition` volume attribute: absent/"0" -> 0 (whole device), else 1..128."""
    value = volume_context.get(keys.VC_PARTITION, "")
    if value in ("", "0"):
        return 0
    if not re.fullmatch(r"[1-9][0-9]{0,2}", value) or int(value) > MAX_PARTITION:
        raise InvalidParameterError(
            f"volume attribute {keys.VC_PARTITION}={value!r} must be a partition number 0..{MAX_PARTITION}"
        )
    return int(value)
