"""A topic (or one partition) served by this broker: its managed ledger, producers, subscriptions and dedup.

Owns: the producers connected here, the subscriptions (one durable cursor each, under the managed-ledger
znode; a reader's is non-durable, in memory only, and goes when the reader leaves), message deduplication, and the periodic maintenance (age rollover, retention trimming, TTL).

Deduplication (namespace policy `dedup`): per producer name, the highest sequence id pushed (sent to the ledger)
and persisted (acknowledged). A Send whose highest sequence id is <= persisted is a duplicate: it is answered
as such and not written. One that is <= pushed waits for the in-flight one to settle. The persisted id is
recorded in the managed ledger's confirmation of the entry itself (ManagedLedger.append's on_confirmed, Pulsar's
add-complete callback), so the map always covers every entry up to last_confirmed. The persisted map is
snapshotted into the properties of the cursor `bksim.dedup` every `dedup_snapshot_entries` entries (the cursor's
mark-delete moves to last_confirmed with it); a new owner loads the last persisted snapshot and replays the
entries after it, reading only their headers. Trimming never deletes a ledger past a cursor's persisted
mark-delete, so those entries are still there. So dedup survives broker failover (as in Pulsar's
MessageDeduplication).

Backlog quotas (namespace policy `backlog_quotas`, topics/backlog_quota.py decides): a Send first passes
`_admit_send`: over a producer_exception quota it fails with PRODUCER_BLOCKED_QUOTA_EXCEEDED; over a
producer_request_hold quota it waits, in arrival order (a Send arriving while others are held waits behind
them), looking again every `backlog_quota_check_interval_ms` until the backlog is under the limit or
`backlog_quota_hold_ms_max` has passed (then TIMEOUT: the client sends it again). The maintenance loop applies
consumer_backlog_eviction every `backlog_quota_check_interval_ms`: the durable subscriptions behind the eviction
point have their mark-delete moved there (logged with the entries each skips); the others keep their messages.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from bksim.topics import backlog_quota as bq
from bksim.topics.errors import TopicError
from bksim.topics.managed_ledger import ManagedLedger, ManagedLedgerState
from bksim.topics.names import TopicName, subscription_of
from bksim.topics.non_durable_cursor import READER_NAME_PREFIX, NonDurableCursor, reader_start
from bksim.topics.positions import MessageId, Position
from bksim.topics.subscription import ConsumerSink, Subscription
from bksim.formats.message import Message, encode_entry, read_header
from bksim.model.config import TopicConfig
from bksim.model.errors import FormatError, MetadataError, NoNodeError
from bksim.model.status import TopicStatus
from bksim.ports.clock import Clock

DEDUP_CURSOR = "bksim.dedup"
DEDUP_WAIT_MS_MAX = 30_000


@dataclass(frozen=True, slots=True)
class Policies:
    retention_ms: int = 0
    retention_bytes: int = -1
    ttl_ms: int = 0
    dedup: bool = False
    backlog_quotas: tuple[bq.BacklogQuota, ...] = ()   # at most one per type (topics/backlog_quota.py)

    def to_json(self) -> dict:
        return {"retention_ms": self.retention_ms, "retention_bytes": self.retention_bytes, "ttl_ms": self.ttl_ms,
                "dedup": self.dedup, "backlog_quota_map": bq.quotas_to_json(self.backlog_quotas)}

    @staticmethod
    def from_json(d: dict) -> "Policies":
        """ValueError when a field is malformed (the caller names the znode)."""
        try:
            quotas = bq.quotas_from_json(d.get("backlog_quota_map"))
        except TopicError as e:
            raise ValueError(e.message) from None
        return Policies(int(d.get("retention_ms", 0)), int(d.get("retention_bytes", -1)), int(d.get("ttl_ms", 0)),
                        bool(d.get("dedup", False)), quotas)


@dataclass(slots=True)
class Producer:
    name: str
    connected_ms: int
    messages_in: int = 0
    bytes_in: int = 0
    failed: TopicError | None = None  # its first Send that failed since it connected: every later one fails too


class Topic:
    def __init__(self, name: TopicName, *, ml: ManagedLedger, open_cursor, clock: Clock, policies: Policies,
                 config: TopicConfig = TopicConfig(), log: Callable[[str], None] = lambda line: None) -> None:
        """`open_cursor(name, initial_position, create)` -> ManagedCursor (async) is the cursor factory."""
        self.name = name
        self.ml = ml
        self._open_cursor = open_cursor
        self._clock = clock
        self.policies = policies
        self.config = config
        self._log = log
        self.partition = name.partition_index if name.partition_index is not None else -1
        self.subscriptions: dict[str, Subscription] = {}
        self.producers: dict[str, Producer] = {}
        self._producer_seq = 0
        self._reader_seq = 0
        self._pushed: dict[str, int] = {}
        self._persisted: dict[str, int] = {}
        self._dedup_cursor = None
        self._since_snapshot = 0
        self._settled = asyncio.Event()
        self.fenced: TopicError | None = None
        self._fence_done = False  # fence() began dropping the clients and aborting the cursors
        self.closing = False  # close() began: no new producer, subscription or Send (PersistentTopic.close fences first)
        self.messages_in = 0
        self.bytes_in = 0
        self.loaded_ms = clock.wall_ms()
        self._maintenance: asyncio.Task | None = None
        self._sub_lock = asyncio.Lock()
        self.rates: dict[str, float] = {}  # per second over the last maintenance interval (see _sample_rates)
        self._rate_sample: tuple[float, dict[str, int]] | None = None
        self._hold_lock = asyncio.Lock()   # held Sends go on in arrival order
        self.held_sends = 0                # Sends waiting for the backlog to drop (producer_request_hold)
        self.evicted_entries = 0           # entries skipped by consumer_backlog_eviction, all subscriptions
        self.oldest_backlog_age_ms: int | None = None   # as of the last backlog check (None: no backlog)

    # ---- load / close ----------------------------------------------------------------------------------------
    async def load(self) -> None:
        await self.ml.open()
        try:
            nodes = await self.ml._store.children(self.ml.path)
        except NoNodeError:
            nodes = []
        except MetadataError as e:
            raise TopicError(TopicStatus.METADATA_ERROR,
                             f"topic {self.name}: listing subscriptions failed: {e}") from None
        for node in nodes:
            sub_name = subscription_of(node)
            if sub_name == DEDUP_CURSOR:
                continue
            cursor = await self._open_cursor(sub_name, "earliest", False)
            self.subscriptions[sub_name] = self._subscription(sub_name, "Exclusive", cursor)
        if self.policies.dedup:
            await self._load_dedup()
        self._maintenance = asyncio.get_running_loop().create_task(self._maintain())

    def _subscription(self, name: str, sub_type: str, cursor, durable: bool = True) -> Subscription:
        return Subscription(topic=str(self.name), name=name, sub_type=sub_type, cursor=cursor, ml=self.ml,
                            clock=self._clock, config=self.config, partition=self.partition, log=self._log,
                            durable=durable)

    async def close(self) -> None:
        """Clean unload: subscriptions and cursors close with their final state, then the managed ledger.

        New producers, subscriptions and Sends are refused from the start (NOT_OWNER: look the topic up again), as
        Pulsar fences a topic before closing it: the managed ledger waits only for the appends made before, so
        producers that keep sending cannot keep the unload waiting."""
        self.closing = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        error = TopicError(TopicStatus.NOT_OWNER,
                           f"topic {self.name} is being unloaded from this broker; look it up again")
        for sub in list(self.subscriptions.values()):
            await sub.close(error)
        await self.ml.close()
        if self._dedup_cursor is not None:
            try:  # its failure must not keep the subscriptions' cursors from persisting their final state
                await self._snapshot_dedup(force=True)
            except TopicError as e:
                if e.status is TopicStatus.TOPIC_FENCED:
                    raise  # another broker owns the topic: nothing more is written here
                self._log(f"topic {self.name}: dedup snapshot not written at close ({e}); the next owner replays "
                          f"the entries after the last one written")
        for sub in list(self.subscriptions.values()):
            await _close_cursor(sub.cursor, self._log)
        if self._dedup_cursor is not None:
            await _close_cursor(self._dedup_cursor, self._log)

    def stop_serving(self, reason: str) -> None:
        """The first step of `fence`, taken without waiting: from now on every call is refused (TOPIC_FENCED), the
        maintenance stops and the managed ledger writes nothing more (its pending appends fail)."""
        if self.fenced is not None:
            return
        self.fenced = TopicError(TopicStatus.TOPIC_FENCED, f"topic {self.name} is fenced on this broker: {reason}")
        if self._maintenance is not None:
            self._maintenance.cancel()
        self.ml.abandon(reason)

    async def fence(self, reason: str) -> None:
        """Ownership lost: stop at once (`stop_serving`), drop producers and consumers (they look the topic up
        again), abort the cursors (nothing more persisted here)."""
        self.stop_serving(reason)
        if self._fence_done:
            return
        self._fence_done = True
        for sub in list(self.subscriptions.values()):
            await sub.close(self.fenced)
            sub.cursor.abort(reason)  # write nothing more: the new owner recovers the cursor ledger
        if self._dedup_cursor is not None:
            self._dedup_cursor.abort(reason)
        self.producers.clear()
        self._settled.set()

    # ---- producers ---------------------------------------------------------------------------------------------
    def add_producer(self, requested: str, broker_id: str) -> tuple[str, int]:
        """(producer name, last persisted sequence id or -1)."""
        self._check_serving()
        name = requested
        if not name:
            self._producer_seq += 1
            name = f"{broker_id}-{self.loaded_ms}-{self._producer_seq}"
        if name in self.producers:
            raise TopicError(TopicStatus.NOT_ALLOWED, f"a producer named {name!r} is already connected to {self.name}")
        self.producers[name] = Producer(name, self._clock.wall_ms())
        return name, self._persisted.get(name, -1) if self.policies.dedup else -1

    def remove_producer(self, name: str) -> None:
        self.producers.pop(name, None)

    async def publish(self, producer: str, messages: list[Message]) -> Position | None:
        """Write one Send as one entry; its Position, or None when dedup dropped it as a duplicate.

        A Send that fails, or is abandoned (cancelled with its stream), fails every later Send of its producer until
        the producer connects again: they came after it on the same stream (a client pipelines its Sends), and one
        of them written ahead of it would reorder the producer's messages; with dedup, the resend of the failed Send
        would then be taken for a duplicate and lost (Pulsar's client, too, resends everything pending, in order,
        after a send error)."""
        p = self.producers.get(producer)
        try:
            return await self._publish(producer, p, messages)
        except TopicError as e:
            if p is not None and p.failed is None:
                p.failed = e
            raise
        except asyncio.CancelledError:  # abandoned: its stream ended (or the broker is stopping)
            if p is not None and p.failed is None:
                p.failed = TopicError(TopicStatus.SERVICE_UNAVAILABLE, "it was abandoned with its stream")
            raise

    @staticmethod
    def _after_failure(p: Producer | None) -> None:
        if p is not None and p.failed is not None:
            raise TopicError(p.failed.status, f"an earlier Send of producer {p.name} failed ({p.failed.message}); "
                                              f"send it and every later one again, in order")

    async def _publish(self, producer: str, p: Producer | None, messages: list[Message]) -> Position | None:
        self._check_serving()
        self._after_failure(p)
        if not messages:
            raise TopicError(TopicStatus.BAD_REQUEST, "a Send holds at least one message")
        if len(messages) > self.config.batch_messages_max:
            raise TopicError(TopicStatus.BAD_REQUEST, f"a Send holds at most {self.config.batch_messages_max} messages "
                                                      f"(topic.batch_messages_max), not {len(messages)}")
        if self.held_sends or any(q.policy != bq.CONSUMER_BACKLOG_EVICTION for q in self.policies.backlog_quotas):
            await self._admit_send(p)
        seq = max(m.sequence_id for m in messages)
        if self.policies.dedup:
            while seq <= self._pushed.get(producer, -1):
                if seq <= self._persisted.get(producer, -1):
                    return None
                self._settled.clear()  # an earlier send with this sequence id is still in flight: wait for it
                try:
                    await asyncio.wait_for(self._settled.wait(), DEDUP_WAIT_MS_MAX / 1000)
                except asyncio.TimeoutError:
                    raise TopicError(TopicStatus.TIMEOUT,
                                     f"producer {producer}: sequence id {seq} is still in flight") \
                        from None
                self._check_serving()
        try:
            entry = encode_entry(messages, producer_name=producer, publish_time_ms=self._clock.wall_ms(),
                                 batch=len(messages) > 1)
        except FormatError as e:
            raise TopicError(TopicStatus.BAD_REQUEST, str(e)) from None
        if len(entry) > self.ml.entry_bytes_max:
            raise TopicError(TopicStatus.MESSAGE_TOO_LARGE,
                             f"the Send encodes to {len(entry)} bytes; at most "
                             f"{self.ml.entry_bytes_max} (topic.message_bytes_max, capped by "
                             f"broker.payload_bytes_max)")
        self._after_failure(p)  # (after the awaits above; nothing awaits from here until the append is queued)
        if self.policies.dedup:
            if len(self._pushed) >= self.config.dedup_producers_max and producer not in self._pushed:
                self._forget_one_producer()
            self._pushed[producer] = max(seq, self._pushed.get(producer, -1))
        on_confirmed = None
        if self.policies.dedup:
            def on_confirmed(_pos: Position, producer: str = producer, seq: int = seq) -> None:
                self._persisted[producer] = max(seq, self._persisted.get(producer, -1))
                self._since_snapshot += 1
                self._settled.set()
        try:
            pos = await self.ml.append(entry, on_confirmed)
        except TopicError:
            if self.policies.dedup:  # not written: a retry of the same sequence id must go through
                self._pushed[producer] = self._persisted.get(producer, -1)
                self._settled.set()
            raise
        self.messages_in += len(messages)
        self.bytes_in += len(entry)
        if p is not None:
            p.messages_in += len(messages)
            p.bytes_in += len(entry)
        if self.policies.dedup and self._since_snapshot >= self.config.dedup_snapshot_entries:
            await self._snapshot_dedup(force=False)
        return pos

    # ---- backlog quotas ----------------------------------------------------------------------------------------------
    def _durable_subscriptions(self) -> list[Subscription]:
        return [s for s in self.subscriptions.values() if s.durable]

    def _spans(self) -> list[bq.LedgerSpan]:
        return [bq.LedgerSpan(i.ledger_id, self.ml.entries_in(i.ledger_id) or 0, i.size) for i in self.ml.info.ledgers]

    def backlog_bytes(self) -> int:
        """Estimated bytes after the slowest durable subscription's mark-delete (0 without one)."""
        subs = self._durable_subscriptions()
        if not subs:
            return 0
        return bq.backlog_bytes(self._spans(), min(s.cursor.mark_delete for s in subs))

    async def _oldest_backlog_age_ms(self) -> int | None:
        """Age of the oldest message after the slowest durable mark-delete (publish time), None without one."""
        subs = self._durable_subscriptions()
        age = None
        if subs:
            pos = self.ml.next_position(min(s.cursor.mark_delete for s in subs))
            if self.ml.contains(pos):
                got = await self.ml.read(pos, 1)
                if got:
                    age = max(0, self._clock.wall_ms() - _publish_time(got[0][1]))
        self.oldest_backlog_age_ms = age
        return age

    async def _breached(self, quotas: list[bq.BacklogQuota]) -> tuple[list[bq.BacklogQuota], int, int | None]:
        """(the quotas the backlog is over, its bytes, its oldest message's age in ms)."""
        size = self.backlog_bytes()
        age = await self._oldest_backlog_age_ms() if any(q.type == bq.MESSAGE_AGE for q in quotas) else None
        return bq.breached(tuple(quotas), size, age), size, age

    def _over_quota_text(self, over: list[bq.BacklogQuota], size: int, age: int | None) -> str:
        return (f"topic {self.name}: backlog of {size} bytes" + (f", oldest message {age} ms old" if age is not None
                                                                else "")
                + f" is over the namespace's backlog quota {', '.join(q.describe() for q in over)}")

    async def _admit_send(self, p: Producer | None) -> None:
        """PRODUCER_BLOCKED_QUOTA_EXCEEDED over a producer_exception quota; wait (in order) while over a
        producer_request_hold one (module docstring); fail as soon as an earlier Send of `p` has failed."""
        quotas = [q for q in self.policies.backlog_quotas if q.policy != bq.CONSUMER_BACKLOG_EVICTION]
        over, size, age = await self._breached(quotas)
        if any(q.policy == bq.PRODUCER_EXCEPTION for q in over):
            raise TopicError(TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED, self._over_quota_text(over, size, age))
        if not over and not self.held_sends:
            return
        self.held_sends += 1
        try:
            async with self._hold_lock:
                started = self._clock.monotonic_ms()
                while True:
                    self._check_serving()
                    self._after_failure(p)
                    quotas = [q for q in self.policies.backlog_quotas if q.policy != bq.CONSUMER_BACKLOG_EVICTION]
                    over, size, age = await self._breached(quotas)
                    if any(q.policy == bq.PRODUCER_EXCEPTION for q in over):
                        raise TopicError(TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED,
                                         self._over_quota_text(over, size, age))
                    if not over:
                        return
                    waited = self._clock.monotonic_ms() - started
                    if waited >= self.config.backlog_quota_hold_ms_max:
                        raise TopicError(TopicStatus.TIMEOUT, self._over_quota_text(over, size, age)
                                         + f"; the Send was held {int(waited)} ms "
                                           f"(topic.backlog_quota_hold_ms_max)")
                    await self._clock.sleep_ms(min(self.config.backlog_quota_check_interval_ms,
                                                   self.config.backlog_quota_hold_ms_max - waited))
        finally:
            self.held_sends -= 1

    async def enforce_backlog_quotas(self) -> int:
        """consumer_backlog_eviction: move the mark-delete of the subscriptions behind the eviction point there;
        the number of entries skipped (all subscriptions)."""
        skipped = 0
        for quota in self.policies.backlog_quotas:
            if quota.policy != bq.CONSUMER_BACKLOG_EVICTION:
                continue
            subs = self._durable_subscriptions()
            if not subs:
                return skipped
            slowest = min(s.cursor.mark_delete for s in subs)
            target = None
            if quota.type == bq.DESTINATION_STORAGE:
                target = bq.size_eviction_mark_delete(self._spans(), slowest, quota.limit)
            elif bq.breached((quota,), 0, await self._oldest_backlog_age_ms()):
                cutoff = bq.age_eviction_cutoff_ms(self._clock.wall_ms(), quota.limit)
                target = await self.ml.find_newest_before(_publish_time, cutoff)
            if target is None:
                continue
            for sub in subs:
                skipped += self._skip_to(sub, target, f"backlog quota {quota.describe()}")
        self.evicted_entries += skipped
        return skipped

    def _skip_to(self, sub: Subscription, target: Position, why: str) -> int:
        """Move `sub`'s mark-delete past everything up to `target` (TTL, backlog eviction), log it and wake its
        dispatcher; the entries it skipped (0 when it was there already)."""
        before = sub.cursor.mark_delete
        if not before < target or not sub.cursor.expire_until(target):
            return 0
        n = self.ml.entries_between(before, sub.cursor.mark_delete)
        self._log(f"topic {self.name}: {why}: subscription {sub.name} skips {n} entries (mark-delete {before} -> "
                  f"{sub.cursor.mark_delete})")
        sub.wake()
        return n

    def _forget_one_producer(self) -> None:
        """Bound the dedup map: forget a producer that is not connected (the one with the lowest sequence id)."""
        idle = [p for p in self._persisted if p not in self.producers]
        if idle:
            victim = min(idle, key=lambda p: self._persisted[p])
            self._persisted.pop(victim, None)
            self._pushed.pop(victim, None)
            self._log(f"topic {self.name}: dedup forgets producer {victim} (topic.dedup_producers_max)")

    async def _load_dedup(self) -> None:
        cursor = await self._open_cursor(DEDUP_CURSOR, "earliest", True)
        self._dedup_cursor = cursor
        self._persisted = {k: int(v) for k, v in cursor.properties.items()}
        md = cursor.mark_delete
        replayed = 0
        for ledger_id in self.ml.ledger_ids():  # the entries after the snapshot, headers only
            if ledger_id < md.ledger:
                continue
            entry_id = md.entry + 1 if ledger_id == md.ledger else 0
            count = self.ml.entries_in(ledger_id) or 0
            while entry_id < count:
                got = await self.ml.read(Position(ledger_id, entry_id), 500)
                if not got:
                    break
                for _, entry in got:
                    try:
                        h = read_header(entry)
                    except FormatError:
                        continue
                    if h.highest_sequence_id > self._persisted.get(h.producer_name, -1):
                        self._persisted[h.producer_name] = h.highest_sequence_id
                    replayed += 1
                entry_id = got[-1][0].entry + 1
        self._pushed = dict(self._persisted)
        self._log(f"topic {self.name}: dedup state of {len(self._persisted)} producers (replayed {replayed} entries)")

    async def _snapshot_dedup(self, *, force: bool) -> None:
        """The persisted ids (complete up to last_confirmed: they are recorded as entries are confirmed) as the
        dedup cursor's properties, its mark-delete at last_confirmed; written by the cursor's next persist."""
        cursor = self._dedup_cursor
        if cursor is None or self.ml.last_confirmed.entry < 0:
            return
        for name, seq in self._persisted.items():
            cursor.set_property(name, seq)
        cursor.ack_cumulative(self.ml.last_confirmed)
        self._since_snapshot = 0
        if force:
            await cursor.persist(force=True)

    # ---- subscriptions -----------------------------------------------------------------------------------------
    async def subscribe(self, sub_name: str, sub_type: str, initial_position: str, consumer_name: str,
                        priority: int, sink: ConsumerSink, hash_ranges: list[tuple[int, int]] | None = None):
        """`hash_ranges`: a sticky Key_Shared consumer's key slots (Subscription.add_consumer)."""
        self._check_serving()
        if sub_name == DEDUP_CURSOR:
            raise TopicError(TopicStatus.BAD_REQUEST, f"subscription name {DEDUP_CURSOR!r} is reserved")
        async with self._sub_lock:
            existing = self.subscriptions.get(sub_name)
            if existing is not None and not existing.durable:
                raise TopicError(TopicStatus.NOT_ALLOWED, f"{sub_name} is a reader's (non-durable) subscription "
                                                          f"of {self.name}; a consumer needs a name of its own")
            sub = self.subscriptions.get(sub_name)
            if sub is None:
                if len(self.subscriptions) >= self.config.subscriptions_per_topic_max:
                    raise TopicError(TopicStatus.TOO_MANY_REQUESTS,
                                     f"topic {self.name} has {len(self.subscriptions)} "
                                     f"subscriptions (topic.subscriptions_per_topic_max)")
                cursor = await self._open_cursor(sub_name, initial_position, True)
                sub = self._subscription(sub_name, sub_type, cursor)
                self.subscriptions[sub_name] = sub
                self._log(f"topic {self.name}: subscription {sub_name} ({sub_type}) created at "
                          f"{cursor.mark_delete} ({initial_position})")
        return sub, sub.add_consumer(consumer_name, priority, sink, sub_type, hash_ranges)

    async def create_reader(self, sub_name: str, consumer_name: str, sink: ConsumerSink, *,
                            message_id: MessageId | None, initial_position: str, inclusive: bool):
        """A reader: an Exclusive subscription over a NonDurableCursor starting as non_durable_cursor.py says
        (BAD_REQUEST for a malformed or unknown start message id). `sub_name` "" = "reader-<10 hex>"."""
        self._check_serving()
        if not sub_name:
            self._reader_seq += 1
            sub_name = f"{READER_NAME_PREFIX}{(self.loaded_ms * 1000 + self._reader_seq) & 0xFF_FFFF_FFFF:010x}"
        if sub_name == DEDUP_CURSOR:
            raise TopicError(TopicStatus.BAD_REQUEST, f"subscription name {DEDUP_CURSOR!r} is reserved")
        md, skip_position, skip = reader_start(self.ml, message_id=message_id, initial=initial_position,
                                               inclusive=inclusive)
        async with self._sub_lock:
            existing = self.subscriptions.get(sub_name)
            if existing is not None:
                if existing.durable:
                    raise TopicError(TopicStatus.NOT_ALLOWED, f"{self.name} has a durable subscription {sub_name}; "
                                                              f"a reader needs a name of its own")
                raise TopicError(TopicStatus.CONSUMER_BUSY, f"reader {sub_name} is already connected to {self.name}")
            if len(self.subscriptions) >= self.config.subscriptions_per_topic_max:
                raise TopicError(TopicStatus.TOO_MANY_REQUESTS,
                                 f"topic {self.name} has {len(self.subscriptions)} "
                                 f"subscriptions and readers (topic.subscriptions_per_topic_max)")
            cursor = NonDurableCursor(self.ml, sub_name, config=self.config, mark_delete=md,
                                      skip_position=skip_position, skip_indexes=skip, log=self._log)
            sub = self._subscription(sub_name, "Exclusive", cursor, durable=False)
            self.subscriptions[sub_name] = sub
        self._log(f"topic {self.name}: reader {sub_name} starts after {md}"
                  + (f" (skipping batch indexes {sorted(skip)} of {skip_position})" if skip_position else ""))
        return sub, sub.add_consumer(consumer_name, 0, sink, "Exclusive")

    async def remove_consumer(self, sub: Subscription, consumer) -> None:
        """A consumer left; a reader's subscription goes with its reader."""
        sub.remove_consumer(consumer)
        if not sub.durable and not sub.consumers and self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
            await sub.close()

    async def unsubscribe(self, sub_name: str) -> None:
        sub = self.subscriptions.get(sub_name)
        if sub is None:
            raise TopicError(TopicStatus.SUBSCRIPTION_NOT_FOUND, f"topic {self.name} has no subscription {sub_name!r}")
        if sub.consumers:
            raise TopicError(TopicStatus.NOT_ALLOWED, f"subscription {sub_name} still has consumers")
        await sub.close()
        await sub.cursor.delete()
        del self.subscriptions[sub_name]

    async def seek_to_time(self, sub: Subscription, publish_time_ms: int) -> Position:
        before = await self.ml.find_newest_before(_publish_time, publish_time_ms)
        target = self.ml.first_position() if before is None else self.ml.next_position(before)
        await sub.seek(target)
        return target

    # ---- maintenance ---------------------------------------------------------------------------------------------
    async def _maintain(self) -> None:
        interval = min(self.config.trim_interval_ms, 1_000)
        last_trim = last_quota_check = self._clock.monotonic_ms()
        while self.fenced is None:
            await self._clock.sleep_ms(min(interval, self.config.backlog_quota_check_interval_ms))
            self._sample_rates()
            try:
                self.ml.check_rollover()
                if self._clock.monotonic_ms() - last_quota_check >= self.config.backlog_quota_check_interval_ms:
                    last_quota_check = self._clock.monotonic_ms()
                    if self.policies.backlog_quotas:
                        await self.enforce_backlog_quotas()
                        await self._oldest_backlog_age_ms()
                if self._clock.monotonic_ms() - last_trim >= self.config.trim_interval_ms:
                    last_trim = self._clock.monotonic_ms()
                    await self.run_trim()
            except TopicError as e:
                self._log(f"topic {self.name}: maintenance: {e}")
                if e.status is TopicStatus.TOPIC_FENCED:
                    await self.fence(e.message)

    async def run_trim(self) -> list[int]:
        """TTL first (cursors move past expired messages), then retention trimming below the slowest cursor's
        persisted mark-delete (TTL and acks free ledgers once the cursors have persisted them)."""
        ttl_ms = self.policies.ttl_ms
        if ttl_ms > 0:
            now_ms = self._clock.wall_ms()
            newest = await self.ml.find_newest_before(_publish_time, now_ms - ttl_ms)
            if newest is not None:
                for sub in self._durable_subscriptions():
                    n = self._skip_to(sub, newest, f"TTL {ttl_ms} ms")
                    if n:
                        sub.expired_entries += n
                        sub.last_expire_ms = now_ms
        cursors = [s.cursor for s in self.subscriptions.values() if s.durable]  # readers hold nothing back
        if self._dedup_cursor is not None:
            cursors.append(self._dedup_cursor)
        slowest = min((c.persisted_mark_delete for c in cursors), default=None)
        return await self.ml.trim(slowest, retention_ms=self.policies.retention_ms,
                                  retention_bytes=self.policies.retention_bytes)

    def _sample_rates(self) -> None:
        """Rates over the last maintenance interval (about a second), as Pulsar's stats report them."""
        now = self._clock.monotonic_ms()
        counters = {"in": self.messages_in, "bin": self.bytes_in,
                    **{f"out:{n}": s.messages_out for n, s in self.subscriptions.items()},
                    **{f"bout:{n}": s.bytes_out for n, s in self.subscriptions.items()}}
        last = self._rate_sample
        if last is not None and now > last[0]:
            dt = (now - last[0]) / 1000
            self.rates = {k: (v - last[1].get(k, 0)) / dt for k, v in counters.items()}
        self._rate_sample = (now, counters)

    def _check_serving(self) -> None:
        if self.fenced is not None:
            raise self.fenced
        if self.ml.state is ManagedLedgerState.FENCED:
            raise TopicError(TopicStatus.TOPIC_FENCED,
                             f"topic {self.name} is fenced on this broker: {self.ml.fence_reason}")
        if self.closing or self.ml.state is ManagedLedgerState.CLOSED:
            raise TopicError(TopicStatus.NOT_OWNER,
                             f"topic {self.name} is unloading from this broker; look it up again")

    # ---- stats ---------------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        rates = self.rates
        subs = {}
        for name, sub in sorted(self.subscriptions.items()):
            subs[name] = sub.stats() | {"msgRateOut": round(rates.get(f"out:{name}", 0.0), 1),
                                        "msgThroughputOut": round(rates.get(f"bout:{name}", 0.0), 1)}
        return {
            "topic": str(self.name),
            "msgRateIn": round(rates.get("in", 0.0), 1),
            "msgThroughputIn": round(rates.get("bin", 0.0), 1),
            "msgRateOut": round(sum(v for k, v in rates.items() if k.startswith("out:")), 1),
            "msgThroughputOut": round(sum(v for k, v in rates.items() if k.startswith("bout:")), 1),
            "msgInCounter": self.messages_in,
            "bytesInCounter": self.bytes_in,
            "msgOutCounter": sum(s.messages_out for s in self.subscriptions.values()),
            "bytesOutCounter": sum(s.bytes_out for s in self.subscriptions.values()),
            "storageSize": self.ml.total_size,
            "backlogSize": max((s["msgBacklog"] for s in subs.values()), default=0),
            "publishers": [{"producerName": p.name, "msgInCounter": p.messages_in, "bytesInCounter": p.bytes_in,
                            "connectedSince": p.connected_ms} for p in self.producers.values()],
            "subscriptions": subs,
            "deduplicationStatus": "Enabled" if self.policies.dedup else "Disabled",
            "backlogQuotas": bq.quotas_to_json(self.policies.backlog_quotas),
            "estimatedBacklogSizeBytes": self.backlog_bytes(),
            "oldestBacklogMessageAgeMs": self.oldest_backlog_age_ms,
            "heldSends": self.held_sends,
            "backlogEvictedEntries": self.evicted_entries,
            "loadedSince": self.loaded_ms,
        }

    def stats_internal(self) -> dict:
        out = self.ml.stats_internal()
        out["cursors"] = {name: sub.cursor.stats_internal() for name, sub in sorted(self.subscriptions.items())}
        if self._dedup_cursor is not None:
            out["cursors"][DEDUP_CURSOR] = self._dedup_cursor.stats_internal()
        return out


def _publish_time(entry: bytes) -> int:
    try:
        return read_header(entry).publish_time_ms
    except FormatError:
        return 0


async def _close_cursor(cursor, log) -> None:
    try:
        await cursor.close()
    except TopicError as e:
        log(f"cursor not closed cleanly: {e}")
