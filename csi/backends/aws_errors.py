"""EC2 error codes mapped once to backend errors, and the one call wrapper that retries throttling.

Every EC2 request of the aws backend goes through `Ec2.call`: throttling and server-side failures are
retried with capped exponential backoff and jitter; when the retries are spent they surface as
TransientError (UNAVAILABLE, so the sidecar retries later). Any other error code is translated by
`AWS_ERRORS` into the csi.failures error the CSI error table expects.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
)
from botocore.parsers import ResponseParserError

from csi import failures

log = logging.getLogger("ballast.aws")


class UnsupportedActionError(failures.DriverError):
    """The endpoint does not implement this action (an older region, a partition, or an emulator)."""


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
    "InvalidNextToken": failures.InvalidTokenError,
    "InvalidPaginationToken": failures.InvalidTokenError,
    # idempotency: the client token was used before with other arguments
    "IdempotentParameterMismatch": failures.AlreadyExistsError,
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
    "UnsupportedOperation": UnsupportedActionError,
    "NotImplemented": UnsupportedActionError,
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


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: ClientError, operation: str) -> failures.DriverError:
    """The backend error for an EC2 ClientError; the message names the operation and EC2's reason."""
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "") or code
    klass = AWS_ERRORS.get(code, failures.DriverError)
    return klass(f"EC2 {operation}: {code}: {message}")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter; `attempts` counts the first try."""

    attempts: int = 6
    initial: float = 0.2
    maximum: float = 5.0

    def delays(self) -> list[float]:
        return [random.uniform(0, min(self.maximum, self.initial * 2**i)) for i in range(self.attempts - 1)]


class Ec2:
    """A boto3 EC2 client behind one call site: retries, then maps errors.

    `sleep` is injectable so tests can count back-off without waiting.
    """

    def __init__(
        self, client: Any, backoff: Backoff | None = None, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.client = client
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self.retries = 0  # throttled / failed attempts that were retried (for tests and metrics)

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Invoke `client.<operation>(**params)` (operation in snake_case) and return the response."""
        method = getattr(self.client, operation)
        delays = self.backoff.delays()
        while True:
            try:
                response: dict[str, Any] = method(**params)
                return response
            except ClientError as exc:
                if error_code(exc) not in RETRIED_CODES or not delays:
                    raise translate(exc, operation) from exc
                log.info("EC2 %s: %s, retrying", operation, error_code(exc))
            except (ConnectionError, HTTPClientError) as exc:
                if not delays:
                    raise failures.TransientError(f"EC2 {operation}: endpoint unreachable: {exc}") from exc
                log.info("EC2 %s: %s, retrying", operation, exc)
            except NoCredentialsError as exc:
                raise failures.FailedPreconditionError(f"EC2 {operation}: no AWS credentials found") from exc
            except ParamValidationError as exc:
                raise failures.InvalidParameterError(f"EC2 {operation}: {exc}") from exc
            except ResponseParserError as exc:
                raise UnsupportedActionError(
                    f"EC2 {operation}: the endpoint answered with something that is not an EC2 response"
                ) from exc
            except BotoCoreError as exc:
                raise failures.DriverError(f"EC2 {operation}: {exc}") from exc
            self.retries += 1
            self._sleep(delays.pop(0))
