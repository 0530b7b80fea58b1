"""A small in-process fake of the Topics gRPC service (proto/topic.proto) for the client's unit tests.

`FakeCluster` holds the state shared by its fake brokers (tenants, namespaces, topics with their entries,
subscriptions, who owns which topic) and records what clients sent (Sends, Flows, Acks, Redelivers, Seeks).
Each `FakeBroker` is a grpc.aio server on a loopback port; all of them run on one event loop thread.

The fake keeps the wire contract the client relies on: ProducerReady/Subscribed first, receipts in Send order
with (ledger, entry, partition, batch_size, duplicate), entries encoded with formats/message.py (batch when a
Send has several messages), deliveries never beyond the consumer's permits (a batch counts all its
messages), acked batch indexes with redeliveries, cumulative acks refused on Shared/Key_Shared, in-band
Error before a stream ends, NOT_OWNER with the owner's address, and the "bksim-status" trailer on refused unary
calls. Faults are injected through `FakeCluster` fields (see each one's comment). Not a broker: one ledger per
topic (id 7), no cursor persistence, Failover/Key_Shared dispatch like Shared.
"""
from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field

import grpc

from bksim.client.core import LoopThread
from bksim.formats.message import Message, encode_entry, read_header
from bksim.gen import topic_pb2, topic_pb2_grpc
from helpers import free_port

LEDGER = 7
STATUS_KEY = "bksim-status"


