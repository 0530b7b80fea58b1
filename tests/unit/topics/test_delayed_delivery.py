"""Delayed delivery: the tracker alone (topics/delayed_delivery.py: order, bound, clear) and the dispatcher
using it (topics/subscription.py) over a real ManagedLedger with a ManualClock that moves only when the test
says: a held message is not delivered before its time and is once it comes, the bound stops reading without
skipping, Exclusive ignores the time, a rewind rebuilds the tracker from the log; and the entry format's
delivery time (formats/message.py)."""
from __future__ import annotations

import asyncio

import pytest

from bksim.formats.message import Message, decode_entry, encode_entry, read_header
from bksim.model.config import TopicConfig
from bksim.model.errors import FormatError
from bksim.topics.delayed_delivery import DelayedDeliveryTracker
from bksim.topics.positions import Position
from bksim.topics.subscription import Subscription
from fakes.clock import WALL_EPOCH_MS, ManualClock
from fakes.cursor import MemoryCursor
from helpers import wait_until_async
from tests.unit.topics.test_managed_ledger import world
from tests.unit.topics.test_subscription import Sink


def P(e: int) -> Position:
    return Position(1, e)


# ---- the tracker --------------------------------------------------------------------------------------------------
def test_tracker_returns_due_positions_earliest_first_and_never_early():
    t = DelayedDeliveryTracker(10)
    assert t.add(P(3), 300) and t.add(P(1), 100) and t.add(P(2), 300) and t.add(P(4), 200)
    assert t.next_due_ms() == 100
    assert t.pop_due(99) == []
    assert t.pop_due(200) == [P(1), P(4)]
    assert t.next_due_ms() == 300 and len(t) == 2
    assert t.pop_due(10_000, max_n=1) == [P(2)]   # equal times: position order
    assert t.pop_due(10_000) == [P(3)]
    assert t.next_due_ms() is None and len(t) == 0


def test_tracker_is_bounded_and_adding_a_held_position_again_keeps_its_first_time():
    t = DelayedDeliveryTracker(2)
    assert t.add(P(1), 500) and t.add(P(2), 600)
    assert t.full and not t.add(P(3), 100)
    assert t.add(P(1), 50)          # already held: accepted, time unchanged
    assert t.pop_due(100) == []
    t.discard(P(1))
    assert not t.full and t.add(P(3), 100)
    assert t.pop_due(1_000) == [P(3), P(2)]
    with pytest.raises(ValueError):
        DelayedDeliveryTracker(0)


def test_tracker_clear_then_rebuild_from_the_same_log_gives_the_same_schedule():
    log = [(P(i), 1_000 - 10 * i) for i in range(20)]
    t = DelayedDeliveryTracker(100)
    for pos, at in log:
        t.add(pos, at)
    first = t.pop_due(905)
    t.clear()
    for pos, at in log:
        t.add(pos, at)
    assert t.pop_due(905) == first == [P(i) for i in range(19, 9, -1)]


# ---- the entry format -------------------------------------------------------------------------------------------
def test_format_carries_the_delivery_time_and_refuses_a_delayed_batch():
    entry = encode_entry([Message(b"x", key="k", sequence_id=3, deliver_at_ms=123_456)], producer_name="p",
                         publish_time_ms=1, batch=False)
    header, [m] = decode_entry(entry)
    assert header.deliver_at_ms == 123_456 and m.deliver_at_ms == 123_456 and m.key == "k" and m.payload == b"x"
    plain = encode_entry([Message(b"x", key="k", sequence_id=3)], producer_name="p", publish_time_ms=1, batch=False)
    assert len(entry) == len(plain) + 8 and read_header(plain).deliver_at_ms == 0
    with pytest.raises(FormatError):
        encode_entry([Message(b"a", deliver_at_ms=5), Message(b"b")], producer_name="p", publish_time_ms=1,
                     batch=True)


