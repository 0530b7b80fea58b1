"""An asyncio gRPC client for one broker (proto/broker.proto): the `bksim ledger` commands, tests and
benchmarks use it.

Owns: the channel (message size bounds), the pipelined Append stream (`AppendStream`: a bounded window of
unanswered requests, responses matched to requests in order), the ReadEntries stream as an async iterator,
and the unary calls, each with a deadline.

Errors: every refusal raises `BrokerCallError(status, grpc_code, message)`. `status` is the LedgerStatus name
the broker put in the trailing metadata "bksim-status" (BAD_REQUEST, UNAUTHORIZED, READ_BEYOND_LAC, ...);
when the call failed before the broker answered (connection refused, deadline, a broken stream) there is no
such trailer and `status` is the gRPC code name (UNAVAILABLE, DEADLINE_EXCEEDED, ...), `from_broker` False.
Appends without a response when a stream fails have an unknown outcome (their entries may exist; recovery
decides).

Bounds: unary calls `deadline_s` (recovery `recover_deadline_s`); a stream waits at most `deadline_s` for
each response / message (not for the whole stream, which may be long); `window_max` unanswered
AppendRequests per stream; messages received at most RECEIVE_BYTES_MAX.

`SyncBrokerClient` wraps the same calls for the CLI and tests that are not async.

TLS: `tls` (a security.tls.ChannelSecurity, from `channel_security(config.security)`) makes the channel TLS;
None is plaintext. A failed handshake is UNAVAILABLE (`from_broker` False).
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable, Sequence

import grpc

from bksim.adapters.event_loops import close_loop
from bksim.gen import broker_pb2, broker_pb2_grpc
from bksim.model.errors import BksimError
from bksim.model.status import LedgerStatus
from bksim.security.tls import ChannelSecurity, open_channel
from bksim.security.tokens import BearerStub

# LedgerStatus -> the gRPC status the broker ends a call with (the table at the top of proto/broker.proto)
GRPC_CODE_NAME = {
    LedgerStatus.BAD_REQUEST: "INVALID_ARGUMENT", LedgerStatus.NO_SUCH_LEDGER: "NOT_FOUND",
    LedgerStatus.UNAUTHORIZED: "PERMISSION_DENIED", LedgerStatus.LEDGER_CLOSED: "FAILED_PRECONDITION",
    LedgerStatus.NOT_WRITER: "FAILED_PRECONDITION", LedgerStatus.FENCED: "ABORTED",
    LedgerStatus.READ_BEYOND_LAC: "OUT_OF_RANGE", LedgerStatus.TOO_MANY_REQUESTS: "RESOURCE_EXHAUSTED",
    LedgerStatus.NOT_ENOUGH_BOOKIES: "UNAVAILABLE", LedgerStatus.READ_FAILED: "UNAVAILABLE",
    LedgerStatus.RECOVERY_FAILED: "UNAVAILABLE", LedgerStatus.METADATA_ERROR: "UNAVAILABLE",
    LedgerStatus.ABORTED: "UNAVAILABLE", LedgerStatus.INTERNAL: "INTERNAL",
}

DEADLINE_S = 10.0  # default deadline of unary calls, and of waiting for one stream response
RECOVER_DEADLINE_S = 60.0  # OpenLedger with recover=True: fencing, read-forward and write-back of the tail
RECEIVE_BYTES_MAX = 16 * 1024 * 1024  # a ReadEntries message packs ~1 MiB of entries plus at most one big entry
APPEND_WINDOW_MAX = 16  # default unanswered AppendRequests per stream
STATUS_KEY = "bksim-status"
LEDGER_STATUSES = frozenset(LedgerStatus)


class BrokerCallError(BksimError):
    """A broker call failed. `status`: the LedgerStatus name from the trailer "bksim-status", or the gRPC code
    name when the broker did not answer; `grpc_code`: the gRPC status code name; `message`: the details;
    `answered`: False when the status is only the transport's gRPC code (no trailer: the broker said nothing)."""

    def __init__(self, status: str, grpc_code: str, message: str, *, answered: bool = True) -> None:
        self.status = status
        self.grpc_code = grpc_code
        self.message = message
        self.answered = answered
        super().__init__(f"{status}: {message}")

    @property
    def from_broker(self) -> bool:
        """True when the broker refused with a LedgerStatus (not a transport failure: a gRPC INTERNAL without
        the trailer is the transport's, although INTERNAL is also a LedgerStatus name)."""
        return self.answered and self.status in LEDGER_STATUSES

    @property
    def ledger_status(self) -> LedgerStatus | None:
        """The LedgerStatus the broker refused with; None when the call failed without one."""
        return LedgerStatus(self.status) if self.from_broker else None


