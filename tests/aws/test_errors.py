"""EC2 error codes -> backend errors -> gRPC codes, and throttling retries, with errors injected into a
real client talking to moto."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from botocore.exceptions import ClientError

from csi import failures
from csi.backends import base
from csi.backends.aws import AwsBackend
from csi.backends.aws.ec2 import Backoff, Ec2
from csi.backends.aws.errors import (
    AWS_ERRORS,
    IdempotentParameterMismatchError,
    UnsupportedActionError,
    translate,
)
from csi.errors import status_for
from tests.aws.conftest import inject_errors


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "because"}}, "CreateVolume")


@pytest.mark.parametrize(
    ("code", "klass", "grpc_code"),
    [
        pytest.param(
            "InvalidVolume.NotFound", failures.NotFoundError, grpc.StatusCode.NOT_FOUND, id="volume-missing"
        ),
        pytest.param(
            "InvalidInstanceID.NotFound", failures.NotFoundError, grpc.StatusCode.NOT_FOUND, id="node-missing"
        ),
        pytest.param(
            "IdempotentParameterMismatch",
            IdempotentParameterMismatchError,
            grpc.StatusCode.ALREADY_EXISTS,
            id="token-reuse",
        ),
        pytest.param(
            "InvalidParameterValue",
            failures.InvalidParameterError,
            grpc.StatusCode.INVALID_ARGUMENT,
            id="bad-value",
        ),
        pytest.param(
            "VolumeInUse", failures.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION, id="in-use"
        ),
        pytest.param(
            "AttachmentLimitExceeded",
            failures.LimitExceededError,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            id="node-full",
        ),
        pytest.param(
            "InsufficientVolumeCapacity",
            failures.OutOfCapacityError,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            id="capacity",
        ),
        pytest.param(
            "UnauthorizedOperation",
            failures.FailedPreconditionError,
            grpc.StatusCode.FAILED_PRECONDITION,
            id="iam",
        ),
        pytest.param(
            "RequestLimitExceeded", failures.TransientError, grpc.StatusCode.UNAVAILABLE, id="throttled"
        ),
        pytest.param(
            "IncorrectModificationState", failures.TransientError, grpc.StatusCode.UNAVAILABLE, id="modifying"
        ),
        pytest.param("InvalidNextToken", failures.InvalidTokenError, grpc.StatusCode.ABORTED, id="token"),
        pytest.param(  # a well-formed but foreign id: DeleteVolume of it must still answer OK
            "InvalidVolumeID.Malformed", failures.NotFoundError, grpc.StatusCode.NOT_FOUND, id="malformed-id"
        ),
        pytest.param(  # publish to a node in another zone
            "InvalidVolume.ZoneMismatch",
            failures.FailedPreconditionError,
            grpc.StatusCode.FAILED_PRECONDITION,
            id="zone-mismatch",
        ),
        pytest.param(  # RESOURCE_EXHAUSTED makes the external-provisioner reschedule with other topology
            "InvalidZone.NotFound",
            failures.OutOfCapacityError,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            id="zone-gone",
        ),
        pytest.param(
            "UnsupportedOperation",
            failures.InvalidParameterError,
            grpc.StatusCode.INVALID_ARGUMENT,
            id="request-refused",
        ),
        pytest.param("InvalidAction", UnsupportedActionError, grpc.StatusCode.INTERNAL, id="no-such-action"),
        pytest.param("NotImplemented", UnsupportedActionError, grpc.StatusCode.INTERNAL, id="not-impl"),
        pytest.param("SomethingNew", failures.DriverError, grpc.StatusCode.INTERNAL, id="unknown"),
    ],
)
def test_error_table(code: str, klass: type[failures.DriverError], grpc_code: grpc.StatusCode) -> None:
    error = translate(client_error(code), "create_volume")
    assert type(error) is klass
    assert code in str(error) and "because" in str(error)
    assert status_for(error)[0] == grpc_code


def test_every_mapped_class_has_a_grpc_code() -> None:
    for klass in set(AWS_ERRORS.values()):
        assert status_for(klass("x"))[0] != grpc.StatusCode.UNKNOWN


def test_unsupported_action_is_an_internal_backend_error() -> None:
    assert issubclass(UnsupportedActionError, failures.DriverError)


@pytest.mark.parametrize(
    "code", ["RequestLimitExceeded", "Throttling", "ServiceUnavailable", "InternalError"]
)
def test_throttling_is_retried_then_succeeds(make_backend: Callable[..., AwsBackend], code: str) -> None:
    backend = make_backend()
    pending = inject_errors(backend.ec2.client, "DescribeAvailabilityZones", [code, code, code])
    assert backend.probe() is True
    assert pending == [] and backend.ec2.retries == 3


def test_throttling_that_persists_becomes_transient(make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend(backoff=Backoff(attempts=3, initial=0.001, maximum=0.002))
    pending = inject_errors(backend.ec2.client, "DescribeVolumes", ["RequestLimitExceeded"] * 5)
    with pytest.raises(failures.TransientError, match="RequestLimitExceeded"):
        backend.get_volume("vol-0123456789abcdef0")
    assert len(pending) == 2  # three attempts used
    assert status_for(failures.TransientError("x"))[0] == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_bare_server_error_is_retried_and_then_unavailable(
    make_backend: Callable[..., AwsBackend], status: int
) -> None:
    """A gateway or VPC endpoint answering an HTML error page: botocore makes the status the code, which
    is none of EC2's. It is retried like throttling, then UNAVAILABLE, never INTERNAL."""
    backend = make_backend(backoff=Backoff(attempts=3, initial=0.001, maximum=0.002))
    pending = inject_errors(backend.ec2.client, "DescribeAvailabilityZones", [str(status)] * 2, status=status)
    assert backend.probe() is True and pending == []
    inject_errors(backend.ec2.client, "DescribeVolumes", [str(status)] * 3, status=status)
    with pytest.raises(failures.TransientError, match=str(status)):
        backend.get_volume("vol-0123456789abcdef0")


