"""Malformed request messages become INVALID_ARGUMENT, on every gRPC server of the cluster (bookie, broker).

By default grpc.aio answers a unary request its deserializer cannot parse with UNKNOWN ("Unexpected
DecodeError"), and hands a stream's handler an iterator that raises DecodeError, which each handler then
treats as its own kind of broken stream (an AddEntries stream even ended OK). `MalformedRequests`, a server
interceptor, gives every method a deserializer that never raises: bytes that do not parse become a
`Malformed` value, and the call ends with INVALID_ARGUMENT and a message naming the message type and the
parser's reason, before the handler sees it (unary request), or at the first malformed message of a request
stream (the status is sent at once; the handler sees the stream end as if the client had half-closed).

Contract: well-formed requests reach the handlers unchanged; nothing else is intercepted. The wrapped
handler of a method is built once and kept while the handler below it stays the same (one per registered
method: a bounded table).
"""
from __future__ import annotations

import inspect

import grpc
from google.protobuf.message import DecodeError

from bksim.security.handlers import around, rebuild


class Malformed:
    """A request message that did not parse."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe(deserializer):
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except DecodeError as e:
            return Malformed(f"malformed request message ({len(data)} bytes): {e}")
    return parse


async def _refuse(context, request: Malformed):
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)


async def _refuse_malformed(request, context) -> None:
    if isinstance(request, Malformed):
        await _refuse(context, request)


def _checked_requests(request_iterator, context):
    async def requests():
        async for request in request_iterator:
            if isinstance(request, Malformed):
                try:
                    await _refuse(context, request)
                except grpc.aio.AbortError:
                    return  # the status is sent: the handler sees the end of the stream
            yield request
    return requests()


def _stream_request(behavior):
    if inspect.isasyncgenfunction(behavior):
        async def stream_out(request_iterator, context):
            async for response in behavior(_checked_requests(request_iterator, context), context):
                yield response
        return stream_out

    async def unary(request_iterator, context):
        return await behavior(_checked_requests(request_iterator, context), context)
    return unary


def checked_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The same method with a deserializer that never raises and the refusal of malformed requests."""
    wrap = _stream_request if handler.request_streaming else (lambda inner: around(inner, before=_refuse_malformed))
    return rebuild(handler, wrap, request_deserializer=_safe(handler.request_deserializer))


class MalformedRequests(grpc.aio.ServerInterceptor):
    """The server interceptor: every registered method's handler through `checked_handler`."""

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: gRPC answers UNIMPLEMENTED
            return None
        method = handler_call_details.method
        cached = self._handlers.get(method)
        if cached is None or cached[0] is not handler:  # another interceptor may answer per call
            cached = self._handlers[method] = (handler, checked_handler(handler))
        return cached[1]


# The longest status message a server sends. The message travels as the grpc-message trailer, percent-encoded
# (up to 12 bytes per character), and a client drops trailers above 16 KiB: a refusal quoting a client's long
# input would reach the client as RESOURCE_EXHAUSTED "metadata size exceeds hard limit" instead of the reason.
DETAILS_CHARS_MAX = 1024


def bounded_details(message: str) -> str:
    """`message` cut to DETAILS_CHARS_MAX characters (saying how much was cut)."""
    if len(message) <= DETAILS_CHARS_MAX:
        return message
    return f"{message[:DETAILS_CHARS_MAX - 40]}... ({len(message)} characters, cut)"