def call_error(e: grpc.aio.AioRpcError, address: str) -> BrokerCallError:
    """A BrokerCallError from a failed gRPC call, its status taken from the "bksim-status" trailer."""
    status = None
    try:
        for key, value in e.trailing_metadata() or ():
            if key == STATUS_KEY:
                status = value.decode() if isinstance(value, bytes) else str(value)
    except Exception:  # noqa: BLE001 - no trailer to read (the call never reached the broker)
        status = None
    code = e.code().name
    details = e.details() or ""
    if status is None:
        return BrokerCallError(code, code, f"broker {address}: {details}" if details else f"broker {address}",
                               answered=False)
    return BrokerCallError(status, code, details)


# -- results --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Segment:
    first_entry_id: int
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """A ledger's metadata as the broker returns it (never the password)."""
    ledger_id: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int
    state: str  # OPEN | IN_RECOVERY | CLOSED
    last_entry_id: int
    length: int
    segments: tuple[Segment, ...]
    digest_type: str
    ctime_ms: int
    custom: dict[str, str] = field(default_factory=dict)
    format_version: int = 0
    version: int = -1

    @classmethod
    def from_message(cls, m: broker_pb2.LedgerMetadata) -> "LedgerInfo":
        return cls(ledger_id=m.ledger_id, ensemble_size=m.ensemble_size, write_quorum_size=m.write_quorum_size,
                   ack_quorum_size=m.ack_quorum_size, state=m.state, last_entry_id=m.last_entry_id, length=m.length,
                   segments=tuple(Segment(s.first_entry_id, tuple(s.ensemble)) for s in m.segments),
                   digest_type=m.digest_type, ctime_ms=m.ctime_ms, custom=dict(m.custom),
                   format_version=m.format_version, version=m.version)

    def to_dict(self) -> dict:
        return {"ledger_id": self.ledger_id, "ensemble_size": self.ensemble_size,
                "write_quorum_size": self.write_quorum_size, "ack_quorum_size": self.ack_quorum_size,
                "state": self.state, "last_entry_id": self.last_entry_id, "length": self.length,
                "segments": [{"first_entry_id": s.first_entry_id, "ensemble": list(s.ensemble)}
                             for s in self.segments],
                "digest_type": self.digest_type, "ctime_ms": self.ctime_ms, "custom": dict(self.custom),
                "format_version": self.format_version, "version": self.version}


@dataclass(frozen=True, slots=True)
class AppendResult:
    request_id: int
    first_entry_id: int  # the request's entries have ids first_entry_id .. first_entry_id + count - 1
    count: int
    last_add_confirmed: int


# -- the Append stream ----------------------------------------------------------------------------------------

