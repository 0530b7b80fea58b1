"""One partition's stream to the broker that owns it, and its lifecycle: shared by the producer (Produce
streams) and the consumer (Subscribe streams).

Lifecycle (all on the client's loop thread):
1. connect: look the partition up (or use the owner a NOT_OWNER named), open the stream with the role's open
   request, and wait at most `operation_timeout_s` for the broker's first answer: the stream is up only when
   that answer is the role's `ready` message (an in-band Error, or the stream ending, is a failed attempt);
2. serve: hand every message the broker sends to the role until the stream ends (EOF, an in-band Error, the
   transport failing, or the role finding the answer wrong);
3. reconnect: on a retriable end (ClientError.retriable: NOT_OWNER, TOPIC_FENCED, SERVICE_UNAVAILABLE, a
   transport failure — one that the broker did not answer, BrokerCallError.answered False, including a
   transport-level INTERNAL) look up again and connect, waiting between attempts (core.Backoff: increasing,
   jittered, bounded by attempts and by the operation timeout). While reconnecting, the role's busy status
   (the broker still holds this name's previous stream) counts as retriable too;
4. close: `stop()` half-closes the stream (the broker ends it after the last answer), waits at most
   CLOSE_WAIT_S, then cancels it.

What differs between producer and consumer is the role (`StreamRole`): the request that opens the stream, what
to do once it is up (the producer takes the broker's last sequence id; the consumer grants its permits and
sends the acks it kept), an optional writer task while it is up (the producer's Sends), the handling of each
answer, and what to do when a stream is lost (the producer puts its un-receipted Sends back first, in order, and
may fail just the oldest batch on a per-Send refusal; the consumer drops the messages it queued and fails the
requests waiting for an answer). A non-retriable end, or giving up reconnecting, fails the role (`fail`).

`start()` returns once the first stream is up; it raises the first attempt's error when that is not retriable,
or the give-up error.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Coroutine, Protocol

import grpc

from bksim.client.core import end_stream
from bksim.client.errors import ClientError, from_error_pb, from_rpc_error
from bksim.model.status import TopicStatus

CLOSE_WAIT_S = 2.0  # how long stop() waits for the broker to end a half-closed stream


@dataclass(frozen=True, slots=True)
class StreamKind:
    """The fixed facts of one kind of stream."""
    method: str  # the Topics RPC: "Produce" | "Subscribe"
    open_name: str  # the opening request, as error messages name it
    ready_kind: str  # the response kind that says the stream is up
    stream_name: str  # "produce" | "subscribe", as error messages name the stream
    ready_words: str  # "the producer was ready", as error messages say what did not happen
    busy_status: TopicStatus  # the refusal that means the broker still holds this name's previous stream


class StreamRole(Protocol):
    """What the producer or the consumer of one partition does at each point of the stream's lifecycle."""

    def open_request(self, name: str) -> Any:
        """The request that opens a stream (the name the broker gave last, "" the first time)."""

    def opened(self, response: Any) -> str:
        """The broker accepted the stream (`response` is its ready message; the stream takes requests): set up
        what a new stream needs; returns the name the broker gave."""

    def writer(self, outbox: asyncio.Queue) -> Coroutine | None:
        """A coroutine that writes requests while the stream is up (cancelled when it ends), or None."""

    def received(self, response: Any) -> ClientError | None:
        """One message from the broker; an error ends the stream."""

    def ended(self, error: ClientError) -> None:
        """The stream ended with `error` (also when stopping)."""

    def lost(self, error: ClientError) -> bool:
        """The stream ended with `error` while not stopping: put back what the next stream must do again; True
        to reconnect at once, whatever the error."""

    def fail(self, error: ClientError) -> None:
        """The role cannot go on: the stream will not be opened again."""

    def describe(self) -> str:
        """The role for error messages ("producer on <topic>")."""


