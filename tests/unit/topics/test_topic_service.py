"""Two brokers' TopicServices over one in-memory metadata store (ZooKeeper semantics: versions, ephemeral
nodes bound to sessions) and FakeBookies, with MemoryCursor: admin errors, ownership, NOT_OWNER with the
owner's address, takeover after the owner's session expires (the old owner is fenced and writes nothing
more), dedup across the takeover, retention trimming."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.topics.errors import TopicError
from bksim.topics.service import TopicService
from bksim.topics.topic import Policies
from bksim.formats.message import Message, decode_entry
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig, TopicConfig
from bksim.model.status import TopicStatus
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock
from fakes.cursor import MemoryCursor

TOPIC = "persistent://acme/orders/o1"


async def cluster(brokers=2, config=TopicConfig()):
    store = InMemoryMetadataStore()
    reg = store.session("bookies")
    for b in ("b0", "b1", "b2"):
        await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
    fake = FakeBookies(["b0", "b1", "b2"])
    services = []
    for i in range(brokers):
        session = store.session(f"broker-{i}")
        await session.create(f"/brokers/available/br{i}", b'{"host": "127.0.0.1", "port": %d}' % (7000 + i),
                             ephemeral=True, make_parents=True)
        ledgers = LedgerService(store=session, transport=fake, rng=random.Random(i), clock=ManualClock(sleeps_advance=True),
                                config=BrokerConfig(speculative_read_ms=50))

        async def open_cursor(ml, name, sub, initial, on_fenced):
            return MemoryCursor(ml, sub, initial)

        services.append(TopicService(store=session, ledgers=ledgers, clock=ManualClock(sleeps_advance=True), broker_id=f"br{i}",
                                     address=f"127.0.0.1:{7000 + i}", open_cursor_factory=open_cursor,
                                     config=config))
    return store, services


def run(coro):
    return asyncio.run(coro)


def msgs(producer_seq, n=1):
    return [Message(b"v%d" % (producer_seq + j), sequence_id=producer_seq + j) for j in range(n)]


def test_admin_errors_are_precise_and_leave_nothing_behind():
    async def main():
        store, [a, _] = await cluster()
        with pytest.raises(TopicError) as e:
            await a.create_namespace("acme/orders", Policies())
        assert e.value.status is TopicStatus.TENANT_NOT_FOUND
        await a.create_tenant("acme")
        with pytest.raises(TopicError) as e:
            await a.create_tenant("acme")
        assert e.value.status is TopicStatus.ALREADY_EXISTS
        with pytest.raises(TopicError) as e:
            await a.create_topic(TOPIC, 0)
        assert e.value.status is TopicStatus.NAMESPACE_NOT_FOUND
        await a.create_namespace("acme/orders", Policies(dedup=True))
        for bad in ("orders", "persistent://acme/orders", "persistent://acme/ord ers/x", "persistent://a/b/c/d"):
            with pytest.raises(TopicError) as e:
                await a.create_topic(bad, 0)
            assert e.value.status is TopicStatus.BAD_REQUEST, bad
        await a.create_topic(TOPIC, 0)
        await a.create_topic("persistent://acme/orders/p", 3)
        assert await a.list_topics("acme/orders") == ["persistent://acme/orders/o1", "persistent://acme/orders/p"]
        assert await a.get_topic("persistent://acme/orders/p") == 3
        with pytest.raises(TopicError) as e:
            await a.acquire("persistent://acme/orders/nope")
        assert e.value.status is TopicStatus.TOPIC_NOT_FOUND
        with pytest.raises(TopicError) as e:
            await a.acquire("persistent://acme/orders/p")  # a partitioned topic is served per partition
        assert e.value.status is TopicStatus.BAD_REQUEST
        await a.acquire("persistent://acme/orders/p-partition-2")
    run(main())


def test_one_owner_redirects_and_a_takeover_fences_the_old_owner():
    async def main():
        store, [a, b] = await cluster()
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies(dedup=True))
        await a.create_topic(TOPIC, 0)
        ta = await a.acquire(TOPIC)
        a_name, _ = ta.add_producer("p1", "br0")
        first = [await ta.publish(a_name, msgs(i)) for i in range(10)]
        assert all(p is not None for p in first)
        assert await ta.publish(a_name, msgs(5)) is None  # dedup: already persisted
        with pytest.raises(TopicError) as e:
            await b.acquire(TOPIC)
        assert e.value.status is TopicStatus.NOT_OWNER and e.value.owner_address == "127.0.0.1:7000"
        assert (await b.lookup(TOPIC))[:2] == ("br0", "127.0.0.1:7000")
        # a's ownership node vanishes while a still believes it owns the topic; b takes over
        await store.session("admin").delete(ta.name.ownership_path)
        tb = await b.acquire(TOPIC)
        a.start()  # a's ownership watchdog notices the znode now names b, and fences the topic here
        await wait_until_async(lambda: TOPIC not in a.topics and ta.fenced is not None, 5,
                               message="the watchdog fencing the topic on the old owner")
        # the old owner's next write is fenced (its ledger was fenced by b's recovery; its CAS then fails)
        with pytest.raises(TopicError) as e:
            await ta.publish(a_name, msgs(10))
        assert e.value.status is TopicStatus.TOPIC_FENCED
        # dedup state came across from the log: a resend of sequence ids 0..9 is dropped at b
        b_name, last = tb.add_producer("p1", "br1")
        assert last == 9
        assert await tb.publish(b_name, msgs(9)) is None
        pos = await tb.publish(b_name, msgs(10))
        assert pos is not None and pos > first[-1]
        got = await tb.ml.read(tb.ml.first_position(), 100)
        assert [decode_entry(e)[1][0].payload for _, e in got] == [b"v%d" % i for i in range(10)]
    run(main())


def test_retention_trims_only_what_every_cursor_consumed():
    async def main():
        _, [a, _] = await cluster(config=TopicConfig(ledger_entries_max=5))
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies(retention_ms=0, retention_bytes=-1))
        await a.create_topic(TOPIC, 0)
        t = await a.acquire(TOPIC)

        class Sink:
            def deliver(self, d): pass
            def active_changed(self, active): pass
            def drop(self, e): pass
        sub, consumer = await t.subscribe("s", "Exclusive", "earliest", "c", 0, Sink())
        name, _ = t.add_producer("", "br0")
        positions = [await t.publish(name, msgs(i)) for i in range(22)]
        ledgers = t.ml.ledger_ids()
        assert len(ledgers) >= 5
        assert await t.run_trim() == []  # nothing consumed yet
        sub.ack(consumer, [(positions[11], -1, 0)], cumulative=True)  # two full ledgers consumed
        assert await t.run_trim() == []  # ... in memory only: a crash now would bring the cursor back before them
        await sub.cursor.persist()
        deleted = await t.run_trim()
        assert deleted == ledgers[:2]
        assert t.ml.ledger_ids() == ledgers[2:]
    run(main())


def test_session_expiry_fences_every_topic_of_the_broker():
    async def main():
        store, [a, b] = await cluster()
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies())
        await a.create_topic(TOPIC, 0)
        ta = await a.acquire(TOPIC)
        name, _ = ta.add_producer("p", "br0")
        await ta.publish(name, msgs(0))
        store.expire(a.store)  # ZooKeeper expired a's session: its ownership znode is gone
        assert (await b.lookup(TOPIC))[2] is False
        tb = await b.acquire(TOPIC)
        await a.session_lost()  # the broker learns it on reconnecting (RenewingZkMetadataStore)
        assert TOPIC not in a.topics
        with pytest.raises(TopicError) as e:
            await ta.publish(name, msgs(1))
        assert e.value.status is TopicStatus.TOPIC_FENCED
        assert tb.ml.last_confirmed.entry == 0 and len(await tb.ml.read(tb.ml.first_position(), 10)) == 1
    run(main())


def test_stats_report_rates_over_the_last_interval():
    async def main():
        _, [a, _] = await cluster()
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies())
        await a.create_topic(TOPIC, 0)
        t = await a.acquire(TOPIC)
        name, _ = t.add_producer("p", "br0")
        t._maintenance.cancel()  # sample by hand, on the test's own clock steps
        t._sample_rates()
        for i in range(10):
            await t.publish(name, msgs(i, 3))
        t._clock.advance(2_000)  # two seconds of (virtual) time
        t._sample_rates()
        stats = t.stats()
        assert stats["msgRateIn"] == 15.0 and stats["msgInCounter"] == 30
        assert stats["msgThroughputIn"] > 0
    run(main())


def test_a_damaged_znode_is_a_metadata_error_naming_its_path_not_a_crash():
    from bksim.topics.names import TopicName, policies_path

    async def scenario():
        store, (svc, _other) = await cluster(brokers=2)
        await svc.create_tenant("acme")
        await svc.create_namespace("acme/orders", Policies())
        await svc.create_topic("persistent://acme/orders/p", 2)
        damaged = [b"{not json", b"[1, 2]", b"[" * 100_000 + b"]" * 100_000, b'{"retention_ms": ' + b"9" * 5000 + b"}",
                   b'{"retention_ms": 1e999}', b'{"retention_ms": [1]}']
        for data in damaged:
            await store.set(policies_path("acme", "orders"), data, -1)
            with pytest.raises(TopicError) as e:
                await svc.get_namespace("acme/orders")
            assert e.value.status is TopicStatus.METADATA_ERROR and policies_path("acme", "orders") in str(e.value)
        await store.set(policies_path("acme", "orders"), b"{}", -1)
        path = TopicName.parse("persistent://acme/orders/p").partitioned_path
        for data in (b'{"partitions": "many"}', b"{}", b"\xff\xfe"):
            await store.set(path, data, -1)
            with pytest.raises(TopicError) as e:
                await svc.get_topic("persistent://acme/orders/p")
            assert e.value.status is TopicStatus.METADATA_ERROR and path in str(e.value), data
        # a broker registration that is not a JSON object is no broker: the others are still named
        await store.session("junk").create("/brokers/available/junk", b"\x00\x01", ephemeral=True)
        await svc.create_topic("persistent://acme/orders/q", 0)
        owner, address, _owned = await svc.lookup("persistent://acme/orders/q")
        assert owner in ("br0", "br1") and address.startswith("127.0.0.1:")

    run(scenario())


def test_a_lost_session_stops_every_topic_before_the_broker_waits_on_any():
    """With a new session bound, the broker must not serve, even for a moment, a topic its expired session owned:
    another broker may have taken it. session_lost marks every topic fenced before dropping any one's clients
    (that waits). Observed from the first consumer dropped: by then no topic is served here any more."""
    async def main():
        store, [a, _] = await cluster()
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies())
        names = [TOPIC, "persistent://acme/orders/o2"]
        topics = []
        for name in names:
            await a.create_topic(name, 0)
            topics.append(await a.acquire(name))
        served_when_dropped = []

        class Sink:
            def deliver(self, d): pass
            def active_changed(self, active): pass
            def drop(self, e):
                served_when_dropped.append(sorted(n for n, t in a.topics.items() if t.fenced is None))
        for t in topics:
            await t.subscribe("s", "Exclusive", "earliest", "c", 0, Sink())
        store.expire(a.store)
        await a.session_lost()
        assert served_when_dropped == [[], []]
        assert a.topics == {} and all(t.fenced is not None for t in topics)
        assert a.stats["topics_lost"] == 2
    run(main())


def test_a_close_releases_only_its_own_ownership_znode():
    """A clean close that ends after the topic went to another broker (the old owner's znode vanished meanwhile: in
    the product, its session expired and was renewed while the close waited) leaves the new owner's znode alone;
    the close of a topic still owned here releases it."""
    async def main():
        store, [a, b] = await cluster()
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies())
        await a.create_topic(TOPIC, 0)
        await a.create_topic("persistent://acme/orders/o2", 0)
        ta = await a.acquire(TOPIC)
        await a.acquire("persistent://acme/orders/o2")
        await store.session("admin").delete(ta.name.ownership_path)
        await b.acquire(TOPIC)
        await a.close()
        assert await b.lookup(TOPIC) == ("br1", "127.0.0.1:7001", True)
        assert (await b.lookup("persistent://acme/orders/o2"))[2] is False
    run(main())


def test_ttl_expiry_counts_and_logs_what_each_subscription_skipped():
    async def main():
        _, [a, _] = await cluster(config=TopicConfig(ledger_entries_max=5))
        lines = []
        a._log = lines.append
        await a.create_tenant("acme")
        await a.create_namespace("acme/orders", Policies(retention_ms=-1, retention_bytes=-1, ttl_ms=60_000))
        await a.create_topic(TOPIC, 0)
        t = await a.acquire(TOPIC)
        t._log = lines.append  # (the fake clock moves on by every sleep: publishing takes some seconds of it)

        class Sink:
            def deliver(self, d): pass
            def active_changed(self, active): pass
            def drop(self, e): pass
        shared, _ = await t.subscribe("s", "Shared", "earliest", "c1", 0, Sink())
        excl, c2 = await t.subscribe("x", "Exclusive", "earliest", "c2", 0, Sink())
        name, _ = t.add_producer("", "br0")
        old = [await t.publish(name, msgs(i)) for i in range(4)]
        excl.ack(c2, [(old[1], -1, 0)], cumulative=True)  # x consumed two of the four old ones itself
        t._clock.advance(100_000)
        expirable_from = t._clock.wall_ms()
        young = [await t.publish(name, msgs(i)) for i in range(4, 6)]
        await t.run_trim()  # (the topic's own trims may have expired them already, as its clock moved on)
        stats = t.stats()["subscriptions"]
        assert (stats["s"]["totalMsgExpired"], stats["x"]["totalMsgExpired"]) == (4, 2)
        assert expirable_from <= stats["s"]["lastExpireTimestamp"] == stats["x"]["lastExpireTimestamp"] <= \
            t._clock.wall_ms()
        assert stats["s"]["msgBacklog"] == stats["x"]["msgBacklog"] == len(young)
        expiries = [line for line in lines if "TTL" in line]
        assert len(expiries) == 2 and any("subscription s skips 4 entries (mark-delete" in line and
                                          f"-> {old[-1]})" in line for line in expiries), expiries
        await t.run_trim()  # nothing more is old enough
        assert t.stats()["subscriptions"]["s"]["totalMsgExpired"] == 4
        assert [line for line in lines if "TTL" in line] == expiries
    run(main())
