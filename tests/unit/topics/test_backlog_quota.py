"""Backlog quotas: the pure decisions (topics/backlog_quota.py: estimate, breach, eviction point, retention
check) and a topic applying them over the in-memory store and fake bookies (hold released by an ack, the
exception status, eviction of the slow subscription only, quotas stored by compare-and-set next to grants)."""
from __future__ import annotations

import asyncio
import json

import pytest

from bksim.model.config import TopicConfig
from bksim.model.status import TopicStatus
from bksim.topics import backlog_quota as bq
from bksim.topics.errors import TopicError
from bksim.topics.names import policies_path
from bksim.topics.positions import Position
from bksim.topics.topic import Policies
from helpers import wait_until_async
from unit.topics.test_topic_service import TOPIC, cluster, msgs

L = [bq.LedgerSpan(10, 10, 1000), bq.LedgerSpan(11, 0, 0), bq.LedgerSpan(12, 5, 500)]  # 100 bytes an entry


def test_quota_validation_is_precise():
    with pytest.raises(TopicError) as e:
        bq.BacklogQuota("destination_storage", 0, "producer_exception")
    assert e.value.status is TopicStatus.BAD_REQUEST and "> 0 bytes" in e.value.message
    with pytest.raises(TopicError) as e:
        bq.BacklogQuota("message_age", 10, "drop_everything")
    assert "drop_everything" in e.value.message
    with pytest.raises(TopicError):
        bq.BacklogQuota("size", 10, "producer_exception")


def test_json_round_trip_and_one_quota_per_type():
    a = bq.BacklogQuota(bq.DESTINATION_STORAGE, 100, bq.PRODUCER_REQUEST_HOLD)
    b = bq.BacklogQuota(bq.MESSAGE_AGE, 5_000, bq.CONSUMER_BACKLOG_EVICTION)
    quotas = bq.with_quota(bq.with_quota((), b), a)
    assert quotas == (a, b)  # in TYPES order
    assert bq.quotas_from_json(bq.quotas_to_json(quotas)) == quotas
    c = bq.BacklogQuota(bq.DESTINATION_STORAGE, 7, bq.PRODUCER_EXCEPTION)
    assert bq.with_quota(quotas, c) == (c, b)
    assert bq.without_quota(quotas, bq.MESSAGE_AGE) == (a,)
    assert Policies.from_json(Policies(backlog_quotas=quotas).to_json()).backlog_quotas == quotas


def test_backlog_estimate_counts_only_what_follows_the_mark_delete():
    assert bq.backlog_bytes(L, Position(9, -1)) == 1500
    assert bq.backlog_bytes(L, Position(10, -1)) == 1500
    assert bq.backlog_bytes(L, Position(10, 3)) == 600 + 500
    assert bq.backlog_bytes(L, Position(10, 9)) == 500
    assert bq.backlog_bytes(L, Position(12, 4)) == 0


def test_breach_is_strictly_over_the_limit():
    size = bq.BacklogQuota(bq.DESTINATION_STORAGE, 1000, bq.PRODUCER_EXCEPTION)
    age = bq.BacklogQuota(bq.MESSAGE_AGE, 60_000, bq.PRODUCER_REQUEST_HOLD)
    assert bq.breached((size, age), 1000, 60_000) == []
    assert bq.breached((size, age), 1001, None) == [size]
    assert bq.breached((size, age), 0, 60_001) == [age]


def test_size_eviction_keeps_the_newest_entries_that_fit_ninety_percent():
    # limit 1000 -> target 900 bytes = the newest 9 entries: 5 of ledger 12 and the last 4 of ledger 10
    assert bq.size_eviction_mark_delete(L, Position(10, -1), 1000) == Position(10, 5)
    assert bq.backlog_bytes(L, Position(10, 5)) == 900
    # a limit inside the last ledger
    assert bq.size_eviction_mark_delete(L, Position(10, -1), 300) == Position(12, 2)  # 270 -> 2 entries kept
    # already under the target: nothing to evict
    assert bq.size_eviction_mark_delete(L, Position(10, 7), 1000) is None
    assert bq.age_eviction_cutoff_ms(100_000, 10_000) == 91_000


def test_a_quota_must_stay_below_a_set_retention():
    size = bq.BacklogQuota(bq.DESTINATION_STORAGE, 1000, bq.PRODUCER_EXCEPTION)
    bq.check_against_retention(size, retention_ms=0, retention_bytes=-1)  # no retention: anything goes
    bq.check_against_retention(size, retention_ms=0, retention_bytes=1001)
    with pytest.raises(TopicError) as e:
        bq.check_against_retention(size, retention_ms=0, retention_bytes=1000)
    assert e.value.status is TopicStatus.BAD_REQUEST and "retention" in e.value.message
    age = bq.BacklogQuota(bq.MESSAGE_AGE, 60_000, bq.PRODUCER_EXCEPTION)
    with pytest.raises(TopicError):
        bq.check_against_retention(age, retention_ms=60_000, retention_bytes=-1)