# ---- the dispatcher ---------------------------------------------------------------------------------------------
async def setup(sub_type, delays_ms, limit=100):
    """One entry per delay (0 = not delayed), delivery times relative to the ManualClock's wall time 0."""
    _, _, [ml] = await world()
    await ml.open()
    for i, d in enumerate(delays_ms):
        await ml.append(encode_entry([Message(b"m%d" % i, sequence_id=i,
                                              deliver_at_ms=WALL_EPOCH_MS + d if d else 0)],
                                     producer_name="p", publish_time_ms=i, batch=False))
    clock = ManualClock()
    sub = Subscription(topic="persistent://t/ns/orders", name="sub", sub_type=sub_type, cursor=MemoryCursor(ml, "sub"),
                       ml=ml, clock=clock, config=TopicConfig(delayed_messages_per_subscription_max=limit))
    return ml, sub, clock


def names(sink):
    return [decode_entry(d.entry)[1][0].payload.decode() for d in sink.got]


def test_shared_holds_a_delayed_message_until_its_time():
    async def main():
        ml, sub, clock = await setup("Shared", [0, 500, 0, 200])
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Shared")
        sub.flow(ca, 100)
        await wait_until_async(lambda: sub.idle and len(a.got) == 2, 5)
        assert names(a) == ["m0", "m2"] and sub.stats()["msgDelayed"] == 2
        clock.advance(199)
        await wait_until_async(lambda: sub.idle, 5)
        assert len(a.got) == 2                        # one ms early: nothing
        clock.advance(1)
        await wait_until_async(lambda: len(a.got) == 3, 5)
        assert names(a)[2] == "m3" and a.got[2].redelivery_count == 0
        clock.advance(300)
        await wait_until_async(lambda: len(a.got) == 4, 5)
        assert names(a)[3] == "m1" and sub.stats()["msgDelayed"] == 0
        await sub.close()
    asyncio.run(main())


def test_key_shared_holds_too_and_exclusive_ignores_the_time():
    async def main():
        _, ks, clock = await setup("Key_Shared", [1_000, 0])
        a = Sink()
        sub_a = ks.add_consumer("a", 0, a, "Key_Shared")
        ks.flow(sub_a, 10)
        await wait_until_async(lambda: ks.idle and len(a.got) == 1, 5)
        assert names(a) == ["m1"]
        clock.advance(1_000)
        await wait_until_async(lambda: len(a.got) == 2, 5)
        await ks.close()
        _, ex, _ = await setup("Exclusive", [1_000, 0])
        b = Sink()
        ex.flow(ex.add_consumer("b", 0, b, "Exclusive"), 10)
        await wait_until_async(lambda: len(b.got) == 2, 5)
        assert names(b) == ["m0", "m1"] and ex.stats()["msgDelayed"] == 0
        await ex.close()
    asyncio.run(main())


def test_the_bound_stops_reading_without_skipping_and_a_rewind_rebuilds_the_tracker():
    async def main():
        ml, sub, clock = await setup("Shared", [100, 100, 100, 0], limit=2)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Shared")
        sub.flow(ca, 100)
        await wait_until_async(lambda: sub.idle and sub.stats()["msgDelayed"] == 2, 5)
        assert a.got == []                            # m2 does not fit; m3 waits behind it
        sub.remove_consumer(ca)                       # rewind: the tracker is forgotten ...
        assert sub.stats()["msgDelayed"] == 0
        b = Sink()
        cb = sub.add_consumer("b", 0, b, "Shared")
        sub.flow(cb, 100)
        await wait_until_async(lambda: sub.idle and sub.stats()["msgDelayed"] == 2, 5)   # ... and rebuilt
        assert b.got == []
        clock.advance(100)                            # m0, m1 due; then m2 is held, m3 goes, m2 comes due
        await wait_until_async(lambda: len(b.got) == 4, 5)
        assert sorted(names(b)) == ["m0", "m1", "m2", "m3"]
        await sub.close()
    asyncio.run(main())
