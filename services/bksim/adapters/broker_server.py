"""The broker's gRPC server (proto/broker.proto) over a LedgerService (broker/ledgers.py).

Owns: translating wire messages to LedgerService calls and back; LedgerError -> gRPC status (the mapping is
written at the top of proto/broker.proto; the LedgerStatus name also travels in the trailing metadata key
"bksim-status"); the Append stream's pipelining; the bound on concurrent RPCs (`requests_inflight_max`:
more get RESOURCE_EXHAUSTED at once, nothing queues without limit); health (SERVING, NOT_SERVING while
draining) and reflection.

Append stream: a reader task takes AppendRequests in arrival order, waits for ledger room
(`append_inflight_max`; a request that fits is then taken whole), starts every payload of the request (consecutive
entry ids, one loop turn, so the adds of one request travel in shared batches) and queues the request's futures;
the RPC answers each request in request order once its last entry is acknowledged (acks are in id order, so then
all of them are). The answers to the requests acknowledged by then too ride in the same message (`next`, at most
ANSWERS_PER_MESSAGE_MAX answers in all): one bookie answer usually acknowledges several requests, and a gRPC message
costs far more than its bytes. The queue of unanswered requests is bounded (APPEND_QUEUE_MAX); when full the reader
stops reading and gRPC flow control pushes back. The first failure ends the stream with its status; requests
without a response have an unknown outcome.

TLS (security/tls.py): given a SecurityConfig with tls_enabled, the server listens with TLS only (a plaintext
client fails its handshake), reloads changed certificate files for new connections and, with tls_client_auth,
requires a client certificate signed by the CA. With security.auth_enabled an interceptor
(security/broker_auth.py) requires a valid token on every Broker and Topics call; with authorization_enabled it
also keeps the ledger API to super-users and ledger roles, and the Topics servicer checks each call's resource.

Must not: block the event loop, log passwords or payloads.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from bksim.adapters.broker_client import GRPC_CODE_NAME
from bksim.adapters.grpc_input import MalformedRequests, bounded_details
from bksim.broker.ledgers import LedgerService
from bksim.gen import broker_pb2, broker_pb2_grpc
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.model.config import BrokerConfig, SecurityConfig
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus
from bksim.security.tls import add_port

SERVICE_NAME = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
APPEND_QUEUE_MAX = 1024  # unanswered AppendRequests per stream before the reader stops reading
ANSWERS_PER_MESSAGE_MAX = 64  # answers gathered into one AppendResponse (the first and its `next`)
READ_MESSAGE_BYTES = 1024 * 1024  # ReadEntries packs entries into messages of about this size
READ_MESSAGE_ENTRIES_MAX = 1024
STATUS_KEY = "bksim-status"

_AppendResponse = broker_pb2.AppendResponse
_NOTHING = object()

GRPC_CODE = {status: getattr(grpc.StatusCode, name) for status, name in GRPC_CODE_NAME.items()}


def server_options(config: BrokerConfig) -> list[tuple[str, int]]:
    frame = config.payload_bytes_max + 64 * 1024
    return [("grpc.max_receive_message_length", max(frame, 8 * 1024 * 1024)),
            ("grpc.max_send_message_length", max(frame, 8 * 1024 * 1024)),
            ("grpc.so_reuseport", 0)]


def metadata_message(ledger_id: int, md: LedgerMetadata, version: int = -1) -> broker_pb2.LedgerMetadata:
    return broker_pb2.LedgerMetadata(
        ledger_id=ledger_id, ensemble_size=md.ensemble_size, write_quorum_size=md.write_quorum_size,
        ack_quorum_size=md.ack_quorum_size, state=md.state.name, last_entry_id=md.last_entry_id, length=md.length,
        segments=[broker_pb2.Segment(first_entry_id=s.first_entry_id, ensemble=list(s.ensemble))
                  for s in md.segments],
        digest_type=md.digest_type, ctime_ms=md.ctime_ms, custom=dict(md.custom),
        format_version=md.format_version, version=version)


async def _abort(context, error: LedgerError):
    context.set_trailing_metadata(((STATUS_KEY, error.status),))
    await context.abort(GRPC_CODE.get(error.status, grpc.StatusCode.UNKNOWN), bounded_details(error.message))


class _Admission:
    """At most `limit` RPCs in the broker at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def __enter__(self):
        if self.active >= self.limit:
            raise LedgerError(LedgerStatus.TOO_MANY_REQUESTS, f"{self.active} requests in flight "
                                                              f"(broker.requests_inflight_max = {self.limit})")
        self.active += 1
        return self

    def __exit__(self, *exc) -> None:
        self.active -= 1


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, service: LedgerService, config: BrokerConfig, log: Callable[[str], None]) -> None:
        self.service = service
        self._config = config
        self._log = log
        self._admission = _Admission(config.requests_inflight_max)
        self.draining = False
        self.appended = 0  # entries acknowledged through Append streams

    async def _guarded(self, context, call):
        try:
            if self.draining:
                raise LedgerError(LedgerStatus.ABORTED, "the broker is shutting down")
            with self._admission:
                return await call()
        except LedgerError as e:
            await _abort(context, e)

    # -- unary calls ----------------------------------------------------------------------------------------
    async def CreateLedger(self, request, context):
        async def call():
            handle = await self.service.create_ledger(
                request.ensemble_size, request.write_quorum_size, request.ack_quorum_size,
                password=request.password, digest_type=request.digest_type or "crc32c",
                custom=dict(request.custom))
            return broker_pb2.CreateLedgerResponse(
                metadata=metadata_message(handle.ledger_id, handle.metadata, handle.version))
        return await self._guarded(context, call)

    async def ReadLac(self, request, context):
        async def call():
            lac = await self.service.read_lac(request.ledger_id, password=request.password)
            return broker_pb2.ReadLacResponse(last_add_confirmed=lac)
        return await self._guarded(context, call)

    async def OpenLedger(self, request, context):
        async def call():
            md = await self.service.open_ledger(request.ledger_id, password=request.password,
                                                recover=request.recover)
            lac = md.last_entry_id if md.is_closed else await self.service.read_lac(
                request.ledger_id, password=request.password)
            _, version = await self.service.metadata(request.ledger_id)
            return broker_pb2.OpenLedgerResponse(metadata=metadata_message(request.ledger_id, md, version),
                                                 last_add_confirmed=lac)
        return await self._guarded(context, call)

    async def CloseLedger(self, request, context):
        async def call():
            md = await self.service.close_ledger(request.ledger_id, request.password)
            _, version = await self.service.metadata(request.ledger_id)
            return broker_pb2.CloseLedgerResponse(metadata=metadata_message(request.ledger_id, md, version))
        return await self._guarded(context, call)

    async def DeleteLedger(self, request, context):
        async def call():
            await self.service.delete_ledger(request.ledger_id, password=request.password)
            return broker_pb2.DeleteLedgerResponse()
        return await self._guarded(context, call)

    async def ListLedgers(self, request, context):
        async def call():
            return broker_pb2.ListLedgersResponse(ledger_ids=await self.service.list_ledgers())
        return await self._guarded(context, call)

    async def GetLedgerMetadata(self, request, context):
        async def call():
            md, version = await self.service.metadata(request.ledger_id)
            return broker_pb2.GetLedgerMetadataResponse(metadata=metadata_message(request.ledger_id, md, version))
        return await self._guarded(context, call)

    async def ListBookies(self, request, context):
        async def call():
            writable = await self.service.writable_bookies()
            readonly = await self.service.readonly_bookies()
            return broker_pb2.ListBookiesResponse(
                bookies=[broker_pb2.BookieInfo(bookie_id=b, state="writable") for b in writable]
                + [broker_pb2.BookieInfo(bookie_id=b, state="read-only") for b in readonly])
        return await self._guarded(context, call)

    # -- streams --------------------------------------------------------------------------------------------
    async def ReadEntries(self, request, context):
        try:
            if self.draining:
                raise LedgerError(LedgerStatus.ABORTED, "the broker is shutting down")
            with self._admission:
                batch: list = []
                size = 0
                async for entry in self.service.read_entries(request.ledger_id, request.first_entry_id,
                                                             request.last_entry_id, password=request.password):
                    batch.append(broker_pb2.Entry(entry_id=entry.entry_id, payload=entry.payload,
                                                  ledger_length=entry.ledger_length))
                    size += len(entry.payload) + 32
                    if size >= READ_MESSAGE_BYTES or len(batch) >= READ_MESSAGE_ENTRIES_MAX:
                        await context.write(broker_pb2.ReadEntriesResponse(entries=batch))
                        batch, size = [], 0
                if batch:
                    await context.write(broker_pb2.ReadEntriesResponse(entries=batch))
        except LedgerError as e:
            await _abort(context, e)

    async def Append(self, request_iterator, context):
        try:
            if self.draining:
                raise LedgerError(LedgerStatus.ABORTED, "the broker is shutting down")
            with self._admission:
                await self._append(request_iterator, context)
        except LedgerError as e:
            try:  # in-band first: the status alone can be lost to a grpc.aio race (see proto/broker.proto)
                await context.write(broker_pb2.AppendResponse(
                    error=broker_pb2.LedgerStatus.Value(e.status) if e.status in broker_pb2.LedgerStatus.keys()
                    else broker_pb2.LedgerStatus.INTERNAL, message=e.message))
            except Exception:  # noqa: BLE001 - the client is gone; the status below is all that is left
                pass
            await _abort(context, e)

    async def _append(self, request_iterator, context) -> None:
        queue: asyncio.Queue = asyncio.Queue(APPEND_QUEUE_MAX)
        reader = asyncio.get_running_loop().create_task(self._read_appends(request_iterator, queue))
        held = _NOTHING  # an item taken from the queue to see whether its answer was ready, and it was not
        try:
            while True:
                item = held if held is not _NOTHING else await queue.get()
                held = _NOTHING
                if item is None:
                    break
                if isinstance(item, LedgerError):
                    raise item
                request_id, first, count, last, handle = item
                if last is not None:
                    await last  # acks come in id order: the last one done means all are done
                self.appended += count
                response = _AppendResponse(request_id=request_id, first_entry_id=first, count=count,
                                           last_add_confirmed=handle.last_add_confirmed)
                following = response.next  # the answers that are ready too
                while len(following) < ANSWERS_PER_MESSAGE_MAX - 1 and not queue.empty():
                    held = queue.get_nowait()
                    if held is None or isinstance(held, LedgerError) or not _acknowledged(held[3]):
                        break
                    request_id, first, count, _, handle = held
                    held = _NOTHING
                    self.appended += count
                    following.append(_AppendResponse(request_id=request_id, first_entry_id=first, count=count,
                                                     last_add_confirmed=handle.last_add_confirmed))
                await context.write(response)
        finally:
            reader.cancel()

    async def _read_appends(self, request_iterator, queue: asyncio.Queue) -> None:
        service = self.service
        try:
            async for request in request_iterator:
                handle = await service.appender(request.ledger_id, request.password)
                limit = self._config.payload_bytes_max
                payloads = list(request.payloads)  # each read of a repeated bytes field makes a new copy
                if payloads and max(map(len, payloads)) > limit:  # all or nothing: check before appending any
                    i = next(i for i, payload in enumerate(payloads) if len(payload) > limit)
                    raise LedgerError(LedgerStatus.BAD_REQUEST,
                                      f"payload {i} of request {request.request_id} has "
                                      f"{len(payloads[i])} bytes, more than payload_bytes_max {limit}")
                await handle.wait_for_room()  # then the whole request: its ids stay consecutive (the
                # overshoot is bounded by one request, itself bounded by the frame size)
                first = handle.writer.last_add_pushed + 1
                last = handle.append_many(payloads) if payloads else None
                await queue.put((request.request_id, first, len(payloads), last, handle))
            await queue.put(None)
        except LedgerError as e:
            await queue.put(e)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken client stream
            await queue.put(LedgerError(LedgerStatus.ABORTED, f"append stream broke: {e!r}"))

    def begin_drain(self) -> None:
        self.draining = True