class Refusal(Exception):
    def __init__(self, status: str, message: str, owner_address: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.owner_address = status, message, owner_address

    def pb(self) -> topic_pb2.Error:
        return topic_pb2.Error(status=topic_pb2.TopicStatus.Value(self.status), message=self.message,
                               owner_address=self.owner_address)


GRPC_CODE = {"NOT_OWNER": "UNAVAILABLE", "TOPIC_NOT_FOUND": "NOT_FOUND", "NAMESPACE_NOT_FOUND": "NOT_FOUND",
             "TENANT_NOT_FOUND": "NOT_FOUND", "ALREADY_EXISTS": "ALREADY_EXISTS", "BAD_REQUEST": "INVALID_ARGUMENT",
             "NOT_ALLOWED": "FAILED_PRECONDITION", "CONSUMER_BUSY": "FAILED_PRECONDITION",
             "SERVICE_UNAVAILABLE": "UNAVAILABLE"}


@dataclass
class FakeSub:
    name: str
    type: int
    next_entry: int = 0                                   # next entry id to deliver
    acked: set = field(default_factory=set)               # entry ids fully acked
    acked_indexes: dict = field(default_factory=dict)     # entry id -> set of acked batch indexes
    redelivery: dict = field(default_factory=dict)        # entry id -> count
    replay: list = field(default_factory=list)            # entry ids to deliver again
    consumers: list = field(default_factory=list)


@dataclass
class FakeTopic:
    name: str
    partition: int
    entries: list = field(default_factory=list)           # entry bytes, entry id = index
    subs: dict = field(default_factory=dict)
    wake: asyncio.Event | None = None


class FakeCluster:
    def __init__(self) -> None:
        self.loop = LoopThread("fake-topics")
        self.brokers: list[FakeBroker] = []
        self.tenants: set[str] = set()
        self.namespaces: dict[str, dict] = {}
        self.partitioned: dict[str, int] = {}
        self.topics: dict[str, FakeTopic] = {}
        self.owner: dict[str, str] = {}                    # topic -> broker address (default: the first broker)
        self.dedup: dict[tuple[str, str], int] = {}        # (topic, producer) -> highest persisted sequence id
        # records
        self.sends: list[tuple[str, str, list[int]]] = []  # (broker address, topic, sequence ids) per Send received
        self.flows: list[int] = []
        # (topic, [(entry, batch index or a tuple of them (an ack set), batch size)], cumulative)
        self.acks: list[tuple[str, list, bool]] = []
        self.redelivers: list[list[int]] = []
        self.seeks: list = []
        self.lookups = 0
        # faults
        self.fail_sends: list[tuple[str, str]] = []        # next Sends: end the stream with (status, owner_address)
        self.hold_receipts = False                         # persist Sends but answer none (send timeout tests)
        self.fail_subscribe: list[str] = []                # next Subscribes: refuse with this status
        self.fail_produce_opens: list[str] = []            # next ProducerOpens: refuse with this status

    def start(self, n: int = 1) -> "FakeCluster":
        for _ in range(n):
            b = FakeBroker(self)
            self.loop.run(b.start(), 10)
            self.brokers.append(b)
        return self

    def stop(self) -> None:
        for b in self.brokers:
            self.loop.run(b.stop(), 10)
        self.loop.stop()

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.brokers]

    def run(self, fn, *args):
        """Run fn(*args) on the fake's loop (state is loop-owned) and return its result."""
        async def call():
            return fn(*args)
        return self.loop.run(call(), 10)

    # -- helpers for tests -----------------------------------------------------------------------------------
    def add_topic(self, topic: str, partitions: int = 0, dedup: bool = False) -> None:
        ns = topic.removeprefix("persistent://").rsplit("/", 1)[0]
        self.tenants.add(ns.split("/")[0])
        self.namespaces.setdefault(ns, {"retention_ms": 0, "retention_bytes": -1, "ttl_ms": 0, "dedup": dedup})
        if partitions:
            self.partitioned[topic] = partitions
            for i in range(partitions):
                self._make_topic(f"{topic}-partition-{i}", i)
        else:
            self._make_topic(topic, -1)

    def _make_topic(self, name: str, partition: int) -> FakeTopic:
        t = FakeTopic(name, partition)
        self.topics[name] = t
        return t

    def owner_of(self, topic: str) -> str:
        return self.owner.get(topic, self.brokers[0].address)

    def published(self, topic: str) -> list[Message]:
        """Every message persisted in the topic, in log order."""
        from bksim.formats.message import decode_entry

        async def read():
            return [m for e in self.topics[topic].entries for m in decode_entry(e)[1]]
        return self.loop.run(read(), 10)

    def entries(self, topic: str) -> list[bytes]:
        return self.run(lambda: list(self.topics[topic].entries))

    def publish(self, topic: str, messages: list[Message], producer: str = "fake") -> int:
        """Append one entry directly (as if a producer had); returns its entry id."""
        def go():
            t = self.topics[topic]
            t.entries.append(encode_entry(messages, producer_name=producer, publish_time_ms=1_000 + len(t.entries),
                                          batch=len(messages) > 1))
            if t.wake is not None:
                t.wake.set()
            return len(t.entries) - 1
        return self.run(go)

    def kick(self, topic: str, status: str = "TOPIC_FENCED", owner_address: str = "") -> int:
        """End every Subscribe stream of `topic` with an in-band error; returns how many."""
        def go():
            n = 0
            for sub in self.topics[topic].subs.values():
                for c in list(sub.consumers):
                    c.out.put_nowait(topic_pb2.ConsumeResponse(error=Refusal(status, "kicked", owner_address).pb()))
                    c.out.put_nowait(None)
                    n += 1
            return n
        return self.run(go)

    def break_streams(self, topic: str, code: grpc.StatusCode = grpc.StatusCode.INTERNAL) -> int:
        """End every Subscribe stream of `topic` with a bare gRPC status (what a transport failure looks like to
        grpc.aio: no bksim-status trailer); returns how many."""
        def go():
            n = 0
            for sub in self.topics[topic].subs.values():
                for c in list(sub.consumers):
                    c.out.put_nowait(code)
                    n += 1
            return n
        return self.run(go)


@dataclass(eq=False)
class _Consumer:
    name: str
    topic: FakeTopic
    sub: FakeSub
    out: asyncio.Queue
    permits: int = 0
    pending: set = field(default_factory=set)


