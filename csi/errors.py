"""The one place where failures become gRPC status codes.

Handlers, validation, the OS layer and backends raise the grpc-free errors of csi/failures.py; the
ErrorInterceptor turns each into the code `CODES` names, with its message. Anything else is a bug: it is
logged once with its stack and answered INTERNAL with a short message that carries no traceback text.
A server-streaming call that fails after some messages were sent ends with the same status (the spec's
"abort the stream"): a client can always tell a failed stream from a complete one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from csi import failures
from csi.interceptors import Behavior, MethodInterceptor, StreamBehavior
from csi.validation import check_maps

log = logging.getLogger("ballast.errors")

# Error class -> gRPC code. Looked up along the exception's MRO, most specific first.
CODES: dict[type[failures.DriverError], grpc.StatusCode] = {
    failures.NotFoundError: grpc.StatusCode.NOT_FOUND,
    failures.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    failures.InvalidParameterError: grpc.StatusCode.INVALID_ARGUMENT,
    failures.OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    failures.LimitExceededError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    failures.OutOfCapacityError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    failures.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    failures.TransientError: grpc.StatusCode.UNAVAILABLE,
    failures.InvalidTokenError: grpc.StatusCode.ABORTED,
    failures.BusyError: grpc.StatusCode.ABORTED,
    failures.UnsupportedError: grpc.StatusCode.UNIMPLEMENTED,
    failures.GaveUpError: grpc.StatusCode.CANCELLED,
    failures.DeadlineError: grpc.StatusCode.DEADLINE_EXCEEDED,
    failures.DriverError: grpc.StatusCode.INTERNAL,
}


# A status message travels in one HTTP/2 header, percent-encoded (up to 12 bytes per character), and
# gRPC drops a call whose headers pass 16 KiB (the client then sees RESOURCE_EXHAUSTED, not our code).
# Messages that quote a long input are cut to this many characters.
MESSAGE_LIMIT = 1024


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The (code, message) a client sees for `exc`. Unexpected exceptions get a reference id, not details."""
    if isinstance(exc, failures.DriverError):
        for klass in type(exc).__mro__:
            if klass in CODES:
                return CODES[klass], _bounded(str(exc) or klass.__name__)
    if isinstance(exc, NotImplementedError):
        # generated servicer base methods raise this for RPCs a service does not implement
        return grpc.StatusCode.UNIMPLEMENTED, "this RPC is not implemented by ballast"
    ref = os.urandom(6).hex()
    return grpc.StatusCode.INTERNAL, f"internal error (reference {ref}); the driver log has the details"


def _bounded(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 40] + f"... ({len(message) - MESSAGE_LIMIT + 40} characters cut)"


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


def _check_decodable(request: Any) -> None:
    """A request gRPC could not parse, or one whose maps are over the spec's size limit ->
    InvalidParameterError, before any handler runs."""
    if _undecodable(request):
        raise failures.InvalidParameterError(
            "the request could not be decoded: malformed protobuf, or a string field that is not valid UTF-8"
        )
    if isinstance(request, Message):
        check_maps(request)


def _abort(method: str, exc: Exception, context: grpc.ServicerContext) -> None:
    """The single boundary where every failure becomes a status."""
    code, message = status_for(exc)
    if not isinstance(exc, failures.DriverError | NotImplementedError):
        log.error("%s failed unexpectedly: %s", method, message, exc_info=exc)
    context.abort(code, message)


def _wrap(method: str, behavior: Behavior) -> Behavior:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            _check_decodable(request)
            return behavior(request, context)
        except Exception as exc:
            _abort(method, exc, context)

    return handler


def _wrap_stream(method: str, behavior: StreamBehavior) -> StreamBehavior:
    def handler(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            _check_decodable(request)
            yield from behavior(request, context)
        except Exception as exc:  # before the first message or mid-stream: the stream ends with a status
            _abort(method, exc, context)

    return handler


class ErrorInterceptor(MethodInterceptor):
    """Turns raised exceptions into gRPC statuses for every unary and server-streaming RPC."""

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        return _wrap(method, behavior)

    def wrap_stream(self, method: str, behavior: StreamBehavior) -> StreamBehavior:
        return _wrap_stream(method, behavior)

    def deserializer(self, original: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        return _lenient(original)
