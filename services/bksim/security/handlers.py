"""Rebuilding a grpc.aio method handler around a new behaviour: the one tool of the server interceptors
(security/tls.py RoleCheck, security/broker_auth.py AuthInterceptor, adapters/grpc_input.py MalformedRequests).

A method handler is one of four kinds (a unary or streaming request, a unary or streaming response). A
behaviour with a streaming response is either an async generator (it yields the responses) or a coroutine
that writes them with `context.write`; gRPC refuses a behaviour that does both, so a wrapper keeps the form of
the behaviour it wraps.
"""
from __future__ import annotations

import inspect
from typing import Awaitable, Callable

import grpc

_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
          ("unary_stream", grpc.unary_stream_rpc_method_handler),
          ("stream_unary", grpc.stream_unary_rpc_method_handler),
          ("stream_stream", grpc.stream_stream_rpc_method_handler))


def rebuild(handler: grpc.RpcMethodHandler, wrap: Callable, request_deserializer=None) -> grpc.RpcMethodHandler:
    """The same method (kind, serializers) with the behaviour `wrap(behaviour)`; `request_deserializer`, when
    given, replaces the handler's."""
    for attribute, make in _KINDS:
        inner = getattr(handler, attribute)
        if inner is not None:
            return make(wrap(inner), request_deserializer or handler.request_deserializer,
                        handler.response_serializer)
    raise AssertionError(f"a gRPC method handler of no known kind: {handler!r}")


def around(inner: Callable, before: Callable[[object, object], Awaitable[None]] | None = None,
           scope: Callable[[], Callable[[], None]] | None = None) -> Callable:
    """`inner` with `await before(request, context)` first (it may abort the call) and, with `scope`, the
    behaviour run between `undo = scope()` and `undo()` (e.g. a context variable set for the call); of the
    same form as `inner` (async generator or coroutine)."""
    if inspect.isasyncgenfunction(inner):
        async def generator(request, context):
            if before is not None:
                await before(request, context)
            undo = scope() if scope is not None else None
            try:
                async for response in inner(request, context):
                    yield response
            finally:
                if undo is not None:
                    undo()
        return generator

    async def coroutine(request, context):
        if before is not None:
            await before(request, context)
        undo = scope() if scope is not None else None
        try:
            return await inner(request, context)
        finally:
            if undo is not None:
                undo()
    return coroutine
