"""Calling a gRPC servicer's method from an HTTP handler, so the admin endpoints (adapters/http_bookie_admin.py,
http_broker_admin.py) share every rule of the gRPC API (permission checks, admission bounds, refusals while
draining, validation) instead of restating them.

`CallContext` stands in for the grpc.aio ServicerContext: `abort(code, details)` raises `CallRefused` carrying
the gRPC code, the details and the trailers the servicer set ("bksim-status", "bksim-owner"); nothing else of
the context is used by the servicers called this way. `HTTP_OF_GRPC` maps a gRPC code to the HTTP status the
admin APIs of BookKeeper and Pulsar answer for the same kind of refusal.

Must not: log or echo tokens (the caller's role is set by the broker module, never the token).
"""
from __future__ import annotations

from aiohttp import web

HTTP_OF_GRPC = {
    "INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "FAILED_PRECONDITION": 412,
    "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504, "INTERNAL": 500, "UNKNOWN": 500,
}


class CallRefused(Exception):
    """A servicer ended the call: `code` the gRPC code name, `details` its message, `status` the bksim-status
    trailer ("" when none), `owner_address` the bksim-owner trailer."""

    def __init__(self, code: str, details: str, status: str = "", owner_address: str = "") -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details
        self.status = status
        self.owner_address = owner_address

    @property
    def http_status(self) -> int:
        return HTTP_OF_GRPC.get(self.code, 500)


class CallContext:
    """The part of grpc.aio.ServicerContext the unary servicer methods use (module docstring)."""

    def __init__(self) -> None:
        self.trailer: dict[str, str] = {}

    def set_trailing_metadata(self, metadata) -> None:
        self.trailer.update({str(k): str(v) for k, v in metadata})

    async def abort(self, code, details: str = "", trailing_metadata=()) -> None:
        self.set_trailing_metadata(trailing_metadata)
        name = getattr(code, "name", str(code))
        raise CallRefused(name, details, self.trailer.get("bksim-status", ""), self.trailer.get("bksim-owner", ""))


class Answer(Exception):
    """Ends a handler early with `response`."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.status)
        self.response = response


def answering(handler):
    """`handler` with an Answer it raises turned into its response."""
    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except Answer as a:
            return a.response
    return wrapped
