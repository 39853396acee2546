"""User tags (tagSpecification_N) may not use a tag key the driver writes or reads: such a tag would make
an identical retry ALREADY_EXISTS (CSISourceVolumeId), invent volume context or read-only publications,
or promise snapshot zones. Refused with INVALID_ARGUMENT naming the key, before anything reaches EC2."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from csi.backends.aws import AwsBackend
from csi.backends.aws import params as P
from csi.backends.base import DiskOptions, GiB
from csi.errors import status_for
from csi.failures import InvalidParameterError


def _driver_tag_keys() -> dict[str, str]:
    """Every tag key or key prefix params defines for the driver (TAG_PREFIX and TAG_DELETION_PREFIX
    are parameter prefixes)."""
    parameters = ("TAG_PREFIX", "TAG_DELETION_PREFIX")
    return {
        name: value
        for name, value in vars(P).items()
        if name.startswith("TAG_") and name not in parameters and isinstance(value, str)
    }


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("CSISourceVolumeId", id="clone-source"),
        pytest.param("ballast.dev/volume-context/fsType", id="volume-context"),
        pytest.param("ballast.dev/published-readonly/i-0123456789abcdef0", id="published-readonly"),
        pytest.param("ballast.dev/accessible-zones", id="snapshot-zones"),
        pytest.param("ballast.dev/anything-later", id="driver-namespace"),
        pytest.param("kubernetes.io/created-for/pvc/name", id="created-for-pvc"),
        pytest.param("kubernetes.io/created-for/pv/name", id="created-for-pv"),
    ],
)
def test_a_driver_tag_key_in_user_tags_is_invalid_and_nothing_is_created(
    backend: AwsBackend, ec2: Any, key: str
) -> None:
    with pytest.raises(InvalidParameterError, match=key) as raised:
        parameters = backend.validate_parameters({"tagSpecification_1": f"{key}=vol-0123456789abcdef0"})
        backend.create_volume("pvc-reserved", DiskOptions(size_bytes=GiB, parameters=parameters))
    assert status_for(raised.value)[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert ec2.describe_volumes()["Volumes"] == []


@pytest.mark.parametrize(("name", "key"), sorted(_driver_tag_keys().items()))
def test_every_tag_key_the_driver_defines_is_reserved(name: str, key: str) -> None:
    assert P.reserved_tag(key + "x" if key.endswith("/") else key), f"{name} ({key}) can be set by users"


@pytest.mark.parametrize(
    ("key", "reserved"),
    [
        pytest.param("aws:cloudformation:stack-name", True, id="aws-prefix"),
        pytest.param("AWS:x", True, id="aws-prefix-any-case"),
        pytest.param("team", False, id="plain"),
        pytest.param("kubernetes.io/cluster/prod", False, id="other-kubernetes-key"),
        pytest.param("example.com/ballast.dev/x", False, id="namespace-not-at-start"),
        pytest.param("csivolumename", False, id="other-case-of-a-driver-key"),
    ],
)
def test_only_the_driver_and_aws_keys_are_reserved(key: str, reserved: bool) -> None:
    """EC2 tag keys are case-sensitive: only AWS's `aws:` prefix is reserved in any case."""
    assert P.reserved_tag(key) is reserved
