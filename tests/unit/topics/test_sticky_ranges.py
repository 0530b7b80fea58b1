"""Key_Shared sticky hash ranges: the range checks and lookup (topics/sticky_ranges.py), and a Key_Shared
subscription in sticky mode (each key only to the consumer whose range holds its slot, uncovered keys held until
a consumer covers them, overlaps and mixed modes refused with CONSUMER_ASSIGN_ERROR)."""
from __future__ import annotations

import asyncio

import pytest

from bksim.formats.message import read_header
from bksim.formats.murmur3 import murmur3_32
from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError
from bksim.topics.sticky_ranges import HASH_RANGE_SIZE, StickyRanges, check_ranges, slot_of
from helpers import wait_until_async
from unit.topics.test_subscription import Sink, setup


def test_check_ranges_sorts_and_refuses_malformed_overlapping_or_too_many():
    assert check_ranges([(10, 20), (0, 5)], 4) == ((0, 5), (10, 20))
    for bad, words in (([], "at least one"), ([(5, 4)], "start <= end"), ([(0, HASH_RANGE_SIZE)], "within"),
                       ([(-1, 3)], "within"), ([(0, 10), (10, 12)], "overlap"), ([(0, 1)] * 5, "at most")):
        with pytest.raises(TopicError) as e:
            check_ranges(bad, 4)
        assert e.value.status is TopicStatus.CONSUMER_ASSIGN_ERROR and words in e.value.message, bad


def test_lookup_and_overlap_between_consumers():
    r: StickyRanges[str] = StickyRanges()
    r.add("a", "A", ((0, 99), (200, 299)))
    r.add("b", "B", ((100, 199),))
    assert [r.select(s) for s in (0, 99, 100, 199, 200, 299, 300, 65535)] == ["A", "A", "B", "B", "A", "A", None,
                                                                              None]
    with pytest.raises(TopicError) as e:
        r.add("c", "C", ((300, 400), (250, 260)))
    assert "[250, 260] of consumer c overlaps [200, 299] of consumer a" in e.value.message
    assert r.select(350) is None and len(r) == 3  # nothing of c was taken
    r.remove("A")
    assert r.select(50) is None and r.ranges_of("B") == [(100, 199)]
    r.add("c", "C", ((0, 99),))
    assert r.select(50) == "C"
    assert slot_of(0x1234_5678) == 0x5678


def _keys_by_half(n):
    """n keys whose slot is in the lower half and n in the upper half."""
    low, high, i = [], [], 0
    while len(low) < n or len(high) < n:
        key = f"k{i}"
        (low if slot_of(murmur3_32(key)) < HASH_RANGE_SIZE // 2 else high).append(key)
        i += 1
    return low[:n], high[:n]


def test_each_key_goes_only_to_its_range_and_uncovered_keys_wait():
    async def main():
        low, high = _keys_by_half(10)
        keys = [k for pair in zip(low, high) for k in pair]  # alternate halves
        ml, sub = await setup("Key_Shared", len(keys), keys)
        a = Sink()
        ca = sub.add_consumer("a", 0, a, "Key_Shared", [(0, HASH_RANGE_SIZE // 2 - 1)])
        sub.flow(ca, 100)
        await wait_until_async(lambda: len(a.got) == 10, 5)
        await wait_until_async(lambda: sub.idle, 5)
        assert {read_header(d.entry).sticky_key for d in a.got} == set(low)  # the upper half is held
        assert sub.stats()["keySharedMode"] == "STICKY" and sub.stats()["replayQueueSize"] == 10
        with pytest.raises(TopicError) as e:
            sub.add_consumer("x", 0, Sink(), "Key_Shared", [(HASH_RANGE_SIZE // 2 - 1, HASH_RANGE_SIZE - 1)])
        assert e.value.status is TopicStatus.CONSUMER_ASSIGN_ERROR and "consumer a" in e.value.message
        with pytest.raises(TopicError) as e:
            sub.add_consumer("y", 0, Sink(), "Key_Shared")  # auto-split next to sticky consumers
        assert e.value.status is TopicStatus.CONSUMER_ASSIGN_ERROR
        b = Sink()
        cb = sub.add_consumer("b", 0, b, "Key_Shared", [(HASH_RANGE_SIZE // 2, HASH_RANGE_SIZE - 1)])
        sub.flow(cb, 100)
        await wait_until_async(lambda: len(b.got) == 10, 5)
        assert [read_header(d.entry).sticky_key for d in b.got] == high  # in order, once covered
        assert len(a.got) == 10
        assert sub.stats()["consumers"][1]["keyHashRanges"] == [f"[{HASH_RANGE_SIZE // 2}, {HASH_RANGE_SIZE - 1}]"]
        await sub.close()
    asyncio.run(main())
