"""Topics over durable ManagedCursors (FakeBookies, the in-memory metadata store, a manual clock), taken over by
a second broker the way a kill -9 leaves them (the old owner is aborted: it writes nothing more, the new one
recovers the ledgers and cursors): dedup state that crosses the takeover, retention trimming bounded by what
the cursors persisted, and a load that fails with a retriable status while a cursor ledger cannot be read."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.topics.errors import TopicError
from bksim.topics.managed_cursor import ManagedCursor
from bksim.topics.managed_ledger import ManagedLedger
from bksim.topics.names import TopicName
from bksim.topics.positions import Position
from bksim.topics.topic import Policies, Topic
from bksim.client.errors import RETRIABLE
from bksim.formats.message import Message, read_header
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig, TopicConfig
from bksim.model.errors import LedgerError
from bksim.model.status import TopicStatus
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

TOPIC = TopicName.parse("persistent://acme/orders/o1")
BOOKIES = ("b0", "b1", "b2")


class World:
    def __init__(self) -> None:
        self.store = InMemoryMetadataStore()
        self.fake = FakeBookies(BOOKIES)
        self.clock = ManualClock()
        self.logs: list[str] = []
        self.brokers = 0

    async def start(self) -> "World":
        reg = self.store.session("bookies")
        for b in BOOKIES:
            await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
        await ManagedLedger.create_znode(self.store.session("admin"), TOPIC)
        return self

    async def load(self, policies: Policies, config: TopicConfig, cursor_ledgers=None) -> Topic:
        """A broker of its own (metadata session, ledger client) loads the topic, as a new owner does.
        `cursor_ledgers(ledgers)`: what the cursors use in place of the broker's ledger client."""
        self.brokers += 1
        session = self.store.session(f"broker-{self.brokers}")
        ledgers = LedgerService(store=session, transport=self.fake, rng=random.Random(self.brokers), clock=self.clock,
                                config=BrokerConfig(), log=self.logs.append)
        for_cursors = cursor_ledgers(ledgers) if cursor_ledgers else ledgers
        ml = ManagedLedger(TOPIC, ledgers=ledgers, store=session, clock=self.clock, config=config,
                           log=self.logs.append)

        async def open_cursor(name: str, initial_position: str, create: bool) -> ManagedCursor:
            # no background flush: a cursor persists exactly when the test says (its flusher's part)
            return await ManagedCursor.open(name=name, path=TOPIC.cursor_path(name), layout=ml, ledgers=for_cursors,
                                            store=session, clock=self.clock, config=config,
                                            initial_position=initial_position, log=self.logs.append,
                                            background_flush=False)

        topic = Topic(TOPIC, ml=ml, open_cursor=open_cursor, clock=self.clock, policies=policies, config=config,
                      log=self.logs.append)
        await topic.load()
        return topic


def run(coro):
    return asyncio.run(coro)


def msgs(seq: int) -> list[Message]:
    return [Message(b"v%d" % seq, sequence_id=seq)]


async def stored(topic: Topic) -> list[tuple[str, int]]:
    """(producer, sequence id) of every entry the topic holds, in order."""
    ml, out = topic.ml, []
    for ledger_id in ml.ledger_ids():
        count = ml.entries_in(ledger_id) or 0
        if count:
            for _, entry in await ml.read(Position(ledger_id, 0), count):
                h = read_header(entry)
                out.append((h.producer_name, h.highest_sequence_id))
    return out


