"""Partitioned topics: the stats sums (topics/partitioned_stats.py) and the deletion state machine
(topics/partitioned_delete.py) over two brokers' TopicServices on the in-memory store: a refusal changes
nothing, the mark comes first and admits nobody on any broker, an interrupted deletion (a partition still served
elsewhere, or a crash between partitions) leaves the topic marked and a retry on any broker finishes it."""
from __future__ import annotations

import asyncio
import json

import pytest

from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError
from bksim.topics.names import TopicName
from bksim.topics.partitioned_delete import TRANSITIONS, _move, release_deleting
from bksim.topics.partitioned_stats import aggregate
from bksim.topics.topic import Policies
from unit.topics.test_backlog_quota import Sink
from unit.topics.test_topic_service import cluster, msgs

T = "persistent://acme/orders/p"
NAME = TopicName.parse(T)


def test_aggregate_sums_partitions_and_keeps_each():
    def part(n_in, backlog, consumers, expired=0, expired_at=0):
        return {"msgInCounter": n_in, "bytesInCounter": 10 * n_in, "msgRateIn": 1.5, "storageSize": 100 * n_in,
                "backlogSize": backlog, "publishers": [{"producerName": "p"}], "deduplicationStatus": "Disabled",
                "subscriptions": {"s": {"type": "Shared", "msgBacklog": backlog, "unackedMessages": 1,
                                        "totalMsgExpired": expired, "lastExpireTimestamp": expired_at,
                                        "consumers": [{"consumerName": c} for c in consumers]}}}
    parts = {f"{T}-partition-0": part(3, 2, ["c1"], 6, 1_000), f"{T}-partition-1": part(4, 5, ["c1", "c2"])}
    out = aggregate(T, parts)
    assert out["metadata"] == {"partitions": 2} and out["partitions"] == parts
    assert out["msgInCounter"] == 7 and out["bytesInCounter"] == 70 and out["storageSize"] == 700
    assert out["msgRateIn"] == 3.0 and out["backlogSize"] == 5
    assert out["subscriptions"]["s"]["msgBacklog"] == 7 and out["subscriptions"]["s"]["unackedMessages"] == 2
    assert (out["subscriptions"]["s"]["totalMsgExpired"], out["subscriptions"]["s"]["lastExpireTimestamp"]) == (6, 1_000)
    assert [c["consumerName"] for c in out["subscriptions"]["s"]["consumers"]] == ["c1", "c1", "c2"]
    assert len(out["publishers"]) == 2 and out["deduplicationStatus"] == "Disabled"


def test_the_transition_table_refuses_what_it_does_not_list():
    assert _move("ACTIVE", "mark") == "DELETING" and _move("DELETING", "finish") == "GONE"
    with pytest.raises(AssertionError, match="finish.*ACTIVE"):
        _move("ACTIVE", "finish")
    assert ("GONE", "mark") not in TRANSITIONS


async def _setup():
    store, [a, b] = await cluster()
    await a.create_tenant("acme")
    await a.create_namespace("acme/orders", Policies())
    await a.create_topic(T, 3)
    return store, a, b


async def _marked(store) -> bool:
    data, _ = await store.get(NAME.partitioned_path)
    return bool(json.loads(data).get("deleting"))


def test_a_refusal_changes_nothing():
    async def main():
        store, a, _ = await _setup()
        t = await a.acquire(f"{T}-partition-2")
        await t.subscribe("s", "Shared", "earliest", "c", 0, Sink())
        with pytest.raises(TopicError) as e:
            await a.delete_topic(T, force=True)
        assert e.value.status is TopicStatus.NOT_ALLOWED and "connected" in e.value.message
        assert not await _marked(store)
        await a.acquire(f"{T}-partition-0")  # still admitted
    asyncio.run(main())


def test_partition_served_elsewhere_blocks_until_released_and_a_retry_finishes():
    async def main():
        store, a, b = await _setup()
        tb = await b.acquire(f"{T}-partition-1")
        sink = Sink()
        sink.dropped = []
        sink.drop = sink.dropped.append
        await tb.subscribe("s", "Shared", "earliest", "c", 0, sink)
        name, _ = tb.add_producer("p", "br1")
        await tb.publish(name, msgs(0))
        with pytest.raises(TopicError) as e:  # b's watchdog is not running: partition 1 is never released
            await a.delete_topic(T, force=True)
        assert e.value.status is TopicStatus.SERVICE_UNAVAILABLE and "retry" in e.value.message
        assert await _marked(store)
        assert await store.exists(NAME.partition(0).managed_ledger_path) is None  # deleted before the wait
        for svc in (a, b):  # admits nobody, on any broker
            with pytest.raises(TopicError) as e:
                await svc.acquire(f"{T}-partition-2")
            assert e.value.status is TopicStatus.NOT_ALLOWED and "being deleted" in e.value.message
        await release_deleting(b)  # b's ownership watchdog round
        assert f"{T}-partition-1" not in b.topics and sink.dropped
        with pytest.raises(TopicError):
            await b.acquire(f"{T}-partition-1")
        assert await a.delete_topic(T, force=False) == 3  # resumed: the refusals are behind it
        assert await store.exists(NAME.partitioned_path) is None
        assert all([await store.exists(NAME.partition(i).managed_ledger_path) is None for i in range(3)])
        with pytest.raises(TopicError) as e:
            await a.get_topic(T)
        assert e.value.status is TopicStatus.TOPIC_NOT_FOUND
    asyncio.run(main())


def test_a_crash_between_partitions_leaves_it_marked_and_another_broker_finishes_it():
    async def main():
        store, a, b = await _setup()
        for i in range(3):
            await (await a.acquire(f"{T}-partition-{i}")).subscribe("s", "Shared", "earliest", "c", 0, Sink())
        for i in range(3):
            t = a.topics[f"{T}-partition-{i}"]
            await t.remove_consumer(t.subscriptions["s"], t.subscriptions["s"].consumers[0])
        real = a._delete_one

        async def crash_at_partition_1(part):
            if part.partition_index == 1:
                raise KeyboardInterrupt("kill -9")  # nothing after this point runs on broker a
            await real(part)
        a._delete_one = crash_at_partition_1
        with pytest.raises(KeyboardInterrupt):
            await a.delete_topic(T, force=True)
        assert await _marked(store)
        assert [await store.exists(NAME.partition(i).managed_ledger_path) is None for i in range(3)] == \
            [True, False, False]
        assert await b.get_topic(T) == 3  # still there, marked
        store.expire(a.store)  # broker a's session ends with the process: its ownership znodes go
        assert await b.delete_topic(T, force=False) == 3
        assert await store.exists(NAME.partitioned_path) is None
        assert T not in await b.list_topics("acme/orders")
    asyncio.run(main())