def _acknowledged(last: asyncio.Future | None) -> bool:
    """Whether an Append request whose last entry's future is `last` (None: no payloads) is answered OK now."""
    return last is None or (last.done() and not last.cancelled() and last.exception() is None)


class BrokerServer:
    """The gRPC server of one broker: Broker service, Topics service (when given a TopicService), health,
    reflection. Both services share one bound on concurrent RPCs."""

    def __init__(self, service: LedgerService, config: BrokerConfig, log: Callable[[str], None],
                 topics=None, security: SecurityConfig | None = None) -> None:
        self.config = config
        self.servicer = BrokerServicer(service, config, log)
        self.topics_servicer = None
        if topics is not None:
            from bksim.adapters.topic_server import TopicsServicer
            self.topics_servicer = TopicsServicer(topics, self.servicer._admission, log)
        self._log = log
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self.port = 0
        self._security = security  # None or tls_enabled off: plaintext
        self.auth = None  # security.broker_auth.AuthInterceptor with security.auth_enabled (keys read now)
        if security is not None and security.auth_enabled:
            from bksim.security.broker_auth import make_interceptor
            self.auth = make_interceptor(security)
            if self.topics_servicer is not None and self.auth.authorizer is not None:
                self.topics_servicer.authorize_with(self.auth.authorizer)
        self.tls_reloader = None  # security.tls.CertificateReloader when serving TLS

    async def start(self) -> int:
        server = grpc.aio.server(options=server_options(self.config),
                                 interceptors=[*([self.auth] if self.auth else []),  # token first
                                               MalformedRequests()])  # unparsable: INVALID_ARGUMENT
        broker_pb2_grpc.add_BrokerServicer_to_server(self.servicer, server)
        names = [SERVICE_NAME]
        if self.topics_servicer is not None:
            from bksim.adapters.topic_server import SERVICE_NAME as TOPICS_SERVICE_NAME
            from bksim.gen import topic_pb2_grpc
            topic_pb2_grpc.add_TopicsServicer_to_server(self.topics_servicer, server)
            names.append(TOPICS_SERVICE_NAME)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*names, reflection.SERVICE_NAME, "grpc.health.v1.Health"), server)
        self._health_names = ["", *names]
        self.port, self.tls_reloader = add_port(server, f"{self.config.host}:{self.config.port}", self._security,
                                                self._log)
        if self.port == 0:
            raise OSError(f"broker cannot bind {self.config.host}:{self.config.port}")
        await server.start()
        self._server = server
        for name in self._health_names:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    async def stop(self, grace_ms: float) -> None:
        self.servicer.begin_drain()
        if self.topics_servicer is not None:
            self.topics_servicer.begin_drain()
        for name in getattr(self, "_health_names", ("", SERVICE_NAME)):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._server is not None:
            await self._server.stop(grace_ms / 1000.0)
