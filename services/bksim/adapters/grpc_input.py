"""Malformed request messages become INVALID_ARGUMENT, on every gRPC server of the cluster (bookie, broker).

By default grpc.aio answers a unary request its deserializer cannot parse with UNKNOWN ("Unexpected
DecodeError"), and hands a stream's handler an iterator that raises DecodeError, which each handler then
treats as its own kind of broken stream (an AddEntries stream even ended OK). `MalformedRequests`, a server
interceptor, gives every method a deserializer that never raises: bytes that do not parse become a
`Malformed` value, and the call ends with INVALID_ARGUMENT and a message naming the message type and the
parser's reason, before the handler sees it (unary request), or at the first malformed message of a request
stream: the handler sees the stream end there as if the client had half-closed, answers what came before it and
ends, and then the call ends with that status. (Not at once, from the reading of the requests: an abort there,
while the handler may be writing an answer, now and then never reaches the client, which then waits for its
deadline: grpc.aio's status and a write racing on one call.)

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


class _Refusal:
    """Why a request stream was cut short (None: it was not)."""

    __slots__ = ("reason",)

    def __init__(self) -> None:
        self.reason: str | None = None


def _checked_requests(request_iterator, refusal: _Refusal):
    async def requests():
        async for request in request_iterator:
            if isinstance(request, Malformed):
                refusal.reason = request.reason
                return  # the handler sees the stream end as if the client had half-closed
            yield request
    return requests()


def _end_refused(context, refusal: _Refusal) -> None:
    """Once the handler has ended: INVALID_ARGUMENT for a stream cut at a malformed message (unless the handler
    already ended the call with a status of its own)."""
    if refusal.reason is not None and not context.done():
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(bounded_details(refusal.reason))


def _stream_request(behavior):
    if inspect.isasyncgenfunction(behavior):
        async def stream_out(request_iterator, context):
            refusal = _Refusal()
            async for response in behavior(_checked_requests(request_iterator, refusal), context):
                yield response
            _end_refused(context, refusal)
        return stream_out

    async def unary(request_iterator, context):
        refusal = _Refusal()
        response = await behavior(_checked_requests(request_iterator, refusal), context)
        _end_refused(context, refusal)
        return response
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
