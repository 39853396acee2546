"""Shared plumbing for server interceptors that wrap every unary RPC handler.

A subclass says how to wrap one method's behaviour (`wrap`) and, optionally, its request
deserializer; the wrapped handler is built once per method and reused for every later call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

Behavior = Callable[[Any, grpc.ServicerContext], Any]
if TYPE_CHECKING:  # generic in grpc-stubs only; the runtime classes take no type arguments
    Handler = grpc.RpcMethodHandler[Any, Any]
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class UnaryInterceptor(_Interceptor):
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def wrap(self, method: str, behavior: Behavior) -> Behavior:
        """The new behaviour for `method` (the full "/package.Service/Method" name)."""
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
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self.wrap(method, handler.unary_unary),
            request_deserializer=self.deserializer(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
        self._handlers[method] = wrapped
        return wrapped
