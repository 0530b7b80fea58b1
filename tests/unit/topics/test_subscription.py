"""Subscriptions and dispatchers (topics/subscription.py) over a real ManagedLedger on the in-memory
metadata store and FakeBookies, with MemoryCursor (non-durable test cursor). Permits, each subscription type's
rules, acks and redelivery, and read-position resets (seek, rewind) while a dispatch read is in flight."""
from __future__ import annotations

import asyncio

import pytest

from bksim.topics.errors import TopicError
from bksim.topics.positions import Position
from bksim.topics.subscription import Subscription
from bksim.formats.message import Message, encode_entry, read_header
from bksim.model.config import TopicConfig
from bksim.model.status import TopicStatus
from helpers import wait_until_async
from fakes.clock import ManualClock
from fakes.cursor import MemoryCursor
from tests.unit.topics.test_managed_ledger import world

CONFIG = TopicConfig(failover_switch_delay_ms=1)


class Sink:
    def __init__(self):
        self.got = []
        self.active = []
        self.dropped = None

    def deliver(self, deliveries):
        self.got += deliveries

    def active_changed(self, active):
        self.active.append(active)

    def drop(self, error):
        self.dropped = error


def run(coro):
    return asyncio.run(coro)


async def setup(sub_type, n=0, keys=None):
    _, _, [ml] = await world()
    await ml.open()
    for i in range(n):
        key = keys[i] if keys else None
        await ml.append(encode_entry([Message(b"m%d" % i, key=key, sequence_id=i)], producer_name="p",
                                     publish_time_ms=i, batch=False))
    cursor = MemoryCursor(ml, "sub")
    sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type=sub_type, cursor=cursor, ml=ml,
                       clock=ManualClock(sleeps_advance=True), config=CONFIG)
    return ml, sub


def payloads(sink):
    return [d.entry.split(b"m")[-1] for d in sink.got]


def test_exclusive_rejects_a_second_consumer_and_never_exceeds_permits():
    async def main():
        ml, sub = await setup("Exclusive", 10)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Exclusive")
        with pytest.raises(TopicError) as info:
            sub.add_consumer("b", 0, Sink(), "Exclusive")
        assert info.value.status is TopicStatus.CONSUMER_BUSY
        sub.flow(ca, 4)
        await wait_until_async(lambda: len(a.got) == 4, 5)
        await wait_until_async(lambda: sub.idle, 5)  # the dispatcher went idle: it must not have sent a 5th
        assert len(a.got) == 4 and ca.permits == 0
        sub.flow(ca, 100)
        await wait_until_async(lambda: len(a.got) == 10, 5)
        assert [d.position for d in a.got] == sorted(d.position for d in a.got)
        await sub.close()
    run(main())


def test_shared_round_robin_and_a_departed_consumers_messages_go_to_the_others():
    async def main():
        ml, sub = await setup("Shared", 10)
        a, b = Sink(), Sink()
        ca = sub.add_consumer("a", 0, a, "Shared")
        cb = sub.add_consumer("b", 0, b, "Shared")
        sub.flow(ca, 100)
        sub.flow(cb, 100)
        await wait_until_async(lambda: len(a.got) + len(b.got) == 10, 5)
        assert abs(len(a.got) - len(b.got)) <= 1
        with pytest.raises(TopicError) as info:
            sub.ack(ca, [(a.got[0].position, -1, 0)], cumulative=True)
        assert info.value.status is TopicStatus.NOT_ALLOWED
        sub.ack(ca, [(d.position, -1, 0) for d in a.got[:2]], cumulative=False)
        unacked = {d.position for d in a.got[2:]}
        before = len(b.got)
        sub.remove_consumer(ca)
        await wait_until_async(lambda: len(b.got) == before + len(unacked), 5)
        again = b.got[before:]
        assert {d.position for d in again} == unacked
        assert all(d.redelivery_count == 1 for d in again)
        await sub.close()
    run(main())


