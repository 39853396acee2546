"""The one family of errors the driver raises, from the OS layer up to the services. No grpc here.

Every class names one outcome a client can act on; csi/errors.py maps each to exactly one gRPC code and
is the only module that talks to gRPC about failures. The message goes to the CO as it is (Kubernetes
shows it in events): say what is wrong and what to do, never include a secret.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class DriverError(Exception):
    """Base of every expected failure; raised as is, it means the driver could not do the work
    (INTERNAL) and its message says why."""


class NotFoundError(DriverError):
    """The volume, snapshot, node or path does not exist (a malformed id counts as not found)."""


class AlreadyExistsError(DriverError):
    """An object with this name or at this path exists with incompatible arguments."""


class InvalidParameterError(DriverError):
    """A request field, parameter, id or value is malformed or unsupported."""


class OutOfRangeError(DriverError):
    """A size is outside what is allowed (too big, too small, shrinking)."""


class LimitExceededError(DriverError):
    """A quota or per-node limit would be exceeded (e.g. max volumes per node)."""


class OutOfCapacityError(DriverError):
    """Not enough space, or no placement satisfies the topology requirements."""


class FailedPreconditionError(DriverError):
    """The object is in a state that forbids the operation (published elsewhere, has dependents)."""


class TransientError(DriverError):
    """A temporary failure (throttling, timeout, backend unreachable): the caller should retry."""


class InvalidTokenError(DriverError):
    """A paging token was not issued by this backend or is no longer valid."""


class BusyError(DriverError):
    """Another operation on the same object is in progress; the caller retries later."""


class UnsupportedError(DriverError):
    """The driver, as configured, does not offer this operation."""


class GaveUpError(DriverError):
    """The client cancelled the call before it ran: it is not run."""


class DeadlineError(DriverError):
    """The call's deadline passed before it ran: it is not run."""


@contextlib.contextmanager
def os_failures() -> Iterator[None]:
    """OSError from the host becomes a DriverError (INTERNAL) with its actionable message."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise DriverError(f"{exc.strerror or exc}{where}") from exc
