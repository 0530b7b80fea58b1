"""The bookie's gRPC server (proto/bookie.proto) over a BookieEngine, plus its disk monitor.

Owns: translating wire messages to engine calls and back; the AddEntries stream's pipelining and where
its in-flight bounds apply; gRPC health (SERVING, NOT_SERVING while draining) and reflection; the disk monitor
that feeds disk usage to the engine and reports read-only flips; draining on shutdown.

AddEntries pipelining: a reader task takes AddRequests in arrival order and starts each batch in the
engine (`start_adds`, `start_adds_compact` for the compact form: validation, cache, journal queueing, no task
per batch); the batches wait in a bounded in-order queue; the RPC's writer answers each request, in request
order, once its batch is durable. OK in a response means the entry is durable (the engine returns only after
the journal sync covering it). Answers that are ready when the writer sends one (a journal sync makes several
requests durable at once) go in the same AddResponse, in its `next` (at most _ANSWERS_PER_MESSAGE_MAX): a gRPC
message costs far more than its bytes.

Bounds: the add bounds (`add_inflight_per_stream_max`, `add_inflight_total_max`) are bookie/requests.py
AddAdmission, one per server and one share per stream; a refused request is answered TOO_MANY_REQUESTS for
every entry, in its turn, without waiting for the engine (never hangs, never buffers). An admitted
request counts until its answer is yielded or its stream ends. The in-order queue holds at most
`add_inflight_per_stream_max` requests; when it is full (the client is not reading its responses) the
reader stops reading, and gRPC flow control pushes back on the client. Messages above `frame_bytes_max`
are refused by gRPC itself (RESOURCE_EXHAUSTED, that stream only) before they are buffered. At most
`requests_inflight_max` RPCs run at once (an open AddEntries stream counts until it ends); gRPC refuses more
with RESOURCE_EXHAUSTED before any handler runs, so idle streams cannot grow the bookie without bound.

ReadEntries (several entries of one ledger in one call; recovery's read-forward and readers use it, since a
unary gRPC call costs far more than reading an entry) follows bookie/requests.py read_entries: the batch
bound (BAD_REQUEST), the fence once by the first id, a status per id, the `frame_bytes_max` budget
(TOO_MANY_REQUESTS for the ids left unread). An engine failure mid-batch answers IO_ERROR for the rest.

ListEntries answers one page of the engine's list_entries (bookie/requests.py "ListEntries": bounded by
`list_entries_ids_max` ids and by `frame_bytes_max`; the client asks again from `next_entry`).

BookieAdmin (adapters/bookie_admin.py, the operator's calls: run a GC round now, GC status, entry-log stats) is
a second service on the same server, outside the replication protocol; shutdown stops it first, so a round an
operator asked for is cancelled before the engine closes.

Garbage collection (bookie/gc.py): when the server is given a GarbageCollector it starts its periodic loop
with the server and stops it first on shutdown; each disk check tells it the disk state, so a bookie that has
just gone read-only for disk usage collects and compacts at once (and goes writable again through the
engine's low-water mark once that freed enough).

TLS (security/tls.py): given a SecurityConfig with tls_enabled, the server listens with TLS only (a plaintext
client fails its handshake), reloads changed certificate files for new connections, requires a client
certificate with tls_client_auth, and with bookie_authorized_roles refuses every call of a client whose
certificate's role is not allowed (PERMISSION_DENIED; UNAUTHENTICATED without a certificate).

Must not: block the event loop (no ZooKeeper calls here: read-only flips go to a callback), log keys.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bksim.adapters.bookie_admin import BookieAdminServicer
from bksim.adapters.grpc_input import MalformedRequests
from bksim.bookie.requests import AddAdmission, AddStreamAdmission, read_batch_refusal, read_entries
from bksim.gen import bookie_pb2, bookie_pb2_grpc
from bksim.model.config import BookieConfig, SecurityConfig
from bksim.model.errors import BksimError
from bksim.model.histogram import LatencyHistogram
from bksim.model.status import FLAG_FENCE, StatusCode
from bksim.security.tls import add_port, server_interceptors

SERVICE_NAME = bookie_pb2.DESCRIPTOR.services_by_name["Bookie"].full_name
ADMIN_SERVICE_NAME = bookie_pb2.DESCRIPTOR.services_by_name["BookieAdmin"].full_name

_IO_ERROR = StatusCode.IO_ERROR
_BAD_REQUEST = StatusCode.BAD_REQUEST
_AddResponse = bookie_pb2.AddResponse
_ANSWERS_PER_MESSAGE_MAX = 64  # answers gathered into one AddResponse (the first and its `next`)
_NOTHING = object()
_ReadEntryResult = bookie_pb2.ReadEntryResult
_EntryRange = bookie_pb2.EntryRange


def server_options(config: BookieConfig) -> list[tuple[str, int]]:
    """gRPC channel options: message size bounds checked before buffering; no port sharing."""
    return [
        ("grpc.max_receive_message_length", config.frame_bytes_max),
        ("grpc.max_send_message_length", config.frame_bytes_max),
        ("grpc.so_reuseport", 0),  # a second bookie on the same port must fail to bind, not share it
    ]


class _Stream:
    """Per-AddEntries-stream state."""

    __slots__ = ("admission", "reader")

    def __init__(self, admission: AddStreamAdmission) -> None:
        self.admission = admission  # this stream's share of the add bounds
        self.reader: asyncio.Task | None = None


class BookieServicer(bookie_pb2_grpc.BookieServicer):
    """The Bookie service: every handler is a thin translation onto the engine."""

    def __init__(self, engine, config: BookieConfig, bookie_id: str, log: Callable[[str], None]) -> None:
        self._engine = engine
        self._bookie_id = bookie_id
        self._log = log
        self._config = config
        self._queue_max = config.add_inflight_per_stream_max
        self._admission = AddAdmission(config, bookie_id)
        self._streams: set[_Stream] = set()
        self._no_streams = asyncio.Event()
        self._no_streams.set()
        self.draining = False
        # statistics
        self.streams_opened = 0
        self.add_answer_messages = 0  # AddResponse messages sent: each answers one request and its `next`
        self.read_batches = 0
        self.read_batch_entries = 0
        self.list_calls = 0  # ListEntries pages answered
        self.list_ranges = 0
        # request -> response latency per entry (exported as bookkeeper_server_ADD_ENTRY_REQUEST / READ_ENTRY_REQUEST)
        self.add_request_latency = LatencyHistogram()
        self.read_request_latency = LatencyHistogram()

    # -- AddEntries --------------------------------------------------------------------------------------

    async def AddEntries(self, request_iterator, context):
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"bookie {self._bookie_id} is shutting down")
        stream = _Stream(self._admission.open_stream())
        queue: asyncio.Queue = asyncio.Queue(self._queue_max)
        stream.reader = asyncio.create_task(self._read_adds(request_iterator, queue, stream))
        self._streams.add(stream)
        self._no_streams.clear()
        self.streams_opened += 1
        try:
            held = _NOTHING  # an item taken off the queue while gathering answers, not ready yet
            while True:
                item, held = (await queue.get() if held is _NOTHING else held), _NOTHING
                if item is None:
                    return  # client half-closed (or the bookie drains): every accepted request was answered
                response = await self._answer(item, stream)
                # answers that are ready now go in the same message (one journal sync answers several requests)
                following = response.next
                while len(following) < _ANSWERS_PER_MESSAGE_MAX and not queue.empty():
                    item = queue.get_nowait()
                    if item is None or not (item.__class__ is _AddResponse or item[2].ready()):
                        held = item
                        break
                    following.append(await self._answer(item, stream))
                self.add_answer_messages += 1
                yield response
        finally:
            stream.admission.close()  # unanswered adds of a stream that ended stop counting
            self._streams.discard(stream)
            if not self._streams:
                self._no_streams.set()
            stream.reader.cancel()

    async def _answer(self, item, stream: _Stream) -> bookie_pb2.AddResponse:
        """The answer to one queued request: rejected up front, or its batch's outcome once durable."""
        if item.__class__ is _AddResponse:
            return item
        batch_id, n, batch, received = item
        try:
            statuses, message = await batch.result()
        except Exception as e:  # noqa: BLE001 - an engine bug must not kill the stream silently
            self._log(f"add_entries failed: {type(e).__name__}: {e}")
            statuses, message = [_IO_ERROR] * n, f"bookie internal error: {type(e).__name__}: {e}"
        stream.admission.answered(n)
        self.add_request_latency.observe((time.monotonic() - received) * 1000.0, n)
        return _AddResponse(batch_id=batch_id, statuses=statuses, message=message)

    async def _read_adds(self, request_iterator, queue: asyncio.Queue, stream: _Stream) -> None:
        start_adds = self._engine.start_adds
        start_adds_compact = self._engine.start_adds_compact
        admit = stream.admission.admit
        try:
            async for req in request_iterator:
                received = time.monotonic()
                entries, data = req.entries, req.data
                n = len(entries) + len(data)
                if entries and data:
                    await queue.put(_AddResponse(batch_id=req.batch_id, statuses=[_BAD_REQUEST] * n, message=(
                        f"an AddRequest carries `entries` or the compact form `data`, not both ({len(entries)} and "
                        f"{len(data)})")))
                    continue
                refused = admit(n)
                if refused is not None:
                    await queue.put(_AddResponse(batch_id=req.batch_id, statuses=refused[0], message=refused[1]))
                    continue
                try:
                    if data:
                        key, flags = req.master_key, req.flags
                        batch = start_adds_compact(list(data), key, flags)
                    else:
                        batch = start_adds([(e.entry, e.master_key, e.flags) for e in entries])
                except Exception as e:  # noqa: BLE001 - an engine bug must not kill the stream silently
                    self._log(f"add_entries failed: {type(e).__name__}: {e}")
                    batch = _FailedBatch(n, f"bookie internal error: {type(e).__name__}: {e}")
                await queue.put((req.batch_id, n, batch, received))
        except asyncio.CancelledError:
            pass  # draining, or the RPC ended: stop reading; what was accepted is still answered
        except grpc.RpcError:
            pass  # the stream broke (client gone, message too large): the writer side ends with it
        finally:
            try:
                queue.put_nowait(None)
            except asyncio.QueueFull:
                await _put_end(queue)

    def begin_drain(self) -> None:
        """Stop reading new add requests on every stream; accepted ones are still answered, then streams end."""
        self.draining = True
        for stream in list(self._streams):
            if stream.reader is not None:
                stream.reader.cancel()

    async def wait_streams_closed(self, timeout_s: float) -> bool:
        """Wait (bounded) until every AddEntries stream has ended; True if they all did."""
        try:
            await asyncio.wait_for(self._no_streams.wait(), max(0.0, timeout_s))
        except TimeoutError:
            return False
        return True

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # -- unary calls -----------------------------------------------------------------------------------

    async def ReadEntry(self, request, context):
        received = time.monotonic()
        try:
            status, entry, lac, message = await self._engine.read_entry(
                request.ledger_id, request.entry_id, bool(request.flags & FLAG_FENCE), request.master_key)
        except Exception as e:  # noqa: BLE001
            return bookie_pb2.ReadEntryResponse(status=_IO_ERROR, last_add_confirmed=-1,
                                                message=self._internal(e, "read_entry"))
        self.read_request_latency.observe((time.monotonic() - received) * 1000.0)
        return bookie_pb2.ReadEntryResponse(status=status, entry=entry, last_add_confirmed=lac, message=message)

    async def ReadEntries(self, request, context):
        received = time.monotonic()
        ids = request.entry_ids
        ledger_id = request.ledger_id
        self.read_batches += 1
        if read_batch_refusal(ledger_id, ids, self._config.read_batch_entries_max) is None:
            self.read_batch_entries += len(ids)
        results = await read_entries(self._engine, self._config, ledger_id, ids, bool(request.flags & FLAG_FENCE),
                                     request.master_key,
                                     internal_error=lambda e: self._internal(e, "read_entries"))
        self.read_request_latency.observe((time.monotonic() - received) * 1000.0, len(results))
        return bookie_pb2.ReadEntriesResponse(results=[
            _ReadEntryResult(status=status, entry=entry, last_add_confirmed=lac, message=message)
            for status, entry, lac, message in results])

    async def ReadLac(self, request, context):
        try:
            status, lac, last_entry_id, message = await self._engine.read_lac(request.ledger_id)
        except Exception as e:  # noqa: BLE001
            return bookie_pb2.ReadLacResponse(status=_IO_ERROR, last_add_confirmed=-1, last_entry_id=-1,
                                              message=self._internal(e, "read_lac"))
        return bookie_pb2.ReadLacResponse(status=status, last_add_confirmed=lac, last_entry_id=last_entry_id,
                                          message=message)

    async def ListEntries(self, request, context):
        self.list_calls += 1
        try:
            status, ranges, next_entry, message = await self._engine.list_entries(request.ledger_id,
                                                                                  request.first_entry)
        except Exception as e:  # noqa: BLE001
            return bookie_pb2.ListEntriesResponse(status=_IO_ERROR, next_entry=-1,
                                                  message=self._internal(e, "list_entries"))
        self.list_ranges += len(ranges)
        return bookie_pb2.ListEntriesResponse(status=status, ranges=[_EntryRange(first=first, last=last)
                                                                     for first, last in ranges],
                                              next_entry=next_entry, message=message)

    async def WriteLac(self, request, context):
        try:
            status, message = await self._engine.write_lac(request.ledger_id, request.last_add_confirmed,
                                                           request.master_key)
        except Exception as e:  # noqa: BLE001
            return bookie_pb2.WriteLacResponse(status=_IO_ERROR, message=self._internal(e, "write_lac"))
        return bookie_pb2.WriteLacResponse(status=status, message=message)

    async def GetBookieInfo(self, request, context):
        info = self._engine.info()
        return bookie_pb2.GetBookieInfoResponse(
            free_bytes=int(info.get("free_bytes", 0)), total_bytes=int(info.get("total_bytes", 0)),
            state=str(info.get("state", "")), instance_id=str(info.get("instance_id", "")),
            bookie_id=self._bookie_id)

    def _internal(self, e: Exception, what: str) -> str:
        self._log(f"{what} failed: {type(e).__name__}: {e}")
        return f"bookie internal error in {what}: {type(e).__name__}: {e}"

    def statistics(self) -> dict:
        a = self._admission
        return {"add_requests": a.requests, "add_entries": a.entries,
                "add_rejected_entries": a.rejected_entries, "streams_opened": self.streams_opened,
                "add_answer_messages": self.add_answer_messages,
                "read_batches": self.read_batches, "read_batch_entries": self.read_batch_entries,
                "list_calls": self.list_calls, "list_ranges": self.list_ranges,
                "streams_open": len(self._streams), "add_inflight_total": a.inflight_total}


