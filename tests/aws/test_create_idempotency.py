"""CreateVolume for a name that exists answers with that volume only when every creation argument
matches what EC2 describes of it and what the driver's tags say (encryption and KMS key, IOPS,
throughput, Multi-Attach, the user's tags, besides size, type, source, zone and volume context);
otherwise ALREADY_EXISTS naming what differs. A volume expanded or modified since still answers a
replay of the request that created it, as the EBS CSI driver's client token makes EC2 answer it."""

from __future__ import annotations

from typing import Any

import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws.volumes import same_kms_key
from csi.backends.base import GiB
from csi.failures import AlreadyExistsError
from tests.aws.test_volumes import opts

KEY_A = "arn:aws:kms:us-east-1:123456789012:key/aaaaaaaa-0000-0000-0000-000000000000"
KEY_B = "arn:aws:kms:us-east-1:123456789012:key/bbbbbbbb-0000-0000-0000-000000000000"
IO2 = {"type": "io2", "iops": "1000"}
MULTI = {"multi_node": True, "block": True}


@pytest.mark.parametrize(
    ("first", "other", "problem"),
    [
        pytest.param({}, {"parameters": {"encrypted": "true"}}, "encryption", id="encrypted"),
        pytest.param(
            {"parameters": {"encrypted": "true", "kmsKeyId": KEY_A}},
            {"parameters": {"encrypted": "true", "kmsKeyId": KEY_B}},
            f"KMS key {KEY_A}",
            id="kms-key",
        ),
        pytest.param(
            {"parameters": IO2}, {"parameters": {"type": "io2", "iops": "5000"}}, "iops 1000", id="io2-iops"
        ),
        pytest.param({}, {"parameters": {"iops": "4000"}}, "iops 3000", id="gp3-iops-over-baseline"),
        pytest.param(
            {"parameters": {"throughput": "200"}},
            {"parameters": {"throughput": "500"}},
            "throughput 200 MiB/s",
            id="throughput",
        ),
        pytest.param(
            {}, {"parameters": {"throughput": "200"}}, "throughput 125", id="throughput-over-baseline"
        ),
        pytest.param(
            {"parameters": {"tagSpecification_1": "a=b"}},
            {"parameters": {"tagSpecification_1": "a=c"}},
            "tag a=b",
            id="tag-value",
        ),
        pytest.param({}, {"parameters": {"tagSpecification_1": "a=b"}}, "no a", id="tag-missing"),
        pytest.param(
            {"parameters": IO2}, {"parameters": IO2, **MULTI}, "Multi-Attach", id="multi-attach-asked"
        ),
        pytest.param(
            {"parameters": IO2, **MULTI}, {"parameters": IO2}, "Multi-Attach", id="multi-attach-not-asked"
        ),
    ],
)
def test_same_name_with_other_arguments_already_exists_and_the_same_ones_answer(
    backend: AwsBackend, first: dict[str, Any], other: dict[str, Any], problem: str
) -> None:
    created = backend.create_volume("pvc-same", opts(backend, 10, **first))
    assert backend.create_volume("pvc-same", opts(backend, 10, **first)).id == created.id
    with pytest.raises(AlreadyExistsError, match=f"{created.id} with different .*{problem}"):
        backend.create_volume("pvc-same", opts(backend, 10, **other))


@pytest.mark.parametrize(
    ("parameters", "size", "mutable", "replay", "problem"),
    [
        pytest.param({}, 20, {}, {}, None, id="expanded-original-replay"),
        pytest.param(IO2, 20, {"iops": "2000"}, {"parameters": IO2}, None, id="expanded-and-iops-modified"),
        pytest.param({}, None, {"type": "io2", "iops": "2000"}, {}, None, id="type-modified"),
        pytest.param({}, 20, {}, {"size_gib": 30}, "size 20 GiB", id="expanded-larger-than-now"),
        pytest.param(
            {},
            None,
            {"iops": "4000"},
            {"parameters": {"encrypted": "true"}},
            "encryption",
            id="modified-still-compares-encryption",
        ),
        pytest.param(
            {"tagSpecification_1": "a=b"},
            20,
            {},
            {"parameters": {"tagSpecification_1": "a=c"}},
            "tag a=b",
            id="expanded-still-compares-tags",
        ),
    ],
)
def test_a_volume_changed_since_answers_a_replay_of_its_creation(
    backend: AwsBackend,
    parameters: dict[str, str],
    size: int | None,
    mutable: dict[str, str],
    replay: dict[str, Any],
    problem: str | None,
) -> None:
    """EC2 describes only a volume's latest modification, so what a changed volume was created with is
    not known: a replay answers unless it asks for more than the volume has, or differs in what no
    modification changes."""
    created = backend.create_volume("pvc-changed", opts(backend, 10, parameters=parameters))
    if size is not None:
        backend.expand_volume(created.id, size * GiB)
    if mutable:
        backend.modify_volume(created.id, backend.validate_mutable_parameters(mutable))
    again = {"parameters": parameters, **replay}
    if problem is None:
        assert (
            backend.create_volume("pvc-changed", opts(backend, again.pop("size_gib", 10), **again)).id
            == created.id
        )
    else:
        with pytest.raises(AlreadyExistsError, match=problem):
            backend.create_volume("pvc-changed", opts(backend, again.pop("size_gib", 10), **again))


@pytest.mark.parametrize(
    ("requested", "described", "same"),
    [
        pytest.param(KEY_A, KEY_A, True, id="same-arn"),
        pytest.param(KEY_A.rsplit("/", 1)[-1], KEY_A, True, id="key-id-for-its-arn"),
        pytest.param(KEY_B, KEY_A, False, id="other-arn"),
        pytest.param(KEY_B.rsplit("/", 1)[-1], KEY_A, False, id="other-key-id"),
        pytest.param("alias/ebs-data", KEY_A, True, id="alias-not-resolvable"),
    ],
)
def test_kms_keys_compare_by_key_id(requested: str, described: str, same: bool) -> None:
    """EC2 describes the key ARN; the parameter may name the key by id, ARN or alias."""
    assert same_kms_key(requested, described) is same
