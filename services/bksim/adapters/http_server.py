"""The HTTP side of a bookie or broker process: one aiohttp server in the process's own event loop, on
`bookie.http_port` / `broker.http_port` (0 = none).

Every feature adds its routes to the one `HttpServer` of its process before `start()`: Prometheus metrics
(`/metrics`), the admin API (BookKeeper's bookie endpoints, Pulsar's `/admin/v2/...`), the broker's dashboard.
A route handler is an aiohttp handler (`async def handler(request) -> web.Response`); `json_response` writes
JSON the way upstream's admin endpoints do (pretty-printed, `application/json`).

Bounds: a request body of at most REQUEST_BYTES_MAX (aiohttp answers 413 beyond it), at most
CONNECTIONS_MAX open connections (the rest wait in the listen backlog), idle keep-alive connections closed after
KEEPALIVE_S. A handler that raises ends with 500 and a one-line message (never a traceback to the client); the
process goes on.

Must not: block the event loop in a handler (reads of ZooKeeper and files go through the process's async ports
or `asyncio.to_thread`); serve anything but loopback unless configured to.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from aiohttp import web

REQUEST_BYTES_MAX = 1024 * 1024
CONNECTIONS_MAX = 256
KEEPALIVE_S = 15.0
SHUTDOWN_GRACE_S = 2.0


@dataclass
class ProcessParts:
    """What a route may read in its process: `kind` "bookie" or "broker", the Config, and the running parts by
    name (bookie: engine, server, gc, registration, zk; broker: service, topics, server, store, transport)."""
    kind: str
    config: Any
    parts: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str):
        try:
            return self.parts[name]
        except KeyError:
            raise AttributeError(name) from None


def json_response(value, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(value, indent=2, sort_keys=False) + "\n", status=status,
                        content_type="application/json")


def error_response(status: int, message: str) -> web.Response:
    """An error as upstream's admin API answers one: {"message": ...} with the HTTP status."""
    return json_response({"message": message}, status)


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 - one failed request must not take the process down
        return error_response(500, f"{request.path}: {type(e).__name__}: {e}"[:1024])


class HttpServer:
    """One process's HTTP server (module docstring)."""

    def __init__(self, host: str, port: int, log: Callable[[str], None] = lambda line: None) -> None:
        self.host, self.requested_port = host, port
        self.port: int | None = None
        self._log = log
        self.app = web.Application(client_max_size=REQUEST_BYTES_MAX, middlewares=[_errors])
        self._runner: web.AppRunner | None = None

    def add_routes(self, routes: Iterable[web.RouteDef]) -> None:
        """Add routes; only before start()."""
        self.app.add_routes(list(routes))

    async def start(self) -> int:
        """Listen; returns the bound port (an OSError, e.g. the port in use, propagates)."""
        self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=KEEPALIVE_S,
                                     shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.requested_port, backlog=CONNECTIONS_MAX)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the bound port of port 0
        self._log(f"HTTP server listening on {self.host}:{self.port}")
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
