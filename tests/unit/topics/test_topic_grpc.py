"""The Topics gRPC service (adapters/topic_server.py) on a real loopback gRPC server, over the topic layer on
the in-memory metadata store, FakeBookies (in-memory bookie fake) and MemoryCursor (non-durable test cursor).
Checks the wire contract: admin calls, Produce receipts in order, Subscribe with permits and acks, in-band
errors with the bksim-status trailer. The same flows on the real cluster are in tests/integration."""
from __future__ import annotations

import asyncio
import json
import random

import grpc
import pytest

from bksim.adapters.broker_server import BrokerServer
from bksim.adapters.clock import SystemClock
from bksim.broker.ledgers import LedgerService
from bksim.topics.service import TopicService
from bksim.formats.message import decode_entry
from bksim.gen import topic_pb2 as pb
from bksim.gen import topic_pb2_grpc
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig
from fakes.bookies import FakeBookies
from fakes.cursor import MemoryCursor

TOPIC = "persistent://t/ns/a"


async def start():
    store = InMemoryMetadataStore()
    reg = store.session("bookies")
    for b in ("b0", "b1", "b2"):
        await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
    session = store.session("broker")
    clock = SystemClock()
    ledgers = LedgerService(store=session, transport=FakeBookies(["b0", "b1", "b2"]), rng=random.Random(1),
                            clock=clock, config=BrokerConfig())

    async def open_cursor(ml, name, sub, initial, on_fenced):
        return MemoryCursor(ml, sub, initial)

    topics = TopicService(store=session, ledgers=ledgers, clock=clock, broker_id="br1", address="127.0.0.1:1",
                          open_cursor_factory=open_cursor)
    server = BrokerServer(ledgers, BrokerConfig(port=0), lambda line: None, topics=topics)
    port = await server.start()
    topics.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return topics, server, channel, topic_pb2_grpc.TopicsStub(channel)


async def stop(topics, server, channel):
    await channel.close()
    await topics.close()
    await server.stop(1000)


def test_produce_then_consume_over_grpc_with_acks_and_clear_errors():
    async def main():
        topics, server, channel, stub = await start()
        try:
            await stub.CreateTenant(pb.CreateTenantRequest(tenant="t"))
            await stub.CreateNamespace(pb.CreateNamespaceRequest(namespace="t/ns"))
            await stub.CreateTopic(pb.CreateTopicRequest(topic=TOPIC))
            look = await stub.Lookup(pb.LookupRequest(topic=TOPIC))
            assert look.broker_id == "br1" and not look.owned

            async def sends():
                yield pb.ProduceRequest(open=pb.ProducerOpen(topic=TOPIC, producer_name="p1"))
                for i in range(10):
                    yield pb.ProduceRequest(send=pb.Send(request_id=i, messages=[
                        pb.Message(payload=b"m%d-%d" % (i, j), sequence_id=i * 3 + j) for j in range(3)]))
            responses = [r async for r in stub.Produce(sends())]
            assert responses[0].ready.producer_name == "p1"
            receipts = [r.receipt for r in responses[1:]]
            assert [r.request_id for r in receipts] == list(range(10))
            assert [r.entry_id for r in receipts] == list(range(10)) and all(r.batch_size == 3 for r in receipts)

            requests: asyncio.Queue = asyncio.Queue()

            async def consume_requests():
                yield pb.ConsumeRequest(open=pb.SubscribeOpen(topic=TOPIC, subscription="s1", type=pb.SHARED,
                                                              initial_position=pb.EARLIEST))
                yield pb.ConsumeRequest(flow=pb.Flow(permits=12))  # 4 batches of 3
                while (item := await requests.get()) is not None:
                    yield item

            got, results = [], []
            async for r in stub.Subscribe(consume_requests()):
                kind = r.WhichOneof("kind")
                if kind == "deliveries":
                    for d in r.deliveries.deliveries:
                        got += [m.payload for m in decode_entry(d.entry)[1]]
                        await requests.put(pb.ConsumeRequest(ack=pb.Ack(request_id=d.entry_id + 1, ids=[
                            pb.AckId(ledger_id=d.ledger_id, entry_id=d.entry_id, batch_index=-1)])))
                    if len(got) == 12:
                        await requests.put(pb.ConsumeRequest(ack=pb.Ack(request_id=99, cumulative=True, ids=[
                            pb.AckId(ledger_id=d.ledger_id, entry_id=d.entry_id, batch_index=-1)])))
                elif kind == "ack_result":
                    results.append(r.ack_result)
                    if r.ack_result.request_id == 99:
                        await requests.put(None)
            assert got == [b"m%d-%d" % (i, j) for i in range(4) for j in range(3)]  # exactly the permits
            assert [r.request_id for r in results] == [1, 2, 3, 4, 99]
            assert results[-1].error.status == pb.NOT_ALLOWED  # cumulative ack on Shared
            stats = json.loads((await stub.TopicStats(pb.TopicRequest(topic=TOPIC))).json)
            assert stats["msgInCounter"] == 30 and stats["subscriptions"]["s1"]["msgBacklog"] == 6
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.TopicStats(pb.TopicRequest(topic="persistent://t/ns/nope"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            assert ("bksim-status", "TOPIC_NOT_FOUND") in tuple(info.value.trailing_metadata())
        finally:
            await stop(topics, server, channel)
    asyncio.run(main())
