"""Requested IOPS are capped like the EBS CSI driver caps them (docs/aws.md, StorageClass parameters):
explicit `iops` as well as `iopsPerGB` x size, at the type maximum and at the type's IOPS-per-GiB ratio
x size (never below the type minimum); below the minimum only with allowAutoIOPSPerGBIncrease. Checked
on what reaches moto's EC2."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from csi.backends.aws import AwsBackend
from csi.backends.base import DiskOptions, GiB
from csi.errors import status_for
from csi.failures import InvalidParameterError
from tests.aws.conftest import record_calls


def create(backend: AwsBackend, size_gib: int, parameters: dict[str, str]) -> str:
    options = DiskOptions(size_bytes=size_gib * GiB, parameters=backend.validate_parameters(parameters))
    return backend.create_volume("pvc-iops", options).id


@pytest.mark.parametrize(
    ("parameters", "size_gib", "iops"),
    [
        pytest.param({"type": "io1", "iops": "20000"}, 10, 500, id="io1-explicit-at-50-per-gib"),
        pytest.param({"type": "io1", "iops": "100000"}, 2000, 64000, id="io1-explicit-at-type-max"),
        pytest.param({"type": "io2", "iops": "300000"}, 4, 4000, id="io2-explicit-at-1000-per-gib"),
        pytest.param({"type": "io2", "iops": "300000"}, 400, 64000, id="io2-at-what-any-instance-mounts"),
        pytest.param(
            {"type": "io2", "iops": "300000", "blockExpress": "TRUE"}, 400, 256000, id="io2-block-express"
        ),
        pytest.param(
            {"type": "io2", "iopsPerGB": "500", "blockExpress": "true"}, 300, 150000, id="io2-be-per-gb"
        ),
        pytest.param({"type": "gp3", "iops": "90000"}, 200, 80000, id="gp3-explicit-at-type-max"),
        pytest.param({"type": "gp3", "iops": "20000"}, 100, 20000, id="gp3-explicit-above-the-old-16000"),
        pytest.param({"type": "gp3", "iops": "6000"}, 10, 5000, id="gp3-explicit-at-500-per-gib"),
        pytest.param({"type": "gp3", "iops": "4000"}, 1, 3000, id="gp3-small-capped-at-the-minimum"),
        pytest.param({"type": "gp3", "iopsPerGB": "1000"}, 4, 3000, id="gp3-per-gb-capped-at-the-minimum"),
        pytest.param(
            {"type": "io2", "iops": "50", "allowAutoIOPSPerGBIncrease": "true"},
            10,
            100,
            id="explicit-raised-to-the-minimum",
        ),
    ],
)
def test_requested_iops_are_capped_for_the_type_and_size(
    backend: AwsBackend, ec2: Any, parameters: dict[str, str], size_gib: int, iops: int
) -> None:
    volume_id = create(backend, size_gib, parameters)
    assert ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]["Iops"] == iops


@pytest.mark.parametrize(
    ("parameters", "size_gib"),
    [
        pytest.param({"type": "io1", "iops": "50"}, 10, id="io1-explicit"),
        pytest.param({"type": "gp3", "iops": "2000"}, 10, id="gp3-explicit"),
    ],
)
def test_iops_below_the_minimum_without_auto_increase_are_invalid(
    backend: AwsBackend, ec2: Any, parameters: dict[str, str], size_gib: int
) -> None:
    with pytest.raises(InvalidParameterError, match="allowAutoIOPSPerGBIncrease") as raised:
        create(backend, size_gib, parameters)
    assert status_for(raised.value)[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert ec2.describe_volumes()["Volumes"] == []


@pytest.mark.parametrize(
    ("parameters", "grown_gib", "iops"),
    [
        pytest.param(
            {"type": "io2", "iopsPerGB": "50", "allowAutoIOPSIncreaseOnModify": "true"},
            20,
            1000,
            id="ratio-kept",
        ),
        pytest.param(
            {"type": "io2", "iopsPerGB": "500", "allowAutoIOPSIncreaseOnModify": "true"},
            400,
            64000,
            id="capped-as-at-creation",
        ),
        pytest.param(
            {
                "type": "io2",
                "iopsPerGB": "500",
                "allowAutoIOPSIncreaseOnModify": "true",
                "blockExpress": "true",
            },
            400,
            200000,
            id="block-express-cap",
        ),
        pytest.param({"type": "io2", "iopsPerGB": "50"}, 20, 500, id="not-asked-for"),
        pytest.param(
            {"type": "io2", "iops": "500", "allowAutoIOPSIncreaseOnModify": "true"}, 20, 500, id="no-ratio"
        ),
    ],
)
def test_a_resize_keeps_the_iops_ratio_only_when_the_class_asked(
    backend: AwsBackend, ec2: Any, parameters: dict[str, str], grown_gib: int, iops: int
) -> None:
    """The EBS driver's allowAutoIOPSIncreaseOnModify: the grown volume gets iopsPerGB x its new size, in
    the same ModifyVolume as the size."""
    volume_id = create(backend, 10, parameters)
    modifications = record_calls(backend.ec2.client, "ModifyVolume")
    backend.expand_volume(volume_id, grown_gib * GiB)
    assert ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]["Iops"] == iops
    assert len(modifications) == 1


def test_a_resize_never_lowers_iops_the_volume_has_since_been_given(backend: AwsBackend, ec2: Any) -> None:
    """iopsPerGB 50 wants 1000 IOPS at 20 GiB; a volume raised to 5000 since (ControllerModifyVolume)
    keeps them: the grow's ModifyVolume carries no Iops."""
    parameters = {"type": "io2", "iopsPerGB": "50", "allowAutoIOPSIncreaseOnModify": "true"}
    volume_id = create(backend, 10, parameters)
    backend.modify_volume(volume_id, {"iops": "5000"})
    modifications = record_calls(backend.ec2.client, "ModifyVolume")
    backend.expand_volume(volume_id, 20 * GiB)
    assert [m.get("Iops") for m in modifications] == [None]
    assert ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]["Iops"] == 5000


def test_an_explicit_iops_in_the_same_modification_wins_over_the_ratio(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend(modify_window=0.5)  # long enough for both requests to join one batch
    parameters = {"type": "io2", "iopsPerGB": "50", "allowAutoIOPSIncreaseOnModify": "true"}
    volume_id = create(backend, 10, parameters)
    modifications = record_calls(backend.ec2.client, "ModifyVolume")
    with ThreadPoolExecutor(2) as pool:  # one coalesced ModifyVolume (coalesce.py)
        grown = pool.submit(backend.expand_volume, volume_id, 20 * GiB)
        tuned = pool.submit(backend.modify_volume, volume_id, {"iops": "700"})
        grown.result(), tuned.result()
    assert [(m["Size"], m["Iops"]) for m in modifications] == [(20, 700)]
