"""The client's asyncio core: the event loop thread, the gRPC channels (one per broker address), lookups,
unary calls with fallback over the service addresses, and the reconnect back-off.

Threads: every gRPC object lives on one event loop that runs in a daemon thread (`LoopThread`); the sync
facade (client.py, producer.py, consumer.py) hands work to it with `run()` (wait for a coroutine, bounded)
or `call()` (fire and forget). Application callbacks (send_async) run on that thread: they must not block.

Bounds: a unary call waits at most `operation_timeout_s`; it tries each service address once, moving on only
when the broker did not answer (transport failure) — a broker's refusal is raised at once. A received gRPC
message is at most RECEIVE_BYTES_MAX bytes. `Backoff` gives increasing, jittered waits between reconnect
attempts, bounded by a number of attempts and an overall deadline.

TLS: `Connections(..., tls=...)` takes a security.tls.ChannelSecurity (CA, optional client certificate for
mutual TLS, hostname verification) or a CA file path (server authentication only); every broker channel is
then TLS. None is plaintext. A failed handshake counts as a broker that did not answer (UNAVAILABLE).

Tokens: `Connections(..., token=...)` sends "authorization: Bearer <token>" with every call (unary and
streams) through its stubs (security.tokens.BearerStub); the token is kept only there, never logged or put in an error.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import threading
import time
from typing import Iterable

import grpc

from bksim.adapters.event_loops import close_loop
from bksim.client.errors import ClientError, from_rpc_error
from bksim.gen import topic_pb2, topic_pb2_grpc
from bksim.security.tokens import BearerStub
from bksim.model.status import TopicStatus
from bksim.security.tls import ChannelSecurity, open_channel

log = logging.getLogger("bksim.client")

RECEIVE_BYTES_MAX = 64 * 1024 * 1024  # one Deliveries message: the broker packs at most a few batches' entries
OPERATION_TIMEOUT_MS_DEFAULT = 30_000  # unary calls, connecting a producer/consumer, and giving up reconnecting
BACKOFF_INITIAL_MS_DEFAULT = 100
BACKOFF_MAX_MS_DEFAULT = 2_000
RECONNECT_ATTEMPTS_MAX_DEFAULT = 100
LOOP_STOP_TIMEOUT_S = 5.0
REDIRECTS_MAX = 3  # NOT_OWNER redirects one owner-only unary call follows


def parse_service_url(service_url: str | Iterable[str]) -> list[str]:
    """"h1:p1,h2:p2" or ["h1:p1", ...] (an optional "bksim://" or "pulsar://" prefix is dropped) -> addresses."""
    items = service_url.split(",") if isinstance(service_url, str) else list(service_url)
    out = []
    for item in items:
        item = str(item).strip()
        for prefix in ("bksim://", "pulsar://", "grpc://"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        item = item.rstrip("/")
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ClientError(TopicStatus.BAD_REQUEST, f"service address {item!r} is not HOST:PORT")
        out.append(item)
    if not out:
        raise ClientError(TopicStatus.BAD_REQUEST, f"no broker address in service_url {service_url!r}")
    return list(dict.fromkeys(out))


class LoopThread:
    """An asyncio event loop running in its own daemon thread."""

    def __init__(self, name: str = "bksim-client") -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_exception)
        self._started = threading.Event()
        self._closing = False  # the owner is closing (begin_close, stop): the calls it cancels say so
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
        finally:
            close_loop(self.loop)

    @staticmethod
    def _on_exception(loop, context) -> None:
        log.error("bksim client event loop: %s", context.get("message"), exc_info=context.get("exception"))

    @property
    def in_loop(self) -> bool:
        return threading.get_ident() == self.thread.ident

    def run(self, coroutine, timeout_s: float | None):
        """Run `coroutine` on the loop and wait for its result (at most `timeout_s`; None = no bound)."""
        if self.in_loop:
            coroutine.close()
            raise RuntimeError("a blocking bksim client call was made from a client callback (the loop thread)")
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError:  # the loop is closed: the client was closed before the call
            coroutine.close()
            raise ClientError(TopicStatus.BAD_REQUEST, "the client is closed") from None
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClientError(TopicStatus.TIMEOUT,
                              f"the client did not finish the call within {timeout_s:.1f}s") from None
        except concurrent.futures.CancelledError:
            if self._closing:  # cancelled by the owner's close (its channels closing, or the loop stopping)
                raise ClientError(TopicStatus.BAD_REQUEST, "the client was closed during the call") from None
            raise

    def call(self, fn, *args) -> None:
        """Run `fn(*args)` on the loop soon (from any thread)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def begin_close(self) -> None:
        """The owner is closing: a blocking call cancelled from now on fails as "closed during the call"."""
        self._closing = True

    def stop(self) -> None:
        self._closing = True
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed meanwhile
            return
        if not self.in_loop:
            self.thread.join(LOOP_STOP_TIMEOUT_S)


