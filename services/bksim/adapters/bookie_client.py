"""An asyncio gRPC client for one bookie (proto/bookie.proto): tests, benchmarks and the broker use it.

Owns: the channel (message size bounds), the pipelined AddEntries stream (`AddStream`: bounded window
of unanswered requests, responses matched to requests in order), and the unary calls, each with a
deadline. Transport failures raise `BookieUnreachable` (model/errors.py; `code` names the gRPC status; the
outcome of unanswered adds is unknown);
bookie answers come back as status codes, never as exceptions.

`SyncBookieClient` wraps the same calls for scripts and tests that are not async.

Operator calls (the BookieAdmin service, adapters/bookie_admin.py): `run_gc`, `gc_status`, `entry_log_stats`
return plain dicts (the proto's field names; `error` None when a round completed). A refusal raises
`BookieAdminError` (its `code`: INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ...; nothing changed);
no answer (refused connection, deadline, the bookie shutting down) raises `BookieUnreachable`.

TLS: `tls` (a security.tls.ChannelSecurity, from `channel_security(config.security)`) makes the channel TLS
with the CA, the client certificate for mutual TLS and hostname verification; None is plaintext. A failed
handshake (plaintext server, foreign CA, wrong name, missing client certificate) is UNAVAILABLE: no answer.
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from operator import itemgetter
from typing import Sequence

import grpc

from bksim.adapters.event_loops import close_loop
from bksim.gen import bookie_pb2, bookie_pb2_grpc
from bksim.model.config import ADD_WINDOW_MAX  # default unanswered AddRequests per stream
from bksim.model.config import FRAME_BYTES_MAX  # the bookie's default frame_bytes_max, what a client receives
from bksim.model.errors import BksimError, BookieUnreachable
from bksim.model.status import FLAG_FENCE, StatusCode
from bksim.security.tls import ChannelSecurity, open_channel

DEADLINE_S = 5.0  # default deadline of unary calls and of waiting for one add response
GC_DEADLINE_S = 600.0  # default deadline of RunGc: a round with compaction copies at compaction_rate_bytes_per_s
_NO_ANSWER_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"}

_AddRequest = bookie_pb2.AddRequest
_AddEntry = bookie_pb2.AddEntry
_ENTRY, _KEY, _FLAGS = itemgetter(0), itemgetter(1), itemgetter(2)  # of (entry bytes, master key, flags)
_ADD_ENTRIES_PATH = "/{}/AddEntries".format(bookie_pb2.DESCRIPTOR.services_by_name["Bookie"].full_name)


@dataclass(frozen=True, slots=True)
class AddResult:
    batch_id: int
    statuses: list[int]  # StatusCode values, statuses[i] for entries[i]
    message: str

    @property
    def ok(self) -> bool:
        return all(s == 0 for s in self.statuses)


@dataclass(frozen=True, slots=True)
class ReadResult:
    status: StatusCode
    entry: bytes
    last_add_confirmed: int
    message: str


@dataclass(frozen=True, slots=True)
class LacResult:
    status: StatusCode
    last_add_confirmed: int
    last_entry_id: int
    message: str


@dataclass(frozen=True, slots=True)
class ListResult:
    """One ListEntries page: the ranges held from the asked first entry up to `next_entry` (-1: the end)."""
    status: StatusCode
    ranges: list[tuple[int, int]]
    next_entry: int
    message: str


def _no_answer(bookie: str, code: str, message: str) -> BookieUnreachable:
    """No answer from `bookie` ("" = not known here): `code` is the gRPC status code name ("UNAVAILABLE",
    "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "CANCELLED", ...)."""
    return BookieUnreachable(bookie, f"{code}: {message}", code=code)


def _unavailable(bookie: str, e: grpc.aio.AioRpcError) -> BookieUnreachable:
    return _no_answer(bookie, e.code().name, e.details() or "")


class BookieAdminError(BksimError):
    """A bookie refused an operator call (BookieAdmin): `code` is the gRPC status code name, `message` its reason.
    The call changed nothing."""

    def __init__(self, bookie: str, call: str, code: str, message: str) -> None:
        self.bookie, self.call, self.code, self.message = bookie, call, code, message
        super().__init__(f"bookie {bookie} refused {call}: {code}: {message}")


def _admin_error(bookie: str, call: str, e: grpc.aio.AioRpcError) -> BksimError:
    code = e.code().name
    if code in _NO_ANSWER_CODES:
        return _unavailable(bookie, e)
    if code == "UNIMPLEMENTED":
        return BookieAdminError(bookie, call, code, "this bookie has no BookieAdmin service (an older version?)")
    return BookieAdminError(bookie, call, code, e.details() or "")


def message_dict(message) -> dict:
    """A protobuf message as a dict of its fields (nested messages as dicts, repeated fields as lists)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            value = [message_dict(v) for v in value] if field.is_repeated else message_dict(value)
        elif field.is_repeated:
            value = list(value)
        out[field.name] = value
    return out


def _report_dict(message) -> dict:
    report = message_dict(message)
    report["error"] = report["error"] or None
    return report


def make_request(batch_id: int, entries: Sequence[tuple[bytes, bytes, int]]) -> bookie_pb2.AddRequest:
    """An AddRequest from (entry bytes, master key, flags) tuples: the compact form (`data`, one key and flags)
    when every entry has the same key and flags, as a writer's batch to one bookie has, else one AddEntry each."""
    if not entries:
        return _AddRequest(batch_id=batch_id)
    _, key, flags = entries[0]
    if len(set(map(_KEY, entries))) == 1 and len(set(map(_FLAGS, entries))) == 1:  # C loops: hundreds per request
        return _AddRequest(batch_id=batch_id, data=list(map(_ENTRY, entries)), master_key=key, flags=flags)
    return _AddRequest(batch_id=batch_id,
                       entries=[_AddEntry(entry=e, master_key=k, flags=f) for e, k, f in entries])


class SerializedAddStub:
    """A stub of `channel` whose AddEntries takes requests already serialized (bytes, see `AddStream.send_serialized`):
    a request prepared once can go to several bookies without being built and serialized again for each."""
    __slots__ = ("AddEntries",)

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.AddEntries = channel.stream_stream(_ADD_ENTRIES_PATH, request_serializer=None,
                                                response_deserializer=bookie_pb2.AddResponse.FromString)


def serialized_request(batch_id: int, entries: Sequence[tuple[bytes, bytes, int]]) -> bytes:
    """The wire bytes of make_request(batch_id, entries), for a stream on a SerializedAddStub."""
    return make_request(batch_id, entries).SerializeToString()


class AddStream:
    """One pipelined AddEntries stream: up to `window_max` requests may await their responses.

    `send(...)` waits for window room, sends, and returns a future of the AddResult; responses arrive in
    request order. When the stream breaks every unanswered future fails with BookieUnreachable (naming `bookie`).
    """

    def __init__(self, stub: bookie_pb2_grpc.BookieStub, window_max: int, response_timeout_s: float, *,
                 bookie: str = "") -> None:
        self._bookie = bookie
        self._window = asyncio.Semaphore(window_max)
        self._outbox: asyncio.Queue = asyncio.Queue(window_max + 1)  # +1: the end marker
        self._pending: collections.deque = collections.deque()
        self._response_timeout_s = response_timeout_s
        self._error: BookieUnreachable | None = None
        self._closed = False
        self._call = stub.AddEntries(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read_responses())
        self.sent = 0
        self.answered = 0

    async def _requests(self):
        outbox = self._outbox
        while True:
            request = await outbox.get()
            if request is None:
                return
            yield request

    async def _read_responses(self) -> None:
        error = None
        pending = self._pending
        try:
            async for message in self._call:
                for response in (message, *message.next) if message.next else (message,):
                    batch_id, future = pending.popleft()
                    assert batch_id == response.batch_id, \
                        f"bookie answered batch {response.batch_id}, expected {batch_id}"
                    self._window.release()
                    self.answered += 1
                    if not future.done():
                        future.set_result(AddResult(batch_id, list(response.statuses), response.message))
            if pending:
                error = _no_answer(self._bookie, "UNAVAILABLE", f"the bookie ended the stream with "
                                   f"{len(pending)} request(s) unanswered (outcome unknown)")
        except grpc.aio.AioRpcError as e:
            error = _unavailable(self._bookie, e)
        except asyncio.CancelledError:
            error = _no_answer(self._bookie, "CANCELLED", "the add stream was closed by the client")
        finally:
            error = error or _no_answer(self._bookie, "UNAVAILABLE", "the add stream is closed")
            self._error = error
            while pending:
                _, future = pending.popleft()
                self._window.release()
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved: `stream.error` reports it; callers may stop awaiting

    @property
    def error(self) -> BookieUnreachable | None:
        return self._error

    async def send_request(self, request: bookie_pb2.AddRequest) -> asyncio.Future:
        """Send a prepared AddRequest (waits for window room); returns the future of its AddResult."""
        return await self.send_serialized(request.batch_id, request)

    async def send_serialized(self, batch_id: int, request) -> asyncio.Future:
        """Send `request`, an AddRequest whose batch id is `batch_id`: the message, or its serialized bytes on a
        stream of a SerializedAddStub (waits for window room); returns the future of its AddResult."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise _no_answer(self._bookie, "CANCELLED", "the add stream is closing")
        await self._window.acquire()
        if self._error is not None:
            self._window.release()
            raise self._error
        future = asyncio.get_running_loop().create_future()
        self._pending.append((batch_id, future))
        self._outbox.put_nowait(request)
        self.sent += 1
        return future

    async def send(self, batch_id: int, entries: Sequence[tuple[bytes, bytes, int]]) -> asyncio.Future:
        """Send (entry bytes, master key, flags) tuples as one batch; returns the future of its AddResult."""
        return await self.send_request(make_request(batch_id, entries))

    async def add(self, batch_id: int, entries: Sequence[tuple[bytes, bytes, int]],
                  timeout_s: float | None = None) -> AddResult:
        """Send one batch and wait for its result (bounded by `timeout_s`, default the stream's)."""
        future = await self.send(batch_id, entries)
        return await self.result(future, timeout_s)

    async def result(self, future: asyncio.Future, timeout_s: float | None = None) -> AddResult:
        timeout = self._response_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise _no_answer(self._bookie, "DEADLINE_EXCEEDED", f"no add response within {timeout:.1f}s") from None

    async def close(self, timeout_s: float = DEADLINE_S) -> None:
        """Half-close, wait (bounded) for the answers still due, then end the call."""
        if not self._closed:
            self._closed = True
            self._outbox.put_nowait(None)  # room reserved by the +1
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._call.cancel()
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass


class BookieClient:
    """Calls to one bookie at `address` ("host:port"). Use as `async with BookieClient(addr) as c:`."""

    def __init__(self, address: str, *, deadline_s: float = DEADLINE_S, frame_bytes_max: int = FRAME_BYTES_MAX,
                 tls: ChannelSecurity | None = None) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self._channel = open_channel(address, [
            ("grpc.max_receive_message_length", frame_bytes_max),
            ("grpc.max_send_message_length", -1),  # let the bookie decide what is too big
        ], tls)
        self._stub = bookie_pb2_grpc.BookieStub(self._channel)
        self._admin = bookie_pb2_grpc.BookieAdminStub(self._channel)

    async def __aenter__(self) -> "BookieClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until the channel connects (bounded)."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except TimeoutError:
            raise _no_answer(self.address, "UNAVAILABLE", f"not reachable within {timeout_s:.1f}s") from None

    def add_stream(self, window_max: int = ADD_WINDOW_MAX, response_timeout_s: float | None = None) -> AddStream:
        """Open a pipelined AddEntries stream (must be called from a running event loop)."""
        return AddStream(self._stub, window_max, self.deadline_s if response_timeout_s is None else response_timeout_s,
                         bookie=self.address)

    async def read_entry(self, ledger_id: int, entry_id: int, fence: bool = False, master_key: bytes = b"",
                         deadline_s: float | None = None) -> ReadResult:
        request = bookie_pb2.ReadEntryRequest(ledger_id=ledger_id, entry_id=entry_id,
                                              flags=FLAG_FENCE if fence else 0, master_key=master_key)
        try:
            r = await self._stub.ReadEntry(request, timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return ReadResult(StatusCode(r.status), r.entry, r.last_add_confirmed, r.message)

    async def read_entries(self, ledger_id: int, entry_ids: Sequence[int], fence: bool = False,
                           master_key: bytes = b"", deadline_s: float | None = None) -> list[ReadResult]:
        """One ReadEntries call: results[i] for entry_ids[i] (TOO_MANY_REQUESTS: not read, the answer was full)."""
        request = bookie_pb2.ReadEntriesRequest(ledger_id=ledger_id, entry_ids=entry_ids,
                                                flags=FLAG_FENCE if fence else 0, master_key=master_key)
        try:
            r = await self._stub.ReadEntries(request, timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return [ReadResult(StatusCode(x.status), x.entry, x.last_add_confirmed, x.message) for x in r.results]

    async def read_lac(self, ledger_id: int, deadline_s: float | None = None) -> LacResult:
        try:
            r = await self._stub.ReadLac(bookie_pb2.ReadLacRequest(ledger_id=ledger_id),
                                         timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return LacResult(StatusCode(r.status), r.last_add_confirmed, r.last_entry_id, r.message)

    async def list_entries(self, ledger_id: int, first_entry: int = 0, deadline_s: float | None = None) -> ListResult:
        """One ListEntries call: one page of the entries the bookie holds of the ledger, from `first_entry` on (ask
        again from `next_entry` until it is -1; bookie/requests.py list_all_entries joins the pages)."""
        try:
            request = bookie_pb2.ListEntriesRequest(ledger_id=ledger_id, first_entry=first_entry)
            r = await self._stub.ListEntries(request, timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return ListResult(StatusCode(r.status), [(x.first, x.last) for x in r.ranges], r.next_entry, r.message)

    async def write_lac(self, ledger_id: int, last_add_confirmed: int, master_key: bytes,
                        deadline_s: float | None = None) -> tuple[StatusCode, str]:
        request = bookie_pb2.WriteLacRequest(ledger_id=ledger_id, last_add_confirmed=last_add_confirmed,
                                             master_key=master_key)
        try:
            r = await self._stub.WriteLac(request, timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return StatusCode(r.status), r.message

    async def info(self, deadline_s: float | None = None) -> dict:
        """{"bookie_id", "state", "free_bytes", "total_bytes", "instance_id"}."""
        try:
            r = await self._stub.GetBookieInfo(bookie_pb2.GetBookieInfoRequest(),
                                               timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return {"bookie_id": r.bookie_id, "state": r.state, "free_bytes": r.free_bytes,
                "total_bytes": r.total_bytes, "instance_id": r.instance_id}

    # -- operator calls (BookieAdmin) ----------------------------------------------------------------------
    async def run_gc(self, kind: str = "gc", deadline_s: float | None = None) -> dict:
        """Run a garbage collection round now ("gc", "minor", "major") and return its report (GcReport fields)."""
        try:
            r = await self._admin.RunGc(bookie_pb2.RunGcRequest(kind=kind), timeout=deadline_s or GC_DEADLINE_S)
        except grpc.aio.AioRpcError as e:
            raise _admin_error(self.address, "RunGc", e) from None
        return _report_dict(r)

    async def gc_status(self, deadline_s: float | None = None) -> dict:
        """GcStatusResponse fields: running, disk_full, last (reports), totals, schedule, entry_logs, ..."""
        try:
            r = await self._admin.GcStatus(bookie_pb2.GcStatusRequest(), timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _admin_error(self.address, "GcStatus", e) from None
        status = message_dict(r)
        status["last"] = [_report_dict(x) for x in r.last]
        return status

    async def entry_log_stats(self, first_log_id: int = 0, max_logs: int = 0,
                              deadline_s: float | None = None) -> dict:
        """One EntryLogStats page: {"logs": [...], "next_log_id" (-1: no more), "logs_total"}."""
        try:
            r = await self._admin.EntryLogStats(bookie_pb2.EntryLogStatsRequest(first_log_id=first_log_id,
                                                                                max_logs=max_logs),
                                                timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _admin_error(self.address, "EntryLogStats", e) from None
        return message_dict(r)

    async def health(self, service: str = "", deadline_s: float | None = None) -> str:
        """The gRPC health status name ("SERVING", "NOT_SERVING", ...)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            r = await health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise _unavailable(self.address, e) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


class SyncBookieClient:
    """Blocking wrapper: each call runs the async client on a private event loop."""

    def __init__(self, address: str, *, deadline_s: float = DEADLINE_S, tls: ChannelSecurity | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = self._loop.run_until_complete(self._make(address, deadline_s, tls))

    @staticmethod
    async def _make(address: str, deadline_s: float, tls: ChannelSecurity | None) -> BookieClient:
        return BookieClient(address, deadline_s=deadline_s, tls=tls)

    def _run(self, coroutine):
        return self._loop.run_until_complete(coroutine)

    def add(self, entries: Sequence[tuple[bytes, bytes, int]], batch_id: int = 0) -> AddResult:
        """One batch on a fresh stream (simple, not fast)."""
        async def one() -> AddResult:
            stream = self._client.add_stream(window_max=1)
            try:
                return await stream.add(batch_id, entries)
            finally:
                await stream.close()
        return self._run(one())

    def read_entry(self, ledger_id: int, entry_id: int, fence: bool = False, master_key: bytes = b"") -> ReadResult:
        return self._run(self._client.read_entry(ledger_id, entry_id, fence, master_key))

    def read_entries(self, ledger_id: int, entry_ids: Sequence[int], fence: bool = False,
                     master_key: bytes = b"") -> list[ReadResult]:
        return self._run(self._client.read_entries(ledger_id, entry_ids, fence, master_key))

    def read_lac(self, ledger_id: int) -> LacResult:
        return self._run(self._client.read_lac(ledger_id))

    def list_entries(self, ledger_id: int, first_entry: int = 0) -> ListResult:
        return self._run(self._client.list_entries(ledger_id, first_entry))

    def write_lac(self, ledger_id: int, last_add_confirmed: int, master_key: bytes) -> tuple[StatusCode, str]:
        return self._run(self._client.write_lac(ledger_id, last_add_confirmed, master_key))

    def info(self) -> dict:
        return self._run(self._client.info())

    def health(self) -> str:
        return self._run(self._client.health())

    def run_gc(self, kind: str = "gc", deadline_s: float | None = None) -> dict:
        return self._run(self._client.run_gc(kind, deadline_s))

    def gc_status(self) -> dict:
        return self._run(self._client.gc_status())

    def entry_log_stats(self, first_log_id: int = 0, max_logs: int = 0) -> dict:
        return self._run(self._client.entry_log_stats(first_log_id, max_logs))

    def close(self) -> None:
        self._run(self._client.close())
        close_loop(self._loop)
