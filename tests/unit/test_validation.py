"""csi/validation.py's limits at their edges: the spec's 128-byte strings and 4 KiB maps, the characters
it bans, sizes that round past int64, and the filesystem floor a limit_bytes may equal."""

from __future__ import annotations

import pytest

from csi._proto import csi_pb2
from csi.failures import InvalidParameterError, OutOfRangeError
from csi.validation import (
    INT64_MAX,
    MAX_MAP_BYTES,
    MAX_STRING_BYTES,
    capacity_bytes,
    check_map,
    check_string,
    filesystem_floor,
)

MiB = 1024**2
XFS_FLOOR = 300 * MiB


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("v" * MAX_STRING_BYTES, id="128-bytes"),
        pytest.param("é" * (MAX_STRING_BYTES // 2), id="128-bytes-of-two-byte-characters"),
        pytest.param("a\tb\nc\rd", id="tab-newline-return"),
        pytest.param("a\x7eb", id="tilde-0x7e"),
        pytest.param("a\xa0b", id="no-break-space-0xa0"),
    ],
)
def test_check_string_accepts(value: str) -> None:
    check_string(value, "volume_id")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        pytest.param("v" * (MAX_STRING_BYTES + 1), "is longer than 128 bytes", id="129-bytes"),
        pytest.param("é" * (MAX_STRING_BYTES // 2) + "v", "is longer than 128 bytes", id="129-bytes-in-utf8"),
        pytest.param("a\x00b", "contains control characters", id="nul"),
        pytest.param("a\x1fb", "contains control characters", id="unit-separator-0x1f"),
        pytest.param("a\x7fb", "contains control characters", id="del-0x7f"),
        pytest.param("a\x80b", "contains control characters", id="c1-0x80"),
        pytest.param("a\x9fb", "contains control characters", id="c1-0x9f"),
    ],
)
def test_check_string_refuses(value: str, says: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"volume_id {says}"):
        check_string(value, "volume_id")


def _map_of(size: int) -> dict[str, str]:
    """A map whose keys and values hold `size` bytes in all."""
    return {"k": "v" * (size - 1)}


@pytest.mark.parametrize(
    ("size", "refused"),
    [
        pytest.param(MAX_MAP_BYTES, False, id="exactly-4KiB"),
        pytest.param(MAX_MAP_BYTES + 1, True, id="4097-bytes"),
    ],
)
def test_check_map_at_the_4KiB_edge(size: int, refused: bool) -> None:
    if refused:
        with pytest.raises(InvalidParameterError, match="parameters is larger than 4096 bytes"):
            check_map(_map_of(size), "parameters")
    else:
        check_map(_map_of(size), "parameters")


@pytest.mark.parametrize(
    ("required", "granularity", "expected"),
    [
        pytest.param(INT64_MAX - MiB + 1, MiB, INT64_MAX - MiB + 1, id="largest-whole-MiB-fits"),
        pytest.param(INT64_MAX, 1, INT64_MAX, id="int64-max-in-bytes-fits"),
        pytest.param(INT64_MAX, MiB, None, id="int64-max-rounds-to-2**63"),
        pytest.param(INT64_MAX - MiB + 2, MiB, None, id="just-past-the-last-whole-MiB"),
    ],
)
def test_capacity_rounded_past_int64_is_out_of_range(
    required: int, granularity: int, expected: int | None
) -> None:
    cr = csi_pb2.CapacityRange(required_bytes=required)
    if expected is None:
        with pytest.raises(OutOfRangeError, match="does not fit in 64 bits"):
            capacity_bytes(cr, default=MiB, granularity=granularity)
    else:
        assert capacity_bytes(cr, default=MiB, granularity=granularity) == expected


def _xfs() -> list[csi_pb2.VolumeCapability]:
    mode = csi_pb2.VolumeCapability.AccessMode(mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)
    return [
        csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(fs_type="xfs"), access_mode=mode)
    ]


@pytest.mark.parametrize(
    ("limit", "refused"),
    [
        pytest.param(XFS_FLOOR, False, id="limit-equal-to-the-floor"),
        pytest.param(XFS_FLOOR + 1, False, id="limit-above-the-floor"),
        pytest.param(XFS_FLOOR - 1, True, id="limit-one-byte-below"),
    ],
)
def test_an_xfs_limit_may_equal_its_floor(limit: int, refused: bool) -> None:
    cr = csi_pb2.CapacityRange(limit_bytes=limit)
    if refused:
        with pytest.raises(OutOfRangeError, match="an xfs filesystem needs a volume of at least 314572800"):
            filesystem_floor(cr, {}, _xfs())
    else:
        assert filesystem_floor(cr, {}, _xfs()) == XFS_FLOOR
