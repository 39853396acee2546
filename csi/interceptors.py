"""Shared plumbing for server interceptors that wrap every unary and server-streaming RPC handler.

A subclass says how to wrap one method's behaviour: `wrap` for unary calls, `wrap_stream` for calls
that answer with a stream of messages (the SnapshotMetadata service); optionally also the request
deserializer. The wrapped handler is built once per method and reused for every later call. Other
kinds of handlers (client streaming) pass through unchanged: the CSI services have none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

Behavior = Callable[[Any, grpc.ServicerContext], Any]
StreamBehavior = Callable[[Any, grpc.ServicerContext], Iterator[Any]]
if TYPE_CHECKING:  # generic in grpc-stubs only; the runtime classes take no type arguments
    Handler = grpc.RpcMethodHandler[Any, Any]
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


def deadline_passed(context: grpc.ServicerContext) -> bool:
    """Whether the call had a deadline and it has passed: a client gone for that reason, not cancelled."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


class MethodInterceptor(_Interceptor):
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        """The new behaviour of the unary `method` (the full "/package.Service/Method" name)."""
        raise NotImplementedError

    def wrap_stream(self, method: str, behavior: StreamBehavior) -> StreamBehavior:
        """The new behaviour of the server-streaming `method`: it returns the stream of responses."""
        raise NotImplementedError

    def deserializer(self, original: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
        return original

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method = handler_call_details.method
        cached = self._handlers.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        deserializer = self.deserializer(handler.request_deserializer)
        if handler.unary_unary is not None:
            wrapped = grpc.unary_unary_rpc_method_handler(
                self.wrap(method, handler.unary_unary),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.unary_stream is not None:
            wrapped = grpc.unary_stream_rpc_method_handler(
                self.wrap_stream(method, handler.unary_stream),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        else:
            return handler
        self._handlers[method] = wrapped
        return wrapped