def test_failover_active_by_priority_then_name_and_switch_redelivers_unacked():
    async def main():
        ml, sub = await setup("Failover", 6)
        x, y = Sink(), Sink()
        cy = sub.add_consumer("y", 0, y, "Failover")
        cx = sub.add_consumer("x", 0, x, "Failover")  # same priority: "x" sorts first and becomes active
        assert x.active[-1] is True and y.active[-1] is False
        sub.flow(cx, 100)
        sub.flow(cy, 100)
        await wait_until_async(lambda: len(x.got) == 6, 5)
        assert y.got == []
        sub.ack(cx, [(x.got[2].position, -1, 0)], cumulative=True)  # 0..2 acked
        sub.remove_consumer(cx)
        assert y.active[-1] is True
        await wait_until_async(lambda: len(y.got) == 3, 5)
        assert [d.position for d in y.got] == [d.position for d in x.got[3:]]
        await sub.close()
    run(main())


def test_key_shared_keeps_per_key_order_when_a_consumer_joins():
    async def main():
        keys = [f"k{i % 5}" for i in range(40)]
        ml, sub = await setup("Key_Shared", 40, keys)
        log = []  # global delivery order: (consumer, position, key)

        class Logged(Sink):
            def __init__(self, name):
                super().__init__()
                self.name = name

            def deliver(self, deliveries):
                super().deliver(deliveries)
                log.extend((self.name, d.position, read_header(d.entry).sticky_key) for d in deliveries)

        a = Logged("a")
        ca = sub.add_consumer("a", 0, a, "Key_Shared")
        sub.flow(ca, 20)  # a takes 20 messages (all 5 keys) and holds them unacked
        await wait_until_async(lambda: len(a.got) == 20, 5)
        b = Logged("b")
        cb = sub.add_consumer("b", 0, b, "Key_Shared")
        moved = {k for k in set(keys) if sub._ring.select(__import__("bksim.formats.murmur3", fromlist=["x"]).murmur3_32(k)) is cb}
        assert moved, "with 5 keys and 100 points each, some key moves to the new consumer"
        sub.flow(cb, 100)
        sub.flow(ca, 100)
        stay = set(keys) - moved
        await wait_until_async(lambda: len(a.got) == 20 + 4 * len(stay), 5)  # a gets the rest of its keys
        await wait_until_async(lambda: sub.idle, 5)
        assert b.got == []  # every moved key still has in-flight messages on a: b must wait
        sub.ack(ca, [(d.position, -1, 0) for d in a.got[:20]], cumulative=False)
        await wait_until_async(lambda: len(a.got) + len(b.got) == 40, 5)
        assert {read_header(d.entry).sticky_key for d in b.got} == moved
        for key in set(keys):  # per key: delivered in position order across both consumers
            positions = [p for _, p, k in log if k == key]
            assert positions == sorted(positions) and len(positions) == 8, key
        await sub.close()
    run(main())


async def two_ledgers(sub_type, config=CONFIG):
    """10 messages in two ledgers of 5, a subscription of sub_type and its consumer "a", which got them all."""
    _, _, [ml] = await world(TopicConfig(ledger_entries_max=5))
    await ml.open()
    for i in range(10):
        await ml.append(encode_entry([Message(b"m%d" % i, sequence_id=i)], producer_name="p",
                                     publish_time_ms=i, batch=False))
    sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type=sub_type,
                       cursor=MemoryCursor(ml, "sub"), ml=ml, clock=ManualClock(sleeps_advance=True), config=config)
    a = Sink()
    ca = sub.add_consumer("a", 0, a, sub_type)
    sub.flow(ca, 100)
    await wait_until_async(lambda: len(a.got) == 10, 5)
    return ml, sub, a, ca


