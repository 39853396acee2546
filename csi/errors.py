"""The one place where failures become gRPC status codes.

Handlers raise either a CsiError subclass (one per gRPC code) or a backend error; the ErrorInterceptor
turns both into a status with an actionable message. Anything else is a bug: it is logged once with its
stack and answered INTERNAL with a short message that carries no traceback text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from csi.backends import base
from csi.interceptors import Behavior, UnaryInterceptor

log = logging.getLogger("ballast.errors")


class CsiError(Exception):
    """A failure with a definite gRPC code. The message is shown to the CO."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgument(CsiError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CsiError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CsiError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(CsiError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class OutOfRange(CsiError):
    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(CsiError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Aborted(CsiError):
    code = grpc.StatusCode.ABORTED


class Unavailable(CsiError):
    code = grpc.StatusCode.UNAVAILABLE


class Unimplemented(CsiError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(CsiError):
    code = grpc.StatusCode.INTERNAL


# Backend error class -> gRPC code. Looked up along the exception's MRO, most specific first.
BACKEND_CODES: dict[type[base.BackendError], grpc.StatusCode] = {
    base.NotFoundError: grpc.StatusCode.NOT_FOUND,
    base.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    base.InvalidParameterError: grpc.StatusCode.INVALID_ARGUMENT,
    base.OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    base.LimitExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    base.OutOfCapacityError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    base.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    base.TransientError: grpc.StatusCode.UNAVAILABLE,
    base.InvalidTokenError: grpc.StatusCode.ABORTED,
    base.BackendError: grpc.StatusCode.INTERNAL,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The (code, message) a client sees for `exc`. Unexpected exceptions get a reference id, not details."""
    if isinstance(exc, CsiError):
        return exc.code, str(exc) or exc.code.name.lower()
    if isinstance(exc, base.BackendError):
        for klass in type(exc).__mro__:
            if klass in BACKEND_CODES:
                return BACKEND_CODES[klass], str(exc) or klass.__name__
    if isinstance(exc, NotImplementedError):
        # generated servicer base methods raise this for RPCs a service does not implement
        return grpc.StatusCode.UNIMPLEMENTED, "this RPC is not implemented by ballast"
    ref = os.urandom(6).hex()
    return grpc.StatusCode.INTERNAL, f"internal error (reference {ref}); the driver log has the details"


# An unknown varint field 536870911 = 1 (the highest field number): what `_lenient` parses in place of
# bytes that are not a valid request, so the handler can answer INVALID_ARGUMENT. gRPC itself would
# answer INTERNAL ("Exception deserializing request!") before any handler runs.
_UNDECODABLE_FIELD = 536870911
_UNDECODABLE = b"\xf8\xff\xff\xff\x0f\x01"


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception:  # DecodeError: malformed wire data, or a string that is not UTF-8
            return deserializer(_UNDECODABLE)

    return parse


def _undecodable(request: Any) -> bool:
    if not isinstance(request, Message) or request.ListFields():
        return False
    unknown = UnknownFieldSet(request)
    return any(unknown[i].field_number == _UNDECODABLE_FIELD for i in range(len(unknown)))


def _wrap(method: str, behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if _undecodable(request):
                raise InvalidArgument(
                    "the request could not be decoded: malformed protobuf, or a string field that is "
                    "not valid UTF-8"
                )
            return behavior(request, context)
        except Exception as exc:  # the single boundary where every failure becomes a status
            code, message = status_for(exc)
            if not isinstance(exc, CsiError | base.BackendError | NotImplementedError):
                log.error("%s failed unexpectedly: %s", method, message, exc_info=exc)
            context.abort(code, message)

    return handler


class ErrorInterceptor(UnaryInterceptor):
    """Turns raised exceptions into gRPC statuses for every unary RPC."""

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        return _wrap(method, behavior)

    def deserializer(self, original: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        return _lenient(original)