def end_stream(call, outbox: asyncio.Queue | None) -> None:
    """End a streaming call whose requests come from `outbox` through an async generator: the generator
    returns (None is its end marker) so gRPC's task that drains it finishes, then the call is cancelled.
    (Cancelling alone can leave that task pending on the generator, to be destroyed later.)"""
    if outbox is not None:
        outbox.put_nowait(None)
    if call is not None:
        call.cancel()


class Backoff:
    """Waits between reconnect attempts: initial, doubling up to `max_s`, +-20% jitter; `expired()` after
    `attempts_max` attempts or `deadline_s` since `reset()`."""

    def __init__(self, initial_s: float, max_s: float, attempts_max: int, deadline_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.attempts_max = attempts_max
        self.deadline_s = deadline_s
        self.reset()

    def reset(self) -> None:
        self.attempts = 0
        self.started = time.monotonic()
        self._next_s = self.initial_s

    def expired(self) -> bool:
        return self.attempts >= self.attempts_max or time.monotonic() - self.started >= self.deadline_s

    def remaining_s(self) -> float:
        return max(0.0, self.deadline_s - (time.monotonic() - self.started))

    def next_delay_s(self) -> float:
        self.attempts += 1
        delay = self._next_s * random.uniform(0.8, 1.2)
        self._next_s = min(self.max_s, self._next_s * 2)
        return min(delay, self.remaining_s())


class Connections:
    """Channels and stubs by broker address, lookups and unary calls (all on the loop thread)."""

    def __init__(self, addresses: list[str], operation_timeout_s: float,
                 tls: ChannelSecurity | str | None = None, token: str | None = None) -> None:
        self.addresses = addresses
        self._token = token
        self.tls = ChannelSecurity(tls) if isinstance(tls, str) else tls  # a str is the CA file
        self.operation_timeout_s = operation_timeout_s
        self._channels: dict[str, tuple[grpc.aio.Channel, topic_pb2_grpc.TopicsStub]] = {}
        self._preferred = 0  # index of the service address that answered last

    def stub(self, address: str) -> topic_pb2_grpc.TopicsStub:
        entry = self._channels.get(address)
        if entry is None:
            channel = open_channel(address, [
                ("grpc.max_receive_message_length", RECEIVE_BYTES_MAX),
                ("grpc.max_send_message_length", -1),  # the broker decides what is too big
                ("grpc.enable_retries", 0),
            ], self.tls)
            stub = topic_pb2_grpc.TopicsStub(channel)
            entry = (channel, BearerStub(stub, self._token) if self._token else stub)
            self._channels[address] = entry
        return entry[1]

    async def unary(self, method: str, request, timeout_s: float | None = None):
        """Call `method` on a service address: the one that answered last first, then the others while the
        broker does not answer at all. A broker's refusal raises its ClientError at once."""
        timeout = timeout_s or self.operation_timeout_s
        n = len(self.addresses)
        last: ClientError | None = None
        for k in range(n):
            index = (self._preferred + k) % n
            address = self.addresses[index]
            try:
                response = await getattr(self.stub(address), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error(e, address)
                if error.from_broker:
                    raise error from None
                last = error
                continue
            self._preferred = index
            return response
        assert last is not None
        if n > 1:
            raise ClientError(last.status, f"no broker of {', '.join(self.addresses)} answered {method}: "
                                           f"{last.message}", grpc_code=last.grpc_code)
        raise last

    async def unary_owner(self, method: str, request, topic: str, timeout_s: float | None = None):
        """`method` at the broker that owns `topic` (Lookup first; again on NOT_OWNER, at most REDIRECTS_MAX
        times): for calls only a topic's owner answers (stats). A topic Lookup refuses (a partitioned topic's
        base name) goes to any broker."""
        timeout = timeout_s or self.operation_timeout_s
        error: ClientError | None = None
        for _ in range(REDIRECTS_MAX):
            try:
                address = await self.lookup(topic)
            except ClientError as e:
                if e.status is not TopicStatus.BAD_REQUEST:
                    raise
                return await self.unary(method, request, timeout_s)
            try:
                return await getattr(self.stub(address), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error(e, address)
                if error.status is not TopicStatus.NOT_OWNER:
                    raise error from None
        assert error is not None
        raise error

    async def lookup(self, topic: str) -> str:
        """The address of the broker that owns (or will own) `topic` (a partition or a non-partitioned topic)."""
        response = await self.unary("Lookup", topic_pb2.LookupRequest(topic=topic))
        if not response.address:
            raise ClientError(TopicStatus.SERVICE_UNAVAILABLE, f"lookup of {topic} named no broker")
        return response.address

    async def close(self) -> None:
        channels = [channel for channel, _ in self._channels.values()]
        self._channels.clear()
        for channel in channels:
            try:
                await channel.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