def test_sends_confirmed_together_are_all_in_the_dedup_snapshot_a_new_owner_loads():
    async def main():
        w = await World().start()
        config = TopicConfig(dedup_snapshot_entries=2)
        a = await w.load(Policies(dedup=True), config)
        a.add_producer("p1", "br1")
        a.add_producer("p2", "br1")
        await a.publish("p1", msgs(0))
        # two sends answered by one bookie round: both are confirmed before either publish call resumes
        for b in BOOKIES:
            w.fake[b].gate = asyncio.Event()
        sends = [asyncio.ensure_future(a.publish("p1", msgs(1))), asyncio.ensure_future(a.publish("p2", msgs(0)))]
        await wait_until_async(lambda: a.ml.pending_count == 2 and sum(w.fake[b].waiting for b in BOOKIES) >= 2, 5,
                               0.001, "both adds waiting at the bookies")
        for b in BOOKIES:
            w.fake[b].gate.set()
        p1_pos, p2_pos = await asyncio.gather(*sends)
        dedup = a._dedup_cursor
        # the snapshot (p1's second send made it due) covers both entries, so it must hold both producers' ids
        assert dedup.mark_delete >= p2_pos > p1_pos
        assert dedup.properties == {"p1": 1, "p2": 0}
        await dedup.persist(force=True)  # the cursor's flusher writes the snapshot
        await a.fence("kill -9")  # the owner dies: nothing more is written
        b = await w.load(Policies(dedup=True), config)
        assert b.add_producer("p2", "br2") == ("p2", 0)
        assert await b.publish("p2", msgs(0)) is None  # the producer's re-send of what had no receipt
        assert await stored(b) == [("p1", 0), ("p1", 1), ("p2", 0)]
    run(main())


def test_trimming_waits_for_the_persisted_mark_delete_and_dedup_keeps_what_it_has_not_persisted():
    async def main():
        w = await World().start()
        config = TopicConfig(ledger_entries_max=5, dedup_snapshot_entries=5)
        policies = Policies(retention_ms=0, dedup=True)
        a = await w.load(policies, config)
        a.add_producer("p", "br1")
        for seq in range(10):  # two full ledgers of 5 (the third, empty, is being written)
            await a.publish("p", msgs(seq))
        await wait_until_async(lambda: a.ml.state == "LedgerOpened" and len(a.ml.ledger_ids()) == 3, 5, 0.001,
                               "the roll after the tenth entry")
        ledgers = a.ml.ledger_ids()
        dedup = a._dedup_cursor
        assert dedup.mark_delete == a.ml.last_confirmed  # the in-memory snapshot (every 5 entries)
        # nothing is persisted yet: the dedup cursor's persisted position is still before the first ledger,
        # so the ledgers it has not persisted past must stay (a new owner replays them)
        assert await a.run_trim() == []
        assert a.ml.ledger_ids() == ledgers
        await a.fence("kill -9")
        b = await w.load(policies, config)
        assert b.add_producer("p", "br2") == ("p", 9)
        assert await b.publish("p", msgs(9)) is None  # the re-send of the last message is known
        for seq in range(10, 15):  # the next snapshot (in memory) covers everything: nothing trimmed yet
            await b.publish("p", msgs(seq))
        await wait_until_async(lambda: b.ml.state == "LedgerOpened", 5, 0.001, "the roll after five entries")
        closed = b.ml.ledger_ids()[:-1]
        assert closed[:2] == ledgers[:2] and b._dedup_cursor.mark_delete == b.ml.last_confirmed
        assert await b.run_trim() == []
        # once the cursor persisted past them, the consumed ledgers go
        await b._dedup_cursor.persist(force=True)
        assert b._dedup_cursor.persisted_mark_delete == b.ml.last_confirmed
        assert await b.run_trim() == closed
        assert await stored(b) == []
    run(main())


class UnreadableCursorLedgers:
    """The broker's ledger client as the cursors see it, with recovery-opens failing as while the cursor ledger's
    bookies are unreachable (a transient READ_FAILED); everything else goes through."""

    def __init__(self, ledgers: LedgerService) -> None:
        self._ledgers = ledgers

    def __getattr__(self, name):
        return getattr(self._ledgers, name)

    async def open_ledger(self, ledger_id: int, **kw):
        raise LedgerError("READ_FAILED", f"ledger {ledger_id}: no bookie of the ensemble answered")


class Sink:
    def __init__(self) -> None:
        self.got = []

    def deliver(self, deliveries):
        self.got += deliveries

    def active_changed(self, active):
        pass

    def drop(self, error):
        pass