def test_a_client_error_status_without_a_known_code_is_not_retried(
    make_backend: Callable[..., AwsBackend],
) -> None:
    backend = make_backend()
    pending = inject_errors(backend.ec2.client, "DescribeVolumes", ["400", "400"], status=400)
    with pytest.raises(failures.DriverError) as raised:
        backend.get_volume("vol-0123456789abcdef0")
    assert type(raised.value) is failures.DriverError and len(pending) == 1


def test_non_throttling_errors_are_not_retried(make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend()
    pending = inject_errors(
        backend.ec2.client, "DescribeVolumes", ["UnauthorizedOperation", "UnauthorizedOperation"]
    )
    with pytest.raises(failures.FailedPreconditionError):
        backend.get_volume("vol-0123456789abcdef0")
    assert len(pending) == 1 and backend.ec2.retries == 0


def test_backoff_grows_and_is_capped() -> None:
    naps: list[float] = []

    class Throttled:
        def describe_volumes(self, **kwargs: Any) -> dict[str, Any]:
            raise client_error("Throttling")

    ec2 = Ec2(Throttled(), Backoff(attempts=8, initial=1.0, maximum=4.0), sleep=naps.append)
    with pytest.raises(failures.TransientError):
        ec2.call("describe_volumes")
    assert len(naps) == 7 and all(0 <= n <= 4.0 for n in naps)


def test_probe_fails_when_credentials_are_refused(make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend()
    inject_errors(backend.ec2.client, "DescribeAvailabilityZones", ["AuthFailure"], status=401)
    with pytest.raises(failures.FailedPreconditionError, match="AuthFailure"):
        backend.probe()


def test_node_only_probe_needs_no_ec2(make_backend: Callable[..., AwsBackend]) -> None:
    backend = make_backend(controller=False)
    pending = inject_errors(backend.ec2.client, "DescribeAvailabilityZones", ["AuthFailure"])
    assert backend.probe() is True and pending == ["AuthFailure"]


def test_create_retried_after_throttling_still_makes_one_volume(
    make_backend: Callable[..., AwsBackend], ec2: Any
) -> None:
    backend = make_backend()
    inject_errors(backend.ec2.client, "CreateVolume", ["RequestLimitExceeded"])
    disk = backend.create_volume("pvc-t", base.DiskOptions(size_bytes=base.GiB, parameters={"type": "gp3"}))
    found = ec2.describe_volumes(Filters=[{"Name": "tag:CSIVolumeName", "Values": ["pvc-t"]}])["Volumes"]
    assert [v["VolumeId"] for v in found] == [disk.id]