class AppendStream:
    """One pipelined Append stream to one ledger: up to `window_max` requests may await their responses.

    `send(payloads)` waits for window room, sends one AppendRequest and returns a future of its AppendResult;
    responses arrive in request order. When the stream fails, every unanswered future fails with the
    BrokerCallError (its outcome is unknown) and so does every later `send`.
    """

    def __init__(self, stub: broker_pb2_grpc.BrokerStub, address: str, ledger_id: int, password: bytes,
                 window_max: int, response_timeout_s: float) -> None:
        if window_max < 1:
            raise ValueError("window_max must be >= 1")
        self.ledger_id = ledger_id
        self._password = password
        self._address = address
        self._window = asyncio.Semaphore(window_max)
        self._outbox: asyncio.Queue = asyncio.Queue(window_max + 1)  # +1: the end marker
        self._pending: collections.deque = collections.deque()
        self._response_timeout_s = response_timeout_s
        self._error: BrokerCallError | None = None
        self._closed = False
        self._next_id = 0
        self._call = stub.Append(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read_responses())
        self.sent = 0
        self.answered = 0
        self.entries_acknowledged = 0

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
                error = self._answered(message) if message.next else self._answered_one(message)
                if error is not None:
                    break
            if pending and error is None:
                error = BrokerCallError("UNAVAILABLE", "UNAVAILABLE", f"broker {self._address} ended the append "
                                        f"stream with {len(pending)} request(s) unanswered (outcome unknown)")
        except grpc.aio.AioRpcError as e:
            error = error or call_error(e, self._address)
        except asyncio.CancelledError:
            error = error or BrokerCallError("CANCELLED", "CANCELLED", "the append stream was closed by the client")
        finally:
            self._error = error or BrokerCallError("CANCELLED", "CANCELLED", "the append stream is closed")
            while pending:
                _, future = pending.popleft()
                self._window.release()
                if not future.done():
                    future.set_exception(self._error)
                    future.exception()  # retrieved: `stream.error` reports it; callers may stop awaiting

    def _answered(self, message) -> BrokerCallError | None:
        """Take a message and the answers riding in its `next`, in order; the error that ends the stream, if any."""
        for response in (message, *message.next):
            error = self._answered_one(response)
            if error is not None:
                return error
        return None

    def _answered_one(self, response) -> BrokerCallError | None:
        if response.error:
            status = broker_pb2.LedgerStatus.Name(response.error)
            return BrokerCallError(status, GRPC_CODE_NAME.get(status, "UNKNOWN"), response.message)
        pending = self._pending
        if not pending:
            return BrokerCallError("INTERNAL", "UNKNOWN", f"broker {self._address} answered request "
                                   f"{response.request_id} that was not sent")
        request_id, future = pending.popleft()
        self._window.release()
        if request_id != response.request_id:
            error = BrokerCallError("INTERNAL", "UNKNOWN", f"broker {self._address} answered request "
                                    f"{response.request_id}, expected {request_id}")
            future.set_exception(error)
            future.exception()
            return error
        self.answered += 1
        self.entries_acknowledged += response.count
        if not future.done():
            future.set_result(AppendResult(response.request_id, response.first_entry_id, response.count,
                                           response.last_add_confirmed))
        return None

    @property
    def error(self) -> BrokerCallError | None:
        """Why the stream ended (None while it is usable)."""
        return self._error

    async def send(self, payloads: Sequence[bytes]) -> asyncio.Future:
        """Send one batch of payloads (waits for window room); returns the future of its AppendResult."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise BrokerCallError("CANCELLED", "CANCELLED", "the append stream is closing")
        await self._window.acquire()
        if self._error is not None:
            self._window.release()
            raise self._error
        request_id = self._next_id
        self._next_id += 1
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request_id, future))
        self._outbox.put_nowait(broker_pb2.AppendRequest(ledger_id=self.ledger_id, password=self._password,
                                                         payloads=payloads, request_id=request_id))
        self.sent += 1
        return future

    async def result(self, future: asyncio.Future, timeout_s: float | None = None) -> AppendResult:
        """The AppendResult of a sent request, waiting at most `timeout_s` (default the stream's)."""
        timeout = self._response_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise BrokerCallError("DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED",
                                  f"no append response from broker {self._address} within {timeout:.1f}s") from None

    async def append(self, payloads: Sequence[bytes], timeout_s: float | None = None) -> AppendResult:
        """Send one batch and wait for its result."""
        return await self.result(await self.send(payloads), timeout_s)

    async def close(self, timeout_s: float | None = None) -> None:
        """Half-close, wait (bounded) for the answers still due, then end the call."""
        timeout = self._response_timeout_s if timeout_s is None else timeout_s
        if not self._closed:
            self._closed = True
            self._outbox.put_nowait(None)  # room reserved by the +1
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        except TimeoutError:
            pass
        finally:
            self._call.cancel()
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass


# -- the client -----------------------------------------------------------------------------------------------

class BrokerClient:
    """Calls to one broker at `address` ("host:port"). Use as `async with BrokerClient(addr) as c:`. With
    `token`, every call carries it as "authorization: Bearer <token>" (brokers with security.auth_enabled)."""

    def __init__(self, address: str, *, deadline_s: float = DEADLINE_S,
                 recover_deadline_s: float = RECOVER_DEADLINE_S, tls: ChannelSecurity | None = None,
                 token: str | None = None) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.recover_deadline_s = recover_deadline_s
        self._channel = open_channel(address, [
            ("grpc.max_receive_message_length", RECEIVE_BYTES_MAX),
            ("grpc.max_send_message_length", -1),  # the broker decides what is too big
        ], tls)
        self._stub = broker_pb2_grpc.BrokerStub(self._channel)
        if token:
            self._stub = BearerStub(self._stub, token)

    async def __aenter__(self) -> "BrokerClient":
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
            raise BrokerCallError("UNAVAILABLE", "UNAVAILABLE",
                                  f"broker {self.address} not reachable within {timeout_s:.1f}s") from None

    async def _unary(self, method, request, deadline_s: float | None = None):
        try:
            return await method(request, timeout=deadline_s or self.deadline_s)
        except grpc.aio.AioRpcError as e:
            raise call_error(e, self.address) from None

    # -- ledgers ------------------------------------------------------------------------------------------------
    async def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, *,
                            password: bytes = b"", digest_type: str = "",
                            custom: dict[str, str] | None = None) -> LedgerInfo:
        r = await self._unary(self._stub.CreateLedger, broker_pb2.CreateLedgerRequest(
            ensemble_size=ensemble_size, write_quorum_size=write_quorum_size, ack_quorum_size=ack_quorum_size,
            password=password, digest_type=digest_type, custom=custom or {}))
        return LedgerInfo.from_message(r.metadata)

    def append_stream(self, ledger_id: int, *, password: bytes = b"", window_max: int = APPEND_WINDOW_MAX,
                      response_timeout_s: float | None = None) -> AppendStream:
        """Open a pipelined Append stream to `ledger_id` (must be called from a running event loop)."""
        return AppendStream(self._stub, self.address, ledger_id, password, window_max,
                            self.deadline_s if response_timeout_s is None else response_timeout_s)

    async def append(self, ledger_id: int, batches: Iterable[Sequence[bytes]], *, password: bytes = b"",
                     window_max: int = APPEND_WINDOW_MAX) -> list[tuple[int, int]]:
        """Append every batch of payloads in order on one stream (`window_max` batches in flight); returns
        (first_entry_id, count) per batch, in order. The first failure raises its BrokerCallError (batches
        without a result have an unknown outcome)."""
        stream = self.append_stream(ledger_id, password=password, window_max=window_max)
        futures: collections.deque = collections.deque()
        results: list[tuple[int, int]] = []
        try:
            for batch in batches:
                if len(futures) >= window_max:  # keep at most a window of futures to collect
                    r = await stream.result(futures.popleft())
                    results.append((r.first_entry_id, r.count))
                futures.append(await stream.send(batch))
            while futures:
                r = await stream.result(futures.popleft())
                results.append((r.first_entry_id, r.count))
        finally:
            await stream.close()
        return results

    async def read_entries(self, ledger_id: int, first_entry_id: int = 0, last_entry_id: int = -1, *,
                           password: bytes = b"") -> AsyncIterator[tuple[int, bytes]]:
        """(entry_id, payload) for first..last in order; `last_entry_id` -1 = up to the last confirmed entry."""
        call = self._stub.ReadEntries(broker_pb2.ReadEntriesRequest(
            ledger_id=ledger_id, password=password, first_entry_id=first_entry_id, last_entry_id=last_entry_id))
        try:
            while True:
                try:
                    message = await asyncio.wait_for(call.read(), self.deadline_s)
                except TimeoutError:
                    raise BrokerCallError("DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED",
                                          f"no entries from broker {self.address} within {self.deadline_s:.1f}s") from None
                except grpc.aio.AioRpcError as e:
                    raise call_error(e, self.address) from None
                if message is grpc.aio.EOF:
                    return
                for entry in message.entries:
                    yield entry.entry_id, entry.payload
        finally:
            call.cancel()

    async def read_lac(self, ledger_id: int, *, password: bytes = b"") -> int:
        r = await self._unary(self._stub.ReadLac, broker_pb2.ReadLacRequest(ledger_id=ledger_id, password=password))
        return r.last_add_confirmed

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"",
                          recover: bool = False) -> tuple[LedgerInfo, int]:
        """(metadata, last_add_confirmed). `recover`: fence the writer, recover the tail and close."""
        r = await self._unary(self._stub.OpenLedger,
                              broker_pb2.OpenLedgerRequest(ledger_id=ledger_id, password=password, recover=recover),
                              self.recover_deadline_s if recover else None)
        return LedgerInfo.from_message(r.metadata), r.last_add_confirmed

    async def close_ledger(self, ledger_id: int, *, password: bytes = b"") -> LedgerInfo:
        r = await self._unary(self._stub.CloseLedger,
                              broker_pb2.CloseLedgerRequest(ledger_id=ledger_id, password=password))
        return LedgerInfo.from_message(r.metadata)

    async def delete_ledger(self, ledger_id: int, *, password: bytes = b"") -> None:
        await self._unary(self._stub.DeleteLedger, broker_pb2.DeleteLedgerRequest(ledger_id=ledger_id,
                                                                                  password=password))

    async def list_ledgers(self) -> list[int]:
        r = await self._unary(self._stub.ListLedgers, broker_pb2.ListLedgersRequest())
        return list(r.ledger_ids)

    async def get_metadata(self, ledger_id: int) -> LedgerInfo:
        r = await self._unary(self._stub.GetLedgerMetadata, broker_pb2.GetLedgerMetadataRequest(ledger_id=ledger_id))
        return LedgerInfo.from_message(r.metadata)

    async def list_bookies(self) -> list[dict]:
        """[{"bookie_id", "state"}] with state "writable" or "read-only"."""
        r = await self._unary(self._stub.ListBookies, broker_pb2.ListBookiesRequest())
        return [{"bookie_id": b.bookie_id, "state": b.state} for b in r.bookies]

    async def health(self, service: str = "", deadline_s: float | None = None) -> str:
        """The gRPC health status name ("SERVING", "NOT_SERVING", ...)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        r = await self._unary(health_pb2_grpc.HealthStub(self._channel).Check,
                              health_pb2.HealthCheckRequest(service=service), deadline_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)


class SyncBrokerClient:
    """Blocking wrapper: each call runs the async client on a private event loop. `with SyncBrokerClient(a) as c:`."""

    def __init__(self, address: str, *, deadline_s: float = DEADLINE_S,
                 recover_deadline_s: float = RECOVER_DEADLINE_S, tls: ChannelSecurity | None = None,
                 token: str | None = None) -> None:
        self.address = address
        self._loop = asyncio.new_event_loop()
        self._client = self._loop.run_until_complete(self._make(address, deadline_s, recover_deadline_s, tls, token))

    @staticmethod
    async def _make(address: str, deadline_s: float, recover_deadline_s: float,
                    tls: ChannelSecurity | None, token: str | None) -> BrokerClient:
        return BrokerClient(address, deadline_s=deadline_s, recover_deadline_s=recover_deadline_s, tls=tls,
                            token=token)

    def __enter__(self) -> "SyncBrokerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, coroutine):
        return self._loop.run_until_complete(coroutine)

    @property
    def client(self) -> BrokerClient:
        """The async client (for `run`)."""
        return self._client

    def run(self, coroutine):
        """Run any coroutine on this wrapper's loop (e.g. one using `client.append_stream`)."""
        return self._run(coroutine)

    def create_ledger(self, ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, *,
                      password: bytes = b"", digest_type: str = "", custom: dict[str, str] | None = None) -> LedgerInfo:
        return self._run(self._client.create_ledger(ensemble_size, write_quorum_size, ack_quorum_size,
                                                    password=password, digest_type=digest_type, custom=custom))

    def append(self, ledger_id: int, batches: Iterable[Sequence[bytes]], *, password: bytes = b"",
               window_max: int = APPEND_WINDOW_MAX) -> list[tuple[int, int]]:
        return self._run(self._client.append(ledger_id, batches, password=password, window_max=window_max))

    def read_entries(self, ledger_id: int, first_entry_id: int = 0, last_entry_id: int = -1, *,
                     password: bytes = b"") -> list[tuple[int, bytes]]:
        async def collect() -> list[tuple[int, bytes]]:
            return [e async for e in self._client.read_entries(ledger_id, first_entry_id, last_entry_id,
                                                                password=password)]
        return self._run(collect())

    def read_lac(self, ledger_id: int, *, password: bytes = b"") -> int:
        return self._run(self._client.read_lac(ledger_id, password=password))

    def open_ledger(self, ledger_id: int, *, password: bytes = b"", recover: bool = False) -> tuple[LedgerInfo, int]:
        return self._run(self._client.open_ledger(ledger_id, password=password, recover=recover))

    def close_ledger(self, ledger_id: int, *, password: bytes = b"") -> LedgerInfo:
        return self._run(self._client.close_ledger(ledger_id, password=password))

    def delete_ledger(self, ledger_id: int, *, password: bytes = b"") -> None:
        self._run(self._client.delete_ledger(ledger_id, password=password))

    def list_ledgers(self) -> list[int]:
        return self._run(self._client.list_ledgers())

    def get_metadata(self, ledger_id: int) -> LedgerInfo:
        return self._run(self._client.get_metadata(ledger_id))

    def list_bookies(self) -> list[dict]:
        return self._run(self._client.list_bookies())

    def health(self, service: str = "", deadline_s: float | None = None) -> str:
        return self._run(self._client.health(service, deadline_s))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._client.close())
        close_loop(self._loop)
