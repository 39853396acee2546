"""EC2 error codes mapped once to the csi.failures errors the CSI error table expects (`AWS_ERRORS`), and
which of them ec2.Ec2 retries before giving up (`RETRIED_CODES`)."""

from __future__ import annotations

from botocore.exceptions import ClientError

from csi import failures


class UnsupportedActionError(failures.DriverError):
    """The endpoint does not implement this action (an older region, a partition, or an emulator)."""


class IdempotentParameterMismatchError(failures.AlreadyExistsError):
    """EC2 knows the client token from a call with other arguments: a volume made with it, live or
    failed and gone (EC2 keeps a failed volume's token for hours). The create path tells the two apart;
    anything else answers ALREADY_EXISTS."""


# EC2 error code -> error class. Codes not listed become a plain DriverError (INTERNAL).
AWS_ERRORS: dict[str, type[failures.DriverError]] = {
    # missing or malformed ids (a malformed id is "not found" by the Backend contract)
    "InvalidVolume.NotFound": failures.NotFoundError,
    "InvalidVolumeID.Malformed": failures.NotFoundError,
    "InvalidSnapshot.NotFound": failures.NotFoundError,
    "InvalidSnapshotID.Malformed": failures.NotFoundError,
    "InvalidID": failures.NotFoundError,
    "InvalidInstanceID.NotFound": failures.NotFoundError,
    "InvalidInstanceID.Malformed": failures.NotFoundError,
    "InvalidAttachment.NotFound": failures.NotFoundError,
    # bad input
    "InvalidParameterValue": failures.InvalidParameterError,
    "InvalidParameterCombination": failures.InvalidParameterError,
    "InvalidParameter": failures.InvalidParameterError,
    "InvalidParameterDependency": failures.InvalidParameterError,
    "MissingParameter": failures.InvalidParameterError,
    "UnknownParameter": failures.InvalidParameterError,
    "InvalidKMSKey.Id": failures.InvalidParameterError,
    "InvalidTagKey.Malformed": failures.InvalidParameterError,
    # EC2 refusing this particular request (a modification the volume cannot take, an option the
    # region or instance lacks), not an action the endpoint lacks; the EBS CSI driver lists it among
    # the invalid-parameter codes too
    "UnsupportedOperation": failures.InvalidParameterError,
    "InvalidNextToken": failures.InvalidTokenError,
    "InvalidPaginationToken": failures.InvalidTokenError,
    # idempotency: the client token was used before with other arguments
    "IdempotentParameterMismatch": IdempotentParameterMismatchError,
    # state
    "VolumeInUse": failures.FailedPreconditionError,
    "IncorrectState": failures.FailedPreconditionError,
    "InvalidVolume.ZoneMismatch": failures.FailedPreconditionError,
    "InvalidSnapshot.InUse": failures.FailedPreconditionError,
    "IncorrectInstanceState": failures.FailedPreconditionError,
    "UnauthorizedOperation": failures.FailedPreconditionError,
    "AuthFailure": failures.FailedPreconditionError,
    "OptInRequired": failures.FailedPreconditionError,
    # a modification is still running (EBS allows one per volume at a time): try again later
    "IncorrectModificationState": failures.TransientError,
    # quotas and placement
    "VolumeLimitExceeded": failures.LimitExceededError,
    "AttachmentLimitExceeded": failures.LimitExceededError,
    "SnapshotLimitExceeded": failures.LimitExceededError,
    "MaxIOPSLimitExceeded": failures.LimitExceededError,
    "InsufficientVolumeCapacity": failures.OutOfCapacityError,
    "InvalidZone.NotFound": failures.OutOfCapacityError,
    # the endpoint lacks the action
    "InvalidAction": UnsupportedActionError,
    "NotImplemented": UnsupportedActionError,
    # the EBS direct APIs (ebs client: ListSnapshotBlocks, ListChangedBlocks)
    "ResourceNotFoundException": failures.NotFoundError,
    "ValidationException": failures.InvalidParameterError,
    "AccessDeniedException": failures.FailedPreconditionError,
    "ServiceQuotaExceededException": failures.LimitExceededError,
    "RequestThrottledException": failures.TransientError,
    "ConcurrentLimitExceededException": failures.TransientError,
    "InternalServerException": failures.TransientError,
    # retried first, then TransientError
    "RequestLimitExceeded": failures.TransientError,
    "Throttling": failures.TransientError,
    "ThrottlingException": failures.TransientError,
    "RequestThrottled": failures.TransientError,
    "ServiceUnavailable": failures.TransientError,
    "Unavailable": failures.TransientError,
    "InternalError": failures.TransientError,
    "InternalFailure": failures.TransientError,
}

RETRIED_CODES = frozenset(code for code, klass in AWS_ERRORS.items() if klass is failures.TransientError) - {
    "IncorrectModificationState"
}


# HTTP statuses of a server or gateway failing: without one of EC2's own error codes (an HTML page from
# a proxy or VPC endpoint, where botocore makes the status the code) they are transient.
SERVER_STATUSES = frozenset({500, 502, 503, 504})


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _bare_server_error(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in SERVER_STATUSES and error_code(exc) not in AWS_ERRORS


def retried(exc: ClientError) -> bool:
    """Whether Ec2 tries the call again: a code that says so (RETRIED_CODES), or a bare server error."""
    return error_code(exc) in RETRIED_CODES or _bare_server_error(exc)


# Codes by which EC2 (and the EBS direct APIs) refuse a request before acting on it: throttling.
THROTTLING_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "RequestThrottledException",
        "ConcurrentLimitExceededException",
    }
)


def may_have_acted(exc: ClientError) -> bool:
    """Whether a failed request may have taken effect all the same: a server failure (HTTP 5xx: a
    gateway's bare 502/504, EC2's InternalError) can come after EC2 carried the request out, as a lost
    connection can; throttling (even as a 503) is a refusal before anything was done."""
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return int(status) >= 500 and error_code(exc) not in THROTTLING_CODES


def translate(exc: ClientError, operation: str) -> failures.DriverError:
    """The backend error for an EC2 ClientError; the message names the operation and EC2's reason."""
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "") or code
    klass = failures.TransientError if _bare_server_error(exc) else AWS_ERRORS.get(code, failures.DriverError)
    return klass(f"EC2 {operation}: {code}: {message}")