class Sink:
    def __init__(self):
        self.got = []

    def deliver(self, deliveries):
        self.got += deliveries

    def active_changed(self, active):
        pass

    def drop(self, error):
        pass


async def _topic(config=TopicConfig()):
    store, [svc, other] = await cluster(config=config)
    await svc.create_tenant("acme")
    await svc.create_namespace("acme/orders", Policies())
    await svc.create_topic(TOPIC, 0)
    return store, svc, other, await svc.acquire(TOPIC)


def test_quotas_are_stored_next_to_grants_and_reach_loaded_topics():
    async def main():
        store, svc, other, t = await _topic()
        path = policies_path("acme", "orders")
        data, version = await store.get(path)
        await store.set(path, json.dumps(json.loads(data) | {"auth_policies": {"namespace_auth": {"r": ["produce"]}}})
                        .encode(), version)
        quota = bq.BacklogQuota(bq.DESTINATION_STORAGE, 500, bq.PRODUCER_EXCEPTION)
        assert await other.set_backlog_quota("acme/orders", quota) == (quota,)
        assert json.loads((await store.get(path))[0])["auth_policies"] == {"namespace_auth": {"r": ["produce"]}}
        assert (await svc.get_namespace("acme/orders")).backlog_quotas == (quota,)
        await svc._refresh_policies()  # what the ownership watchdog does every second
        assert t.policies.backlog_quotas == (quota,)
        await svc.create_namespace("acme/kept", Policies(retention_bytes=400))
        with pytest.raises(TopicError) as e:
            await svc.set_backlog_quota("acme/kept", quota)
        assert e.value.status is TopicStatus.BAD_REQUEST
        assert await svc.remove_backlog_quota("acme/orders", bq.DESTINATION_STORAGE) == ()
        assert t.policies.backlog_quotas == ()
    asyncio.run(main())


def test_producer_exception_fails_sends_with_the_quota_status():
    async def main():
        _, svc, _, t = await _topic()
        name, _ = t.add_producer("p", "br0")
        await t.subscribe("slow", "Exclusive", "earliest", "c", 0, Sink())
        for i in range(5):
            await t.publish(name, msgs(i))
        size = t.backlog_bytes()
        assert size > 0
        await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.DESTINATION_STORAGE, size,
                                                                   bq.PRODUCER_EXCEPTION))
        await t.publish(name, msgs(5))  # at the limit: accepted, now over it
        with pytest.raises(TopicError) as e:
            await t.publish(name, msgs(6))
        assert e.value.status is TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED
        assert "destination_storage" in e.value.message and str(t.name) in e.value.message
    asyncio.run(main())


def test_producer_request_hold_waits_in_order_until_an_ack_brings_the_backlog_down():
    async def main():
        _, svc, _, t = await _topic(TopicConfig(backlog_quota_hold_ms_max=10**9))
        name, _ = t.add_producer("p", "br0")
        sub, consumer = await t.subscribe("slow", "Exclusive", "earliest", "c", 0, Sink())
        first = [await t.publish(name, msgs(i)) for i in range(3)]
        await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.DESTINATION_STORAGE, 1, bq.PRODUCER_REQUEST_HOLD))
        held = [asyncio.ensure_future(t.publish(name, msgs(3 + i))) for i in range(2)]
        await wait_until_async(lambda: t.held_sends == 2, 5)
        assert not any(f.done() for f in held) and t.stats()["heldSends"] == 2
        sub.cursor.ack(first)  # the consumer catches up: the backlog is empty
        positions = await asyncio.wait_for(asyncio.gather(*held), 5)
        assert positions[0] < positions[1] and t.held_sends == 0  # in the order they arrived
    asyncio.run(main())


async def _two_sends_held(config: TopicConfig):
    """Dedup on; producer p wrote 3 Sends that a slow subscription has not acked; a 1-byte producer_request_hold
    quota; p's next two Sends (3 and 4) arrive and are held, 4 behind 3 (the fake clock moves on by every sleep, so
    a short hold runs out at once). (svc, topic, subscription, the 3 first positions, the two Sends held)."""
    _, [svc, _] = await cluster(config=config)
    await svc.create_tenant("acme")
    await svc.create_namespace("acme/orders", Policies(dedup=True))
    await svc.create_topic(TOPIC, 0)
    t = await svc.acquire(TOPIC)
    t.add_producer("p", "br0")
    sub, _ = await t.subscribe("slow", "Exclusive", "earliest", "c", 0, Sink())
    first = [await t.publish("p", msgs(i)) for i in range(3)]
    await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.DESTINATION_STORAGE, 1, bq.PRODUCER_REQUEST_HOLD))
    held = [asyncio.ensure_future(t.publish("p", msgs(i))) for i in (3, 4)]
    return svc, t, sub, first, held