def test_a_load_fails_retriably_while_a_cursor_ledger_cannot_be_read_and_the_retry_keeps_every_ack():
    async def main():
        w = await World().start()
        config = TopicConfig()
        a = await w.load(Policies(), config)
        sub, consumer = await a.subscribe("s", "Exclusive", "earliest", "c", 0, Sink())
        name, _ = a.add_producer("p", "br1")
        positions = [await a.publish(name, msgs(seq)) for seq in range(6)]
        sub.ack(consumer, [(positions[3], -1, 0)], cumulative=True)
        await sub.cursor.persist(force=True)  # the cursor ledger holds mark-delete positions[3]
        await a.fence("kill -9")
        with pytest.raises(TopicError) as info:
            await w.load(Policies(), config, cursor_ledgers=UnreadableCursorLedgers)
        assert info.value.status is TopicStatus.SERVICE_UNAVAILABLE and info.value.status in RETRIABLE
        assert "cannot be read now" in info.value.message
        b = await w.load(Policies(), config)  # the client's retry, once the bookies answer
        assert b.subscriptions["s"].cursor.mark_delete == positions[3]
        assert b.subscriptions["s"].cursor.stats_internal()["recovery"]["source"] == "ledger"
    run(main())


def test_a_dedup_snapshot_failing_at_close_does_not_keep_the_subscriptions_cursors_from_closing():
    """Pulsar closes every cursor of a managed ledger on its own (ManagedLedgerImpl.closeAllCursors): the dedup
    cursor's forced snapshot failing (ZooKeeper connection lost) must not cost the subscriptions their final state."""
    async def main():
        w = await World().start()
        config = TopicConfig()
        a = await w.load(Policies(dedup=True), config)
        sub, consumer = await a.subscribe("s", "Exclusive", "earliest", "c", 0, Sink())
        name, _ = a.add_producer("p", "br1")
        positions = [await a.publish(name, msgs(seq)) for seq in range(4)]
        sub.ack(consumer, [(positions[1], -1, 0)], cumulative=True)
        sub.ack(consumer, [(positions[3], -1, 0)], cumulative=False)

        async def refused(force=False):
            raise TopicError(TopicStatus.METADATA_ERROR, "connection loss: the outcome is unknown")
        a._dedup_cursor.persist = refused
        await a.close()
        assert sub.cursor.closed_cleanly
        b = await w.load(Policies(dedup=True), config)
        cursor = b.subscriptions["s"].cursor
        assert cursor.mark_delete == positions[1] and cursor.is_acked(positions[3])
        assert not cursor.is_acked(positions[2])
    run(main())


def test_a_topic_refuses_sends_once_its_close_begins_so_a_steady_producer_cannot_hold_the_unload():
    """Pulsar's PersistentTopic.close fences the topic before it closes anything: a publish made while the close
    waits for the ledger's pending appends is refused (the producer looks the topic up again and its sequence ids
    go to the next owner), so producers that keep sending cannot keep the close waiting."""
    async def main():
        w = await World().start()
        config = TopicConfig()
        a = await w.load(Policies(dedup=True), config)
        name, _ = a.add_producer("p", "br1")
        await a.publish(name, msgs(0))
        gate = asyncio.Event()
        for b in BOOKIES:
            w.fake[b].gate = gate
        first = asyncio.ensure_future(a.publish(name, msgs(1)))
        await wait_until_async(lambda: any(w.fake[b].waiting for b in BOOKIES), 5, 0.01, "the add at the bookies")
        closing = asyncio.ensure_future(a.close())
        await wait_until_async(lambda: a.ml._drained is not None, 5, 0.01, "the close waiting for the pending append")
        with pytest.raises(TopicError) as info:
            await asyncio.wait_for(a.publish(name, msgs(2)), 5)  # accepted, it would wait at the gate
        assert info.value.status is TopicStatus.NOT_OWNER and info.value.status in RETRIABLE
        assert "unloading" in info.value.message
        with pytest.raises(TopicError) as info:
            a.add_producer("q", "br1")
        assert info.value.status is TopicStatus.NOT_OWNER
        assert len(a.ml._pending) == 1  # only the append made before the close
        gate.set()
        await asyncio.wait_for(closing, 10)
        assert (await first) is not None
        b = await w.load(Policies(dedup=True), config)
        assert [seq for _, seq in await stored(b)] == [0, 1]
        _, last = b.add_producer("p", "br2")
        assert last == 1  # the refused send is the producer's to resend, to the next owner
    run(main())
