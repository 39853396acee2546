"""CreateVolume from an EBS snapshot or volume through the real gRPC server over moto: the capacity range
bounds the new volume, never its source. Spec, CapacityRange: required_bytes "MUST be at least this
big", limit_bytes "MUST not be bigger than this", and without a range the plugin MAY choose; so the
volume is as big as its source (in whole GiB) when the range allows it, and only a source past
limit_bytes is OUT_OF_RANGE. A repeat answers with the same volume."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from tests.aws.conftest import serving
from tests.csiclient import CsiClient, assert_code

AM = csi_pb2.VolumeCapability.AccessMode
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


@pytest.fixture
def served(make_backend: Callable[..., AwsBackend], tmp_path: Path) -> Iterator[tuple[CsiClient, AwsBackend]]:
    backend = make_backend()
    with serving(backend, f"{tmp_path}/csi.sock") as client:
        yield client, backend


def request(size_range: tuple[int, int] | None, content: csi_pb2.VolumeContentSource) -> Any:
    made = csi_pb2.CreateVolumeRequest(
        name="pvc-new", volume_capabilities=[MOUNT], volume_content_source=content
    )
    if size_range is not None:
        made.capacity_range.CopyFrom(
            csi_pb2.CapacityRange(required_bytes=size_range[0], limit_bytes=size_range[1])
        )
    return made


@pytest.mark.parametrize(
    ("source_gib", "size_range", "expected_gib"),
    [
        pytest.param(2, (GiB, 8 * GiB), 2, id="range-admits-the-source"),
        pytest.param(2, (GiB, 0), 2, id="required-below-the-source-no-limit"),
        pytest.param(120, None, 120, id="no-range-source-above-the-100-gib-default"),
        pytest.param(2, (4 * GiB, 0), 4, id="required-above-the-source"),
        pytest.param(2, (GiB, GiB), 0, id="source-past-the-limit-is-out-of-range"),
    ],
)
@pytest.mark.parametrize("kind", ["snapshot", "clone"])
def test_a_volume_from_a_source_is_at_least_as_big_as_the_source(
    served: tuple[CsiClient, AwsBackend],
    ec2: Any,
    kind: str,
    source_gib: int,
    size_range: tuple[int, int] | None,
    expected_gib: int,
) -> None:
    client, backend = served
    source = backend.create_volume("pvc-src", DiskOptions(size_bytes=source_gib * GiB)).id
    if kind == "snapshot":
        snap = backend.create_snapshot("snap-src", source, {}).id
        content = csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snap)
        )
    else:
        content = csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=source)
        )
    asked = request(size_range, content)
    if not expected_gib:
        assert_code(
            client.controller.CreateVolume, asked, grpc.StatusCode.OUT_OF_RANGE, contains="larger than"
        )
        return
    made = client.controller.CreateVolume(asked, timeout=60).volume
    assert made.capacity_bytes == expected_gib * GiB
    assert ec2.describe_volumes(VolumeIds=[made.volume_id])["Volumes"][0]["Size"] == expected_gib
    again = client.controller.CreateVolume(asked, timeout=60).volume
    assert (again.volume_id, again.capacity_bytes) == (made.volume_id, made.capacity_bytes)