class PartitionStream:
    """One partition's stream and its connect / serve / reconnect / close lifecycle (module docstring)."""

    def __init__(self, client, topic: str, kind: StreamKind, role: StreamRole) -> None:
        self.client = client
        self.topic = topic
        self.kind = kind
        self.role = role
        self.name = ""
        self.address = ""  # the broker of the current stream
        self.opened = 0  # streams the broker accepted so far (an epoch: what came on an older one is stale)
        self._call = None
        self._outbox: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    @property
    def up(self) -> bool:
        return self._outbox is not None

    @property
    def stopping(self) -> bool:
        return self._stopping

    def put(self, request) -> bool:
        """Queue a request on the current stream; False when none is up."""
        if self._outbox is None:
            return False
        self._outbox.put_nowait(request)
        return True

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self, name: str) -> None:
        self.name = name
        ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._run(ready))
        try:
            await ready
        except BaseException:
            self._stopping = True
            self._task.cancel()
            raise

    async def stop(self) -> None:
        self._stopping = True
        if self._outbox is not None:
            self._outbox.put_nowait(None)  # half-close: the broker ends the stream after its last answer
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
        except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping anyway
            pass
        self._task.cancel()
        if self._call is not None:
            end_stream(self._call, self._outbox)

    async def _run(self, ready: asyncio.Future) -> None:
        backoff = self.client._backoff()
        hint = ""
        while not self._stopping:
            try:
                await self._connect(hint)
            except ClientError as e:
                hint = ""
                if not ready.done() and not e.retriable:
                    ready.set_exception(e)
                    return
                # reconnecting: the broker may not have dropped this name's previous stream yet
                retriable = e.retriable or e.status is self.kind.busy_status
                if not retriable or backoff.expired():
                    final = ClientError(e.status, f"{self.role.describe()}: gave up connecting after "
                                                  f"{backoff.attempts} attempts in "
                                                  f"{time.monotonic() - backoff.started:.1f}s: {e.message}",
                                        from_broker=e.from_broker, grpc_code=e.grpc_code)
                    if not ready.done():
                        ready.set_exception(final)
                    self.role.fail(final)
                    return
                await asyncio.sleep(backoff.next_delay_s())  # back-off between reconnect attempts
                continue
            backoff.reset()
            if not ready.done():
                ready.set_result(None)
            error = await self._serve()
            self.role.ended(error)
            if self._stopping:
                return
            hint = error.owner_address if error.status is TopicStatus.NOT_OWNER else ""
            if self.role.lost(error):
                continue  # reconnect at once
            if not error.retriable:
                self.role.fail(error)
                return
            await asyncio.sleep(backoff.next_delay_s())  # the broker said try again: not at once

    async def _connect(self, hint: str) -> None:
        conns = self.client._conns
        address = hint or await conns.lookup(self.topic)
        outbox: asyncio.Queue = asyncio.Queue()
        outbox.put_nowait(self.role.open_request(self.name))

        async def requests():
            while True:
                item = await outbox.get()
                if item is None:
                    return
                yield item

        call = getattr(conns.stub(address), self.kind.method)(requests())
        try:
            response = await asyncio.wait_for(call.read(), conns.operation_timeout_s)
        except TimeoutError:
            end_stream(call, outbox)
            raise ClientError(TopicStatus.TIMEOUT,
                              f"broker {address} did not answer {self.kind.open_name} for {self.topic} "
                              f"within {conns.operation_timeout_s:.1f}s") from None
        except grpc.aio.AioRpcError as e:
            end_stream(call, outbox)
            raise from_rpc_error(e, address) from None
        kind = response.WhichOneof("kind") if response is not grpc.aio.EOF else None
        if kind != self.kind.ready_kind:
            end_stream(call, outbox)
            if kind == "error":
                raise from_error_pb(response.error, address)
            raise ClientError(TopicStatus.SERVICE_UNAVAILABLE,
                              f"broker {address} ended the {self.kind.stream_name} stream of "
                              f"{self.topic} before {self.kind.ready_words}")
        self.opened += 1
        self._call, self._outbox, self.address = call, outbox, address
        self.name = self.role.opened(getattr(response, kind))
        if self._stopping:
            outbox.put_nowait(None)

    async def _serve(self) -> ClientError:
        """Hand the broker's messages to the role until the stream ends; the error that ended it."""
        call, outbox, address = self._call, self._outbox, self.address
        work = self.role.writer(outbox)
        writer = asyncio.get_running_loop().create_task(work) if work is not None else None
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return ClientError(TopicStatus.SERVICE_UNAVAILABLE,
                                       f"broker {address} ended the {self.kind.stream_name} "
                                       f"stream of {self.topic}")
                error = self.role.received(response)
                if error is not None:
                    return error
        except grpc.aio.AioRpcError as e:
            return from_rpc_error(e, address)
        finally:
            if writer is not None:
                writer.cancel()
            end_stream(call, outbox)
            self._call = self._outbox = None