async def _resent_in_order(svc, t, first) -> None:
    """p connects again and resends Sends 3 and 4 (the quota lifted: each would be held again): both are written,
    in order, after the first three; none is taken for a duplicate."""
    t.remove_producer("p")
    name, last = t.add_producer("p", "br0")
    assert last == 2
    await svc.remove_backlog_quota("acme/orders", bq.DESTINATION_STORAGE)
    again = [await t.publish(name, msgs(i)) for i in (3, 4)]
    assert None not in again and first[-1] < again[0] < again[1]


def test_a_send_that_fails_fails_the_later_sends_of_its_producer_so_a_resend_is_no_duplicate():
    """A held Send times out while the next Send of the same producer waits behind it; the backlog then falls. The
    next Send must not be written ahead of it: the producer resends both after reconnecting, and with dedup a Send
    written after a failed one would make the resend of the failed one a "duplicate", a lost message."""
    async def main():
        svc, t, sub, first, [held, behind] = await _two_sends_held(
            TopicConfig(backlog_quota_hold_ms_max=500, backlog_quota_check_interval_ms=100))
        with pytest.raises(TopicError) as e:
            await held
        assert e.value.status is TopicStatus.TIMEOUT
        sub.cursor.ack(first)  # the backlog falls while the next Send waits for its turn
        with pytest.raises(TopicError) as e:
            await behind
        assert "an earlier Send of producer p failed" in e.value.message
        await _resent_in_order(svc, t, first)
    asyncio.run(main())


def test_a_send_abandoned_with_its_stream_fails_the_later_sends_of_its_producer():
    """The stream of a producer ends while its Send is held (the server's handler, awaiting it, is cancelled, and
    the Send with it); the Sends that came after it on that stream must not be written once the backlog falls."""
    async def main():
        svc, t, sub, first, [held, behind] = await _two_sends_held(TopicConfig(backlog_quota_hold_ms_max=10**9))
        await wait_until_async(lambda: t.held_sends == 2, 5)
        held.cancel()
        sub.cursor.ack(first)
        with pytest.raises(TopicError) as e:
            await asyncio.wait_for(behind, 5)
        assert "an earlier Send of producer p failed" in e.value.message
        await _resent_in_order(svc, t, first)
    asyncio.run(main())


def test_eviction_moves_only_the_slow_subscription_to_ninety_percent_of_the_limit():
    async def main():
        _, svc, _, t = await _topic()
        name, _ = t.add_producer("p", "br0")
        slow, _ = await t.subscribe("slow", "Shared", "earliest", "c1", 0, Sink())
        fast, _ = await t.subscribe("fast", "Shared", "earliest", "c2", 0, Sink())
        positions = [await t.publish(name, msgs(10 + i)) for i in range(20)]  # entries of one size
        fast.cursor.ack(positions[:15])
        per_entry = t.backlog_bytes() // 20
        await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.DESTINATION_STORAGE, per_entry * 10,
                                                                   bq.CONSUMER_BACKLOG_EVICTION))
        skipped = await t.enforce_backlog_quotas()
        assert skipped == 11 and slow.cursor.mark_delete == positions[10]  # 9 entries = 90% of 10 kept
        assert fast.cursor.mark_delete == positions[14]  # ahead of the eviction point: untouched
        assert t.backlog_bytes() == per_entry * 9 and t.stats()["backlogEvictedEntries"] == 11
        assert await t.enforce_backlog_quotas() == 0
    asyncio.run(main())


def test_message_age_eviction_and_exception_follow_the_oldest_unacknowledged_message():
    async def main():
        _, svc, _, t = await _topic()
        t._maintenance.cancel()  # the test applies the quotas itself, on its own clock steps
        name, _ = t.add_producer("p", "br0")
        slow, _ = await t.subscribe("slow", "Shared", "earliest", "c1", 0, Sink())
        fast, _ = await t.subscribe("fast", "Shared", "earliest", "c2", 0, Sink())
        old = [await t.publish(name, msgs(i)) for i in range(5)]
        t._clock.advance(10_000)
        new = [await t.publish(name, msgs(5 + i)) for i in range(5)]
        fast.cursor.ack(old + new)
        await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.MESSAGE_AGE, 8_000,
                                                                   bq.CONSUMER_BACKLOG_EVICTION))
        assert await t.enforce_backlog_quotas() == 5  # the five messages 10 s old; 7.2 s (90%) is the cutoff
        assert slow.cursor.mark_delete == old[-1] and fast.cursor.mark_delete == new[-1]
        assert await t._oldest_backlog_age_ms() == 0
        await svc.set_backlog_quota("acme/orders", bq.BacklogQuota(bq.MESSAGE_AGE, 5_000, bq.PRODUCER_EXCEPTION))
        await t.publish(name, msgs(10))
        t._clock.advance(5_001)
        with pytest.raises(TopicError) as e:
            await t.publish(name, msgs(11))
        assert e.value.status is TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED and "5001 ms old" in e.value.message
    asyncio.run(main())