class FakeBroker(topic_pb2_grpc.TopicsServicer):
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server: grpc.aio.Server | None = None
        self._names = itertools.count(1)

    async def start(self) -> None:
        self.server = grpc.aio.server()
        topic_pb2_grpc.add_TopicsServicer_to_server(self, self.server)
        self.server.add_insecure_port(self.address)
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(0)

    async def _refuse(self, context, r: Refusal):
        context.set_trailing_metadata(((STATUS_KEY, r.status),))
        await context.abort(getattr(grpc.StatusCode, GRPC_CODE.get(r.status, "UNKNOWN")), r.message)

    def _topic(self, name: str) -> FakeTopic:
        t = self.cluster.topics.get(name)
        if t is None:
            raise Refusal("TOPIC_NOT_FOUND", f"topic {name} does not exist")
        return t

    # -- admin -----------------------------------------------------------------------------------------------
    async def CreateTenant(self, request, context):
        c = self.cluster
        if request.tenant in c.tenants:
            await self._refuse(context, Refusal("ALREADY_EXISTS", f"tenant {request.tenant} exists"))
        c.tenants.add(request.tenant)
        return topic_pb2.ListTenantsResponse(tenants=sorted(c.tenants))

    async def ListTenants(self, request, context):
        return topic_pb2.ListTenantsResponse(tenants=sorted(self.cluster.tenants))

    async def CreateNamespace(self, request, context):
        c = self.cluster
        tenant = request.namespace.split("/")[0]
        if tenant not in c.tenants:
            await self._refuse(context, Refusal("TENANT_NOT_FOUND", f"tenant {tenant} does not exist"))
        p = request.policies
        c.namespaces[request.namespace] = {"retention_ms": p.retention_ms, "retention_bytes": p.retention_bytes,
                                           "ttl_ms": p.ttl_ms, "dedup": p.dedup}
        return topic_pb2.NamespaceInfo(namespace=request.namespace, policies=p)

    async def GetNamespace(self, request, context):
        p = self.cluster.namespaces.get(request.namespace)
        if p is None:
            await self._refuse(context, Refusal("NAMESPACE_NOT_FOUND", f"namespace {request.namespace} does not exist"))
        return topic_pb2.NamespaceInfo(namespace=request.namespace, policies=topic_pb2.NamespacePolicies(**p))

    async def ListNamespaces(self, request, context):
        return topic_pb2.ListNamespacesResponse(
            namespaces=sorted(n for n in self.cluster.namespaces if n.startswith(request.tenant + "/")))

    async def CreateTopic(self, request, context):
        c = self.cluster
        if request.topic in c.topics or request.topic in c.partitioned:
            await self._refuse(context, Refusal("ALREADY_EXISTS", f"topic {request.topic} exists"))
        c.add_topic(request.topic, request.partitions)
        return topic_pb2.TopicMetadata(topic=request.topic, partitions=request.partitions)

    async def GetTopic(self, request, context):
        c = self.cluster
        if request.topic in c.partitioned:
            return topic_pb2.TopicMetadata(topic=request.topic, partitions=c.partitioned[request.topic])
        if request.topic in c.topics:
            return topic_pb2.TopicMetadata(topic=request.topic, partitions=0)
        await self._refuse(context, Refusal("TOPIC_NOT_FOUND", f"topic {request.topic} does not exist"))

    async def DeleteTopic(self, request, context):
        c = self.cluster
        n = c.partitioned.pop(request.topic, 0)
        names = [f"{request.topic}-partition-{i}" for i in range(n)] if n else [request.topic]
        for name in names:
            if c.topics.pop(name, None) is None:
                await self._refuse(context, Refusal("TOPIC_NOT_FOUND", f"topic {name} does not exist"))
        return topic_pb2.TopicMetadata(topic=request.topic, partitions=n)

    async def ListTopics(self, request, context):
        c = self.cluster
        bases = set(c.partitioned) | {t for t in c.topics if "-partition-" not in t}
        return topic_pb2.ListTopicsResponse(topics=sorted(t for t in bases if f"//{request.namespace}/" in t))

    async def Lookup(self, request, context):
        c = self.cluster
        c.lookups += 1
        if request.topic in c.partitioned:
            await self._refuse(context, Refusal("BAD_REQUEST", f"{request.topic} is partitioned: use its partitions"))
        if request.topic not in c.topics:
            await self._refuse(context, Refusal("TOPIC_NOT_FOUND", f"topic {request.topic} does not exist"))
        owner = c.owner_of(request.topic)
        return topic_pb2.LookupResponse(topic=request.topic, broker_id=owner, address=owner, owned=True)

    async def TopicStats(self, request, context):
        t = self.cluster.topics.get(request.topic)
        if t is None:
            await self._refuse(context, Refusal("TOPIC_NOT_FOUND", f"topic {request.topic} does not exist"))
        return topic_pb2.JsonResponse(json=json.dumps({"msgInCounter": len(t.entries),
                                                       "subscriptions": {n: {} for n in t.subs}}))

    async def TopicStatsInternal(self, request, context):
        t = self.cluster.topics.get(request.topic)
        if t is None:
            await self._refuse(context, Refusal("TOPIC_NOT_FOUND", f"topic {request.topic} does not exist"))
        return topic_pb2.JsonResponse(json=json.dumps({"ledgers": [{"ledgerId": LEDGER, "entries": len(t.entries)}]}))

    # -- produce ---------------------------------------------------------------------------------------------
    async def Produce(self, request_iterator, context):
        c = self.cluster
        first = await request_iterator.__anext__()
        try:
            if c.fail_produce_opens:
                raise Refusal(c.fail_produce_opens.pop(0), "injected refusal")
            t = self._topic(first.open.topic)
            if c.owner_of(t.name) != self.address:
                raise Refusal("NOT_OWNER", f"{t.name} is served elsewhere", c.owner_of(t.name))
        except Refusal as r:
            yield topic_pb2.ProduceResponse(error=r.pb())
            return
        name = first.open.producer_name or f"fake-{self.port}-{next(self._names)}"
        dedup = c.namespaces[t.name.removeprefix("persistent://").rsplit("/", 1)[0]]["dedup"]
        yield topic_pb2.ProduceResponse(ready=topic_pb2.ProducerReady(
            producer_name=name, last_sequence_id=c.dedup.get((t.name, name), -1) if dedup else -1,
            partition=t.partition, broker_id=self.address))
        async for request in request_iterator:
            send = request.send
            seqs = [m.sequence_id for m in send.messages]
            c.sends.append((self.address, t.name, seqs))
            if c.fail_sends:
                status, owner = c.fail_sends.pop(0)
                yield topic_pb2.ProduceResponse(error=Refusal(status, f"injected {status}", owner).pb())
                return
            if dedup and max(seqs) <= c.dedup.get((t.name, name), -1):
                yield topic_pb2.ProduceResponse(receipt=topic_pb2.SendReceipt(
                    request_id=send.request_id, ledger_id=-1, entry_id=-1, partition=t.partition,
                    batch_size=len(seqs), duplicate=True))
                continue
            messages = [Message(m.payload, m.key if m.has_key else None, dict(m.properties), m.event_time_ms,
                                m.sequence_id, m.deliver_at_ms) for m in send.messages]
            t.entries.append(encode_entry(messages, producer_name=name, publish_time_ms=1_000 + len(t.entries),
                                          batch=len(messages) > 1))
            c.dedup[(t.name, name)] = max(seqs)
            if t.wake is not None:
                t.wake.set()
            if c.hold_receipts:
                continue
            yield topic_pb2.ProduceResponse(receipt=topic_pb2.SendReceipt(
                request_id=send.request_id, ledger_id=LEDGER, entry_id=len(t.entries) - 1, partition=t.partition,
                batch_size=len(messages)))

    # -- subscribe -------------------------------------------------------------------------------------------
    async def Subscribe(self, request_iterator, context):
        c = self.cluster
        first = await request_iterator.__anext__()
        o = first.open
        try:
            if c.fail_subscribe:
                raise Refusal(c.fail_subscribe.pop(0), "injected refusal")
            t = self._topic(o.topic)
            if c.owner_of(t.name) != self.address:
                raise Refusal("NOT_OWNER", f"{t.name} is served elsewhere", c.owner_of(t.name))
            sub = t.subs.get(o.subscription)
            if sub is None:
                sub = t.subs[o.subscription] = FakeSub(o.subscription, o.type)
                if o.initial_position == topic_pb2.LATEST:
                    sub.next_entry = len(t.entries)
            if sub.type == topic_pb2.EXCLUSIVE and sub.consumers:
                raise Refusal("CONSUMER_BUSY", f"exclusive subscription {sub.name} has a consumer")
        except Refusal as r:
            yield topic_pb2.ConsumeResponse(error=r.pb())
            return
        consumer = _Consumer(o.consumer_name or f"c-{next(self._names)}", t, sub, asyncio.Queue())
        sub.consumers.append(consumer)
        if t.wake is None:
            t.wake = asyncio.Event()
        yield topic_pb2.ConsumeResponse(subscribed=topic_pb2.Subscribed(consumer_name=consumer.name,
                                                                        broker_id=self.address,
                                                                        partition=t.partition))
        reader = asyncio.get_running_loop().create_task(self._consume_requests(request_iterator, consumer))
        dispatcher = asyncio.get_running_loop().create_task(self._dispatch(consumer))
        try:
            while True:
                item = await consumer.out.get()
                if item is None:
                    return
                if isinstance(item, grpc.StatusCode):  # the transport fails: a gRPC status, no bksim-status trailer
                    await context.abort(item, "Internal error from Core")
                yield item
        finally:
            reader.cancel()
            dispatcher.cancel()
            if consumer in sub.consumers:
                sub.consumers.remove(consumer)
            sub.replay = sorted(set(sub.replay) | {e for e in consumer.pending if e not in sub.acked})

    async def _consume_requests(self, request_iterator, consumer: _Consumer) -> None:
        c = self.cluster
        t, sub = consumer.topic, consumer.sub
        try:
            async for r in request_iterator:
                kind = r.WhichOneof("kind")
                if kind == "flow":
                    c.flows.append(r.flow.permits)
                    consumer.permits += r.flow.permits
                elif kind == "ack":
                    ids = [(i.entry_id, (i.batch_index, *i.more_batch_indexes) if i.more_batch_indexes
                            else i.batch_index, i.batch_size) for i in r.ack.ids]
                    c.acks.append((t.name, ids, r.ack.cumulative))
                    error = self._ack(consumer, r.ack)
                    if r.ack.request_id:
                        consumer.out.put_nowait(topic_pb2.ConsumeResponse(ack_result=topic_pb2.AckResult(
                            request_id=r.ack.request_id, error=error.pb() if error else None)))
                elif kind == "redeliver":
                    ids = [i.entry_id for i in r.redeliver.ids] or sorted(consumer.pending)
                    c.redelivers.append(ids)
                    for e in ids:
                        if e in consumer.pending and e not in sub.acked:
                            consumer.pending.discard(e)
                            sub.redelivery[e] = sub.redelivery.get(e, 0) + 1
                            sub.replay = sorted(set(sub.replay) | {e})
                elif kind == "seek":
                    c.seeks.append(r.seek)
                    if r.seek.WhichOneof("target") == "position":
                        sub.next_entry = r.seek.position.entry_id
                    else:
                        sub.next_entry = next((i for i, e in enumerate(t.entries)
                                               if read_header(e).publish_time_ms >= r.seek.publish_time_ms),
                                              len(t.entries))
                    sub.replay.clear()
                    consumer.pending.clear()
                    consumer.out.put_nowait(topic_pb2.ConsumeResponse(
                        seek_result=topic_pb2.SeekResult(request_id=r.seek.request_id)))
                t.wake.set()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the stream broke: the RPC ends
            pass
        consumer.out.put_nowait(None)

    def _ack(self, consumer: _Consumer, ack) -> Refusal | None:
        t, sub = consumer.topic, consumer.sub
        for i in ack.ids:
            if not 0 <= i.entry_id < len(t.entries) or i.ledger_id != LEDGER:
                return Refusal("INVALID_ACK", f"message {i.ledger_id}:{i.entry_id} does not exist in {t.name}")
        if ack.cumulative:
            if sub.type in (topic_pb2.SHARED, topic_pb2.KEY_SHARED):
                return Refusal("NOT_ALLOWED", f"cumulative ack is not allowed on subscription {sub.name}")
            upto = ack.ids[0].entry_id
            sub.acked |= set(range(upto + 1))
            consumer.pending -= set(range(upto + 1))
            return None
        for i in ack.ids:
            if i.batch_index >= 0:
                done = sub.acked_indexes.setdefault(i.entry_id, set())
                done.add(i.batch_index)
                done.update(i.more_batch_indexes)
                if len(done) < i.batch_size:
                    continue
            sub.acked.add(i.entry_id)
            consumer.pending.discard(i.entry_id)
        return None

    async def _dispatch(self, consumer: _Consumer) -> None:
        t, sub = consumer.topic, consumer.sub
        while True:
            t.wake.clear()
            sent = False
            while consumer.permits > 0:
                if sub.replay:
                    e = sub.replay.pop(0)
                    if e in sub.acked:
                        continue
                elif sub.next_entry < len(t.entries):
                    e = sub.next_entry
                    sub.next_entry += 1
                    if e in sub.acked:
                        continue
                else:
                    break
                count = read_header(t.entries[e]).num_messages
                consumer.permits -= count
                consumer.pending.add(e)
                consumer.out.put_nowait(topic_pb2.ConsumeResponse(deliveries=topic_pb2.Deliveries(deliveries=[
                    topic_pb2.Delivery(ledger_id=LEDGER, entry_id=e, partition=t.partition,
                                       redelivery_count=sub.redelivery.get(e, 0), entry=t.entries[e],
                                       acked_batch_indexes=sorted(sub.acked_indexes.get(e, ())))])))
                sent = True
            if not sent or consumer.permits <= 0:
                await t.wake.wait()