def test_acks_of_messages_whose_ledger_was_trimmed_after_they_expired_free_the_consumer():
    """TTL moves the mark-delete past messages a consumer holds and retention deletes their ledger; the
    consumer's acks of them then change nothing in the cursor (they are at or before its mark-delete, as in
    Pulsar) but settle them, so a consumer at its unacked limit gets messages again."""
    async def main():
        ml, sub, a, ca = await two_ledgers("Shared", TopicConfig(failover_switch_delay_ms=1, consumer_unacked_max=10))
        first = ml.ledger_ids()[0]
        expired = [d.position for d in a.got if d.position.ledger == first]
        assert len(expired) == 5 and ca.unacked_messages == 10
        sub.cursor.expire_until(expired[-1])
        assert await ml.trim(sub.cursor.mark_delete, retention_ms=0, retention_bytes=-1) == [first]
        sub.ack(ca, [(p, -1, 0) for p in expired[:3]], cumulative=False)
        sub.ack(ca, [(expired[3], (0,), 1)], cumulative=False)
        assert ca.unacked_messages == 6 and sub.cursor.mark_delete == expired[-1]
        await ml.append(encode_entry([Message(b"m10", sequence_id=10)], producer_name="p", publish_time_ms=10,
                                     batch=False))
        sub.wake()
        await wait_until_async(lambda: len(a.got) == 11, 5)
        await sub.close()
    run(main())


def test_a_cumulative_ack_of_a_trimmed_message_changes_nothing_and_settles_what_it_covers():
    async def main():
        ml, sub, a, ca = await two_ledgers("Exclusive")
        first = ml.ledger_ids()[0]
        sub.cursor.expire_until(a.got[6].position)
        assert await ml.trim(sub.cursor.mark_delete, retention_ms=0, retention_bytes=-1) == [first]
        sub.ack(ca, [(a.got[2].position, -1, 0)], cumulative=True)
        assert sub.cursor.mark_delete == a.got[6].position and set(ca.pending) >= {d.position for d in a.got[5:]}
        assert not any(d.position in ca.pending for d in a.got[:3])
        with pytest.raises(TopicError) as info:  # a position that never existed is still refused
            sub.ack(ca, [(Position(first, -1), -1, 0)], cumulative=False)
        assert info.value.status is TopicStatus.INVALID_ACK
        await sub.close()
    run(main())


def test_ack_of_an_unknown_message_is_invalid_and_nothing_changes():
    async def main():
        ml, sub = await setup("Exclusive", 3)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Exclusive")
        with pytest.raises(TopicError) as info:
            sub.ack(ca, [(Position(ml.last_confirmed.ledger, 99), -1, 0)], cumulative=False)
        assert info.value.status is TopicStatus.INVALID_ACK
        assert sub.cursor.backlog() == 3
        await sub.close()
    run(main())


def test_failover_tells_a_joining_inactive_consumer_that_it_is_inactive():
    async def main():
        ml, sub = await setup("Failover", 0)
        x, y = Sink(), Sink()
        sub.add_consumer("a-first", 0, x, "Failover")
        sub.add_consumer("b-second", 0, y, "Failover")
        assert x.active == [True] and y.active == [False]
        await sub.close()
    run(main())


def test_a_batch_bigger_than_the_permits_waits_unless_it_exceeds_the_whole_queue():
    async def main():
        _, _, [ml] = await world()
        await ml.open()
        for n in (3, 8):  # a batch of 3 messages, then one of 8
            await ml.append(encode_entry([Message(b"x", sequence_id=i) for i in range(n)], producer_name="p",
                                         publish_time_ms=0, batch=True))
        sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type="Exclusive",
                           cursor=MemoryCursor(ml, "sub"), ml=ml, clock=ManualClock(sleeps_advance=True), config=CONFIG)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Exclusive")
        sub.flow(ca, 5)  # a queue of 5: the 3-message batch fits, then 2 permits are left for the 8-message one
        await wait_until_async(lambda: len(a.got) == 1 and sub.idle, 5)
        assert ca.permits == 2  # the 8-message batch waits: never beyond the permits...
        sub.flow(ca, 3)  # ...until the consumer's whole queue (5) is free again; it can never hold 8
        await wait_until_async(lambda: len(a.got) == 2, 5)
        assert ca.permits == -3
        await sub.close()
    run(main())


class HeldReads:
    """The managed ledger with reads the test completes: read() takes the entries when it is called (as a read
    sent to the bookies does) and returns them only once `gate` is set, so a test can act while it is in flight."""

    def __init__(self, ml) -> None:
        self._ml = ml
        self.gate: asyncio.Event | None = None
        self.waiting = 0

    def __getattr__(self, name):
        return getattr(self._ml, name)

    async def read(self, start, max_entries):
        got = await self._ml.read(start, max_entries)
        if self.gate is not None:
            self.waiting += 1
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        return got


