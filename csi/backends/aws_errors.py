"""EC2 error codes mapped once to backend errors, and the one call wrapper that retries throttling.

Every EC2 request of the aws backend goes through `Ec2.call`: throttling and server-side failures are
retried with capped exponential backoff and jitter; when the retries are spent they surface as
TransientError (UNAVAILABLE, so the sidecar retries later). Any other error code is translated by
`AWS_ERRORS` into the BackendError subclass the CSI error table expects.
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

from csi.backends import base

log = logging.getLogger("ballast.aws")


class UnsupportedActionError(base.BackendError):
    """The endpoint does not implement this action (an older region, a partition, or an emulator)."""


# EC2 error code -> backend error class. Codes not listed become a plain BackendError (INTERNAL).
AWS_ERRORS: dict[str, type[base.BackendError]] = {
    # missing or malformed ids (a malformed id is "not found" by the Backend contract)
    "InvalidVolume.NotFound": base.NotFoundError,
    "InvalidVolumeID.Malformed": base.NotFoundError,
    "InvalidSnapshot.NotFound": base.NotFoundError,
    "InvalidSnapshotID.Malformed": base.NotFoundError,
    "InvalidID": base.NotFoundError,
    "InvalidInstanceID.NotFound": base.NotFoundError,
    "InvalidInstanceID.Malformed": base.NotFoundError,
    "InvalidAttachment.NotFound": base.NotFoundError,
    # bad input
    "InvalidParameterValue": base.InvalidParameterError,
    "InvalidParameterCombination": base.InvalidParameterError,
    "InvalidParameter": base.InvalidParameterError,
    "InvalidParameterDependency": base.InvalidParameterError,
    "MissingParameter": base.InvalidParameterError,
    "UnknownParameter": base.InvalidParameterError,
    "InvalidKMSKey.Id": base.InvalidParameterError,
    "InvalidTagKey.Malformed": base.InvalidParameterError,
    "InvalidNextToken": base.InvalidTokenError,
    "InvalidPaginationToken": base.InvalidTokenError,
    # idempotency: the client token was used before with other arguments
    "IdempotentParameterMismatch": base.AlreadyExistsError,
    # state
    "VolumeInUse": base.FailedPreconditionError,
    "IncorrectState": base.FailedPreconditionError,
    "InvalidVolume.ZoneMismatch": base.FailedPreconditionError,
    "InvalidSnapshot.InUse": base.FailedPreconditionError,
    "IncorrectInstanceState": base.FailedPreconditionError,
    "UnauthorizedOperation": base.FailedPreconditionError,
    "AuthFailure": base.FailedPreconditionError,
    "OptInRequired": base.FailedPreconditionError,
    # a modification is still running (EBS allows one per volume at a time): try again later
    "IncorrectModificationState": base.TransientError,
    # quotas and placement
    "VolumeLimitExceeded": base.LimitExceededError,
    "AttachmentLimitExceeded": base.LimitExceededError,
    "SnapshotLimitExceeded": base.LimitExceededError,
    "MaxIOPSLimitExceeded": base.LimitExceededError,
    "InsufficientVolumeCapacity": base.OutOfCapacityError,
    "InvalidZone.NotFound": base.OutOfCapacityError,
    # the endpoint lacks the action
    "InvalidAction": UnsupportedActionError,
    "UnsupportedOperation": UnsupportedActionError,
    "NotImplemented": UnsupportedActionError,
    # retried first, then TransientError
    "RequestLimitExceeded": base.TransientError,
    "Throttling": base.TransientError,
    "ThrottlingException": base.TransientError,
    "RequestThrottled": base.TransientError,
    "ServiceUnavailable": base.TransientError,
    "Unavailable": base.TransientError,
    "InternalError": base.TransientError,
    "InternalFailure": base.TransientError,
}

RETRIED_CODES = frozenset(code for code, klass in AWS_ERRORS.items() if klass is base.TransientError) - {
    "IncorrectModificationState"
}


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def translate(exc: ClientError, operation: str) -> base.BackendError:
    """The backend error for an EC2 ClientError; the message names the operation and EC2's reason."""
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "") or code
    klass = AWS_ERRORS.get(code, base.BackendError)
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
                    raise base.TransientError(f"EC2 {operation}: endpoint unreachable: {exc}") from exc
                log.info("EC2 %s: %s, retrying", operation, exc)
            except NoCredentialsError as exc:
                raise base.FailedPreconditionError(f"EC2 {operation}: no AWS credentials found") from exc
            except ParamValidationError as exc:
                raise base.InvalidParameterError(f"EC2 {operation}: {exc}") from exc
            except ResponseParserError as exc:
                raise UnsupportedActionError(
                    f"EC2 {operation}: the endpoint answered with something that is not an EC2 response"
                ) from exc
            except BotoCoreError as exc:
                raise base.BackendError(f"EC2 {operation}: {exc}") from exc
            self.retries += 1
            self._sleep(delays.pop(0))