class _FailedBatch:
    """Stands in for an engine AddBatch when start_adds itself failed (a bug): every entry is IO_ERROR."""

    def __init__(self, n: int, message: str) -> None:
        self._outcome = ([_IO_ERROR] * n, message)

    def ready(self) -> bool:
        return True

    async def result(self):
        return self._outcome


async def _put_end(queue: asyncio.Queue) -> None:
    # the writer is still consuming (or it has gone and cancels us): waiting here is bounded by either
    try:
        await queue.put(None)
    except asyncio.CancelledError:
        pass


class BookieServer:
    """The gRPC server of one bookie plus its disk monitor.

    `on_read_only_change(read_only)` is awaited whenever the engine's read-only state differs from the
    state last reported (ZooKeeper re-registration); a failure is logged and retried at the next check.
    """

    def __init__(self, engine, config: BookieConfig, bookie_id: str, *, disk, clock,
                 journal_dir: str, ledger_dir: str, log: Callable[[str], None] = print,
                 on_read_only_change: Callable[[bool], Awaitable[None]] | None = None, gc=None,
                 security: SecurityConfig | None = None) -> None:
        self._engine = engine
        self.gc = gc  # a bookie.gc.GarbageCollector, or None (no garbage collection)
        self._security = security  # None or tls_enabled off: plaintext
        self.tls_reloader = None  # security.tls.CertificateReloader when serving TLS
        self._config = config
        self._disk = disk
        self._clock = clock
        self._dirs = (ledger_dir, journal_dir)
        self._log = log
        self._on_read_only_change = on_read_only_change
        self.servicer = BookieServicer(engine, config, bookie_id, log)
        self.admin = BookieAdminServicer(gc, config, self.servicer, log)  # operator calls: bookie gc, gc-status
        self.health = HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._monitor: asyncio.Task | None = None
        self._reported_read_only = False
        self.port: int | None = None

    async def start(self) -> int:
        """Bind host:port (0 = any free port), start serving and the disk monitor. Returns the bound port."""
        self.check_disk()  # the first state is known before the first request
        server = grpc.aio.server(options=server_options(self._config),
                                 interceptors=[*server_interceptors(self._security),  # certificate roles
                                               MalformedRequests()],  # unparsable: INVALID_ARGUMENT
                                 maximum_concurrent_rpcs=self._config.requests_inflight_max)
        bookie_pb2_grpc.add_BookieServicer_to_server(self.servicer, server)
        bookie_pb2_grpc.add_BookieAdminServicer_to_server(self.admin, server)  # adapters/bookie_admin.py
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection((SERVICE_NAME, ADMIN_SERVICE_NAME,
                                             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                             reflection.SERVICE_NAME), server)
        address = f"{self._config.host}:{self._config.port}"
        try:
            port, self.tls_reloader = add_port(server, address, self._security, self._log)
        except RuntimeError:
            port = 0
        if port == 0:
            raise BksimError(f"cannot listen on {address}: the address is in use or not local "
                             f"(is another bookie running on port {self._config.port}?)")
        await server.start()
        self._server = server
        self.port = port
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._monitor = asyncio.create_task(self._monitor_disk())
        if self.gc is not None:
            self.gc.start()
        return port

    @property
    def reported_read_only(self) -> bool:
        return self._reported_read_only

    def check_disk(self) -> bool:
        """Feed the fuller of the ledger and journal file systems to the engine; True if read-only flipped."""
        best = None
        for d in dict.fromkeys(self._dirs):
            total, free = self._disk.usage(d)
            used = (total - free) / total if total > 0 else 1.0
            if best is None or used > best[0]:
                best = (used, total, free)
        _, total, free = best
        return self._engine.set_disk_usage(total, free)  # the engine logs a flip

    async def _monitor_disk(self) -> None:
        interval = self._config.disk_check_interval_ms
        while True:
            try:
                self.check_disk()
                if self.gc is not None:
                    self.gc.note_disk_state()
                read_only = self._engine.read_only
                if read_only != self._reported_read_only and self._on_read_only_change is not None:
                    await self._on_read_only_change(read_only)
                self._reported_read_only = read_only
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - keep monitoring; the next check retries
                self._log(f"disk check / state report failed (retrying in {interval} ms): {type(e).__name__}: {e}")
            await self._clock.sleep_ms(interval)

    async def stop(self, grace_ms: float) -> None:
        """Drain, then stop; all within `grace_ms`.

        1. health NOT_SERVING; new AddEntries streams are refused (UNAVAILABLE) but the port stays open, so
           clients can still ask for health and finish reads; 2. every stream stops reading requests,
           answers what it accepted, and ends; 3. the gRPC server stops (in-flight unary calls get the rest
           of the grace period, then are cancelled).
        """
        deadline = self._clock.monotonic_ms() + grace_ms
        await self.admin.stop()  # rounds asked through BookieAdmin, before the collector's own loop
        if self.gc is not None:
            await self.gc.stop()
        await self.health.enter_graceful_shutdown()
        self.servicer.begin_drain()
        if self._monitor is not None:
            self._monitor.cancel()
            try:
                await self._monitor
            except asyncio.CancelledError:
                pass
        drained = await self.servicer.wait_streams_closed((deadline - self._clock.monotonic_ms()) / 1000.0)
        if not drained:
            self._log(f"{self.servicer.open_streams} add stream(s) still answering after shutdown_grace_ms={grace_ms}: "
                      f"cancelling them (their unanswered adds have an unknown outcome)")
        if self._server is not None:
            await self._server.stop(max(0.0, (deadline - self._clock.monotonic_ms()) / 1000.0))

    def statistics(self) -> dict:
        gc = {"gc": self.gc.statistics()} if self.gc is not None else {}
        return {**self.servicer.statistics(), "reported_read_only": self._reported_read_only, **gc}