async def held_setup(sub_type, n):
    ml, _ = await setup(sub_type, n)
    held = HeldReads(ml)
    sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type=sub_type,
                       cursor=MemoryCursor(ml, "sub"), ml=held, clock=ManualClock(sleeps_advance=True), config=CONFIG)
    return ml, held, sub


@pytest.mark.parametrize("sub_type", ["Exclusive", "Shared"])
def test_a_seek_discards_the_dispatch_read_in_flight(sub_type):
    async def main():
        ml, held, sub = await held_setup(sub_type, 10)
        everything = [p for p, _ in await ml.read(ml.first_position(), 10)]
        a = Sink()
        ca = sub.add_consumer("a", 0, a, sub_type)
        sub.flow(ca, 3)
        await wait_until_async(lambda: len(a.got) == 3 and sub.idle, 5)
        held.gate = asyncio.Event()
        sub.flow(ca, 3)  # the dispatcher reads entries 3..5; the read stays in flight
        await wait_until_async(lambda: held.waiting == 1, 5, 0.001, "the dispatch read in flight")
        await sub.seek(everything[0])
        after_seek = len(a.got)
        held.gate.set()  # the read from before the seek completes now
        sub.flow(ca, 100)
        await wait_until_async(lambda: sub.idle and held.waiting == 0, 5, 0.001, "the dispatcher done")
        assert [d.position for d in a.got[after_seek:]] == everything
        await sub.close()
    run(main())


def test_a_consumer_joining_while_the_departed_ones_read_is_in_flight_gets_everything():
    async def main():
        ml, held, sub = await held_setup("Shared", 10)
        everything = [p for p, _ in await ml.read(ml.first_position(), 10)]
        a, b = Sink(), Sink()
        ca = sub.add_consumer("a", 0, a, "Shared")
        sub.flow(ca, 3)
        await wait_until_async(lambda: len(a.got) == 3 and sub.idle, 5)
        held.gate = asyncio.Event()
        sub.flow(ca, 3)
        await wait_until_async(lambda: held.waiting == 1, 5, 0.001, "the dispatch read in flight")
        sub.remove_consumer(ca)  # its stream broke: the subscription starts again after the mark-delete
        cb = sub.add_consumer("b", 0, b, "Shared")  # the same client reconnected
        sub.flow(cb, 100)
        held.gate.set()
        await wait_until_async(lambda: sub.idle and held.waiting == 0, 5, 0.001, "the dispatcher done")
        assert sorted(d.position for d in b.got) == everything
        await sub.close()
    run(main())


def test_an_ack_set_acks_several_indexes_of_a_batch_at_once_and_a_bad_one_applies_nothing():
    async def main():
        _, _, [ml] = await world()
        await ml.open()
        await ml.append(encode_entry([Message(b"x", sequence_id=i) for i in range(5)], producer_name="p",
                                     publish_time_ms=0, batch=True))
        sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type="Shared",
                           cursor=MemoryCursor(ml, "sub"), ml=ml, clock=ManualClock(sleeps_advance=True), config=CONFIG)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Shared")
        sub.flow(ca, 10)
        await wait_until_async(lambda: len(a.got) == 1, 5)
        pos = a.got[0].position
        sub.ack(ca, [(pos, (4, 0, 2), 5)], cumulative=False)
        assert sub.cursor.acked_batch_indexes(pos) == [0, 2, 4] and sub.cursor.backlog() == 1
        for bad in [(1, 5), (1, -1), ()]:
            with pytest.raises(TopicError) as info:
                sub.ack(ca, [(pos, bad, 5)], cumulative=False)
            assert info.value.status is TopicStatus.INVALID_ACK
            assert sub.cursor.acked_batch_indexes(pos) == [0, 2, 4]
        sub.ack(ca, [(pos, (1, 3), 5)], cumulative=False)
        assert sub.cursor.backlog() == 0 and sub.cursor.is_acked(pos)
        await sub.close()
    run(main())
