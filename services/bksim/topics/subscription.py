"""A subscription: one cursor (durable, or a reader's non-durable one), its consumers and the dispatcher of its type (PROTOCOL.md §5).

Owns: the consumers (with their flow-control permits and the messages they hold unacknowledged), the replay
set (positions to deliver again: negative acks, ack timeouts, departed consumers, Key_Shared holds), and the
dispatch loop that reads from the managed ledger at the cursor's read position.

Rules:
- the broker never sends a consumer more messages than its permits (permits count messages; a batch counts
  all its messages). One exception keeps a subscription from stalling: a batch larger than anything the
  consumer could ever grant is sent once the consumer has its whole queue free (permits == its largest grant);
- Exclusive: one consumer, a second gets CONSUMER_BUSY. Failover: consumers ordered by (priority, name); the
  active one is index (partition mod count) (index 0 for a non-partitioned topic); on a switch the old active
  consumer's unacknowledged messages go to the new one after `failover_switch_delay_ms`;
- Shared: round-robin over consumers with permits; a departing consumer's unacknowledged messages are
  delivered to the others;
- Key_Shared: a key goes to the consumer owning Murmur3(key) on a consistent-hash ring (replica points per
  consumer). When membership changes a key moves only after its in-flight messages are acknowledged: while
  its old consumer still holds some, its new messages wait in the replay set, so per-key order holds;
- every (re)delivery carries the cursor's redelivery count, which the cursor persists;
- cumulative acks are refused on Shared and Key_Shared (NOT_ALLOWED); acks of ids the topic does not hold are
  INVALID_ACK;
- a reset of the read position (a seek, or the rewind when the last consumer leaves) discards the dispatch read
  in flight: its entries are not delivered and it does not move the read position, which would skip from the
  reset target to the end of that read (Pulsar cancels pending reads on a cursor reset). No read starts while
  a seek is being persisted;
- a non-durable subscription (a reader, topics/non_durable_cursor.py) is Exclusive and acknowledges each entry
  as it dispatches it (cumulatively, in memory: Pulsar's reader acknowledges every message it returns), so it
  holds nothing unacknowledged and only its permits bound it;
- delayed delivery (topics/delayed_delivery.py): on Shared and Key_Shared a message whose delivery time has
  not come is held by the subscription's tracker instead of being sent, and goes to the replay set when it
  comes due (a timer wakes the dispatcher then); at the tracker's bound the dispatcher reads no further. A
  seek or rewind forgets the tracker (the re-read rebuilds it). Exclusive, Failover and readers ignore the
  delivery time (as in Pulsar).
"""
from __future__ import annotations

import asyncio
import bisect
import collections
from dataclasses import dataclass, field
from typing import Callable, Protocol

from bksim.topics.delayed_delivery import DelayedDeliveryTracker
from bksim.topics.errors import TopicError
from bksim.topics.managed_ledger import ManagedLedgerState
from bksim.topics.positions import Position
from bksim.topics.sticky_ranges import StickyRanges, check_ranges, slot_of
from bksim.formats.message import read_header
from bksim.formats.murmur3 import murmur3_32
from bksim.model.config import TopicConfig
from bksim.model.errors import FormatError
from bksim.model.status import TopicStatus
from bksim.ports.clock import Clock

TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")
REPLAY_MAX_FACTOR = 20  # the replay set holds at most this many dispatcher reads' worth of entries


@dataclass(frozen=True, slots=True)
class Delivery:
    position: Position
    entry: bytes
    redelivery_count: int
    acked_batch_indexes: tuple[int, ...]


class ConsumerSink(Protocol):
    def deliver(self, deliveries: list[Delivery]) -> None: ...
    def active_changed(self, active: bool) -> None: ...
    def drop(self, error: TopicError) -> None: ...


@dataclass(eq=False)
class Consumer:
    name: str
    priority: int
    sink: ConsumerSink
    order: int                                   # connection order
    permits: int = 0
    permits_max: int = 0                         # largest number of permits it ever had at once
    pending: dict[Position, int] = field(default_factory=dict)   # delivered, unacknowledged -> message count
    unacked_messages: int = 0
    messages_out: int = 0
    bytes_out: int = 0
    redelivered: int = 0
    active: bool | None = None
    connected_ms: int = 0

    def take(self, n: int) -> bool:
        """Whether a batch of `n` messages may go to this consumer now."""
        return self.permits >= n or (self.permits > 0 and self.permits >= self.permits_max)


class _Ring:
    """Key_Shared consistent-hash ring: `points` positions per consumer at Murmur3(name + index)."""

    def __init__(self, points: int) -> None:
        self._points = points
        self._hashes: list[int] = []
        self._owners: list[Consumer] = []

    def rebuild(self, consumers: list[Consumer]) -> None:
        ring = sorted(((murmur3_32(f"{c.name}{i}"), c.name, c) for c in consumers for i in range(self._points)),
                      key=lambda t: (t[0], t[1]))
        self._hashes = [h for h, _, _ in ring]
        self._owners = [c for _, _, c in ring]

    def select(self, key_hash: int) -> Consumer | None:
        if not self._hashes:
            return None
        i = bisect.bisect_left(self._hashes, key_hash)
        return self._owners[i if i < len(self._owners) else 0]


class Subscription:
    def __init__(self, *, topic: str, name: str, sub_type: str, cursor, ml, clock: Clock,
                 config: TopicConfig = TopicConfig(), partition: int = -1,
                 log: Callable[[str], None] = lambda line: None, durable: bool = True) -> None:
        if sub_type not in TYPES:
            raise TopicError(TopicStatus.BAD_REQUEST, f"subscription type {sub_type!r} is not one of {list(TYPES)}")
        self.topic = topic
        self.name = name
        self.type = sub_type
        self.cursor = cursor
        self.ml = ml
        self._clock = clock
        self.config = config
        self.partition = partition
        self._log = log
        self.durable = durable
        self.consumers: list[Consumer] = []
        self._order = 0
        self._replay: list[Position] = []                    # sorted positions to deliver again
        self._replay_set: set[Position] = set()
        self._entry_hash: dict[Position, int] = {}          # Key_Shared: key hash of replayed/pending entries
        self._hash_holder: dict[int, tuple[Consumer, int]] = {}   # Key_Shared: hash -> (consumer, in-flight count)
        self._ring = _Ring(config.key_shared_replica_points)
        self._sticky: StickyRanges | None = None   # Key_Shared sticky mode (while its consumers are connected)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._active: Consumer | None = None
        self._switch_not_before = 0.0
        self._last_order = 0  # Shared: the consumer served last (round robin)
        self._epoch = 0       # moves on every read-position reset: a read started under an older one is stale
        self._seeking = 0     # seeks under way (no dispatch read starts meanwhile)
        self.messages_out = 0
        self.expired_entries = 0     # entries the TTL moved this subscription past (on this broker, since load)
        self.last_expire_ms = 0      # wall time of the last such move (0: none)
        self.bytes_out = 0
        self.closed = False
        self.idle = False
        self._delayed = DelayedDeliveryTracker(config.delayed_messages_per_subscription_max)
        self._delay_timer: tuple[int, asyncio.Task] | None = None   # (wall time it wakes at, task)
        self._delay_full_logged = False
        ml.add_listener(self.wake)

    # ---- consumers ---------------------------------------------------------------------------------------------
    def add_consumer(self, name: str, priority: int, sink: ConsumerSink, sub_type: str,
                     hash_ranges: list[tuple[int, int]] | None = None) -> Consumer:
        """`hash_ranges`: a Key_Shared consumer in sticky mode and the key slots it takes (topics/sticky_ranges.py);
        None = auto split. Every consumer of a subscription uses one mode (CONSUMER_ASSIGN_ERROR otherwise)."""
        if self.closed:
            raise TopicError(TopicStatus.SERVICE_UNAVAILABLE, f"subscription {self.name} is closing")
        if not self.durable and sub_type != "Exclusive":
            raise TopicError(TopicStatus.BAD_REQUEST, f"reader {self.name} is Exclusive, not {sub_type}")
        if sub_type != self.type:
            if self.consumers:
                raise TopicError(TopicStatus.NOT_ALLOWED, f"subscription {self.name} is {self.type} with consumers "
                                                          f"connected; a {sub_type} consumer cannot join it")
            self.type = sub_type  # Pulsar lets the type change while nobody is connected
        if self.type == "Exclusive" and self.consumers:
            raise TopicError(TopicStatus.CONSUMER_BUSY, f"exclusive subscription {self.name} already has consumer "
                                                        f"{self.consumers[0].name}")
        if len(self.consumers) >= self.config.consumers_per_subscription_max:
            raise TopicError(TopicStatus.TOO_MANY_REQUESTS,
                             f"subscription {self.name} has {len(self.consumers)} consumers "
                             f"(topic.consumers_per_subscription_max)")
        if any(c.name == name for c in self.consumers):
            raise TopicError(TopicStatus.CONSUMER_BUSY,
                             f"a consumer named {name!r} is already connected to {self.name}")
        ranges = None
        if hash_ranges is not None:
            if self.type != "Key_Shared":
                raise TopicError(TopicStatus.BAD_REQUEST, f"hash ranges are for Key_Shared consumers, not {self.type}")
            ranges = check_ranges(hash_ranges, self.config.key_shared_sticky_ranges_max)
        if self.type == "Key_Shared" and self.consumers and (self._sticky is not None) != (ranges is not None):
            mode = "sticky" if self._sticky is not None else "auto-split"
            raise TopicError(TopicStatus.CONSUMER_ASSIGN_ERROR, f"Key_Shared subscription {self.name} has {mode} "
                                                                f"consumers connected: a consumer must use that mode")
        self._order += 1
        consumer = Consumer(name, priority, sink, self._order, connected_ms=self._clock.wall_ms())
        if ranges is not None:
            sticky = self._sticky if self._sticky is not None else StickyRanges()
            sticky.add(name, consumer, ranges)  # CONSUMER_ASSIGN_ERROR on overlap: nothing changed
            self._sticky = sticky
        self.consumers.append(consumer)
        self._membership_changed()
        self._ensure_task()
        self.wake()
        return consumer

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if self._sticky is not None:
            self._sticky.remove(consumer)
            if not self.consumers:
                self._sticky = None
        self._return_pending(consumer, list(consumer.pending))
        if not self.consumers:
            # nobody left: forget the replay set; the next consumer starts again after the mark-delete position
            self._replay.clear()
            self._replay_set.clear()
            self._entry_hash.clear()
            self._hash_holder.clear()
            self._delayed.clear()
            self._epoch += 1
            self.cursor.rewind()
        self._membership_changed()
        self.wake()

    def _membership_changed(self) -> None:
        if self.type == "Key_Shared":
            self._ring.rebuild(self.consumers)
        if self.type in ("Exclusive", "Failover"):
            self._pick_active()

    def _pick_active(self) -> None:
        if not self.consumers:
            self._active = None
            return
        ordered = sorted(self.consumers, key=lambda c: (c.priority, c.name))
        if self.type == "Failover":
            top = [c for c in ordered if c.priority == ordered[0].priority]
            chosen = top[(self.partition if self.partition >= 0 else 0) % len(top)]
        else:
            chosen = ordered[0]
        previous = self._active
        self._active = chosen
        if previous is not chosen and previous is not None and previous in self.consumers:
            # the old active consumer's unacknowledged messages go to the new one, after a delay so its
            # in-flight acks can land first
            self._return_pending(previous, list(previous.pending))
            self._switch_not_before = self._clock.monotonic_ms() + self.config.failover_switch_delay_ms
        for c in self.consumers:  # every consumer learns whether it is active (a joining one too)
            active = c is chosen
            if c.active is not active:
                c.active = active
                c.sink.active_changed(active)

    def flow(self, consumer: Consumer, permits: int) -> None:
        if permits <= 0 or permits > 1_000_000:
            raise TopicError(TopicStatus.BAD_REQUEST, f"flow permits must be 1..1000000, not {permits}")
        consumer.permits += permits
        consumer.permits_max = max(consumer.permits_max, consumer.permits)
        self.wake()

    # ---- acks and redelivery ----------------------------------------------------------------------------------
    def ack(self, consumer: Consumer, ids: list[tuple[Position, "int | tuple[int, ...]", int]],
            cumulative: bool) -> None:
        """ids: (position, batch index or -1, batch size); the batch index may be a tuple of indexes of the same
        batch entry (an ack set), applied at once. Raises TopicError (NOT_ALLOWED, INVALID_ACK)."""
        if not ids:
            return
        acks: list[tuple[Position, tuple[int, ...], int]] = []  # every id as a tuple of its indexes ((-1,): whole)
        for pos, batch_index, batch_size in ids:
            indexes = (batch_index,) if type(batch_index) is int else tuple(batch_index)
            self.cursor.check(pos)  # INVALID_ACK unless the topic holds it or it is at or before the mark-delete
            if not indexes or min(indexes) < (-1 if len(indexes) == 1 else 0):  # nothing of the ack is applied
                what = f"batch index {min(indexes)}" if indexes else "an empty ack set"
                raise TopicError(TopicStatus.INVALID_ACK, f"{what} of {pos}: -1 (the whole entry) or 0..batch "
                                                          f"size-1")
            acks.append((pos, indexes, batch_size))
        if cumulative:
            if self.type in ("Shared", "Key_Shared"):
                raise TopicError(TopicStatus.NOT_ALLOWED, f"cumulative ack is not allowed on {self.type} subscription "
                                                          f"{self.name}: acknowledge messages individually")
            if len(acks) != 1 or len(acks[0][1]) != 1:
                raise TopicError(TopicStatus.BAD_REQUEST, "a cumulative ack names exactly one message")
            pos, (batch_index,), batch_size = acks[0]
            if batch_index >= 0:
                if batch_index == batch_size - 1:
                    self.cursor.ack_cumulative(pos)
                else:
                    self.cursor.ack_cumulative(self.ml.previous_position(pos))
                    self.cursor.ack_batch_indexes(pos, range(batch_index + 1), batch_size)
            else:
                self.cursor.ack_cumulative(pos)
            for c in self.consumers:
                for p in [p for p in c.pending if p <= pos and self.cursor.is_acked(p)]:
                    self._settle(c, p)
        else:
            for pos, indexes, batch_size in acks:
                if indexes[0] >= 0:
                    if batch_size <= 0 or max(indexes) >= batch_size:
                        raise TopicError(TopicStatus.INVALID_ACK,
                                         f"batch index {max(indexes)} of {pos} is outside a batch "
                                         f"of {batch_size}")
                    if not self.cursor.ack_batch_indexes(pos, indexes, batch_size):
                        continue
                else:
                    self.cursor.ack([pos])
                    self._delayed.discard(pos)
                owner = consumer if pos in consumer.pending else next(
                    (c for c in self.consumers if pos in c.pending), None)
                if owner is not None:
                    self._settle(owner, pos)
        self.wake()

    def _settle(self, consumer: Consumer, pos: Position) -> None:
        count = consumer.pending.pop(pos, None)
        if count is None:
            return
        consumer.unacked_messages -= count
        h = self._entry_hash.pop(pos, None)
        if h is not None:
            holder = self._hash_holder.get(h)
            if holder is not None:
                if holder[1] <= 1:
                    del self._hash_holder[h]
                else:
                    self._hash_holder[h] = (holder[0], holder[1] - 1)

    def redeliver(self, consumer: Consumer, positions: list[Position] | None) -> None:
        """Negative ack / ack timeout: deliver again (redelivery count + 1). None = all it holds."""
        chosen = list(consumer.pending) if positions is None else [p for p in positions if p in consumer.pending]
        self._return_pending(consumer, chosen)
        self.wake()

    def _return_pending(self, consumer: Consumer, positions: list[Position]) -> None:
        for pos in positions:
            h = self._entry_hash.get(pos)
            self._settle(consumer, pos)
            if self.cursor.is_acked(pos):
                continue
            self.cursor.increment_redelivery(pos)
            consumer.redelivered += 1
            if h is not None:
                self._entry_hash[pos] = h
            self._add_replay(pos)

    def _add_replay(self, pos: Position) -> None:
        if pos not in self._replay_set:
            self._replay_set.add(pos)
            bisect.insort(self._replay, pos)

    async def seek(self, pos: Position) -> None:
        """Reset the cursor: the next message delivered is `pos`; holds and replays are forgotten, and so is a
        dispatch read in flight."""
        self._epoch += 1
        self._seeking += 1
        try:
            await self.cursor.seek(pos)
        finally:
            self._seeking -= 1
        self._replay.clear()
        self._replay_set.clear()
        self._entry_hash.clear()
        self._hash_holder.clear()
        self._delayed.clear()
        for c in self.consumers:
            c.pending.clear()
            c.unacked_messages = 0
        self.wake()

    # ---- dispatch ------------------------------------------------------------------------------------------------
    def wake(self) -> None:
        self.idle = False
        self._wake.set()

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self, error: TopicError | None = None) -> None:
        self.closed = True
        self.ml.remove_listener(self.wake)
        if self._delay_timer is not None:
            self._delay_timer[1].cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for c in list(self.consumers):
            if error is not None:
                c.sink.drop(error)
        self.consumers.clear()

    async def _run(self) -> None:
        while not self.closed:
            self._wake.clear()
            try:
                progressed = await self._dispatch_once()
            except TopicError as e:
                self._log(f"subscription {self.name} of {self.topic}: dispatch failed ({e}); retrying")
                progressed = False
                await self._clock.sleep_ms(200)
                continue
            if not progressed:
                if self._switch_not_before > self._clock.monotonic_ms():
                    await self._clock.sleep_ms(self._switch_not_before - self._clock.monotonic_ms())
                    continue
                self.idle = True  # nothing to send until something changes (tests wait on this)
                await self._wake.wait()
                self.idle = False

    def _subscription_unacked(self) -> int:
        return sum(c.unacked_messages for c in self.consumers)

    def _any_permits(self) -> bool:
        return any(c.permits > 0 and c.unacked_messages < self.config.consumer_unacked_max for c in self.consumers)

    async def _read_positions(self, positions: list[Position]) -> list[tuple[Position, bytes]]:
        """Entries at scattered positions (the replay set), reading contiguous runs together."""
        out: list[tuple[Position, bytes]] = []
        i = 0
        while i < len(positions):
            j = i
            while (j + 1 < len(positions) and positions[j + 1].ledger == positions[i].ledger
                   and positions[j + 1].entry == positions[j].entry + 1):
                j += 1
            out += await self.ml.read(positions[i], j - i + 1)
            i = j + 1
        return out

    def _deliver(self, out: dict[int, list[Delivery]]) -> None:
        by_order = {c.order: c for c in self.consumers}
        for order, deliveries in out.items():
            consumer = by_order.get(order)
            if consumer is not None and deliveries:
                consumer.sink.deliver(deliveries)
        out.clear()

    async def _dispatch_once(self) -> bool:
        if not self.consumers or self.ml.state is ManagedLedgerState.FENCED or self._seeking:
            return False
        if self._switch_not_before > self._clock.monotonic_ms():
            return False
        if self._subscription_unacked() >= self.config.subscription_unacked_max or not self._any_permits():
            return False
        n = self.config.dispatch_read_entries_max
        epoch = self._epoch
        out: dict[int, list[Delivery]] = collections.defaultdict(list)
        blocked: set[int] = set()       # Key_Shared hashes that must wait in this pass (order per key)
        sent = False
        delays = self._delays()
        now = self._clock.wall_ms()
        if delays and len(self._replay) < n * REPLAY_MAX_FACTOR:
            for pos in self._delayed.pop_due(now, n * REPLAY_MAX_FACTOR - len(self._replay)):
                self._add_replay(pos)  # its time has come: delivered like a redelivery
        # 1. the replay set, oldest first
        if self._replay:
            live = []
            for pos in self._replay:
                if self.cursor.is_acked(pos) or not self.ml.contains(pos):
                    self._replay_set.discard(pos)
                    self._entry_hash.pop(pos, None)
                else:
                    live.append(pos)
            self._replay = live
            delivered: set[Position] = set()
            got = await self._read_positions(live)
            if self._epoch != epoch:
                return True  # the read position was reset meanwhile: this read is stale; dispatch again
            for pos, entry in got:
                consumer, count, h = self._choose(pos, entry, blocked)
                if consumer is None:
                    if self.type != "Key_Shared":
                        break  # keep the order: nothing later goes before it
                    continue
                self._send(consumer, pos, entry, count, h, out)
                delivered.add(pos)
                sent = True
            if delivered:
                self._replay = [p for p in self._replay if p not in delivered]
                self._replay_set -= delivered
            self._deliver(out)  # before the next read: a reset during it must find nothing undelivered
        # 2. new entries from the read position
        room = n * REPLAY_MAX_FACTOR - len(self._replay)
        if room > 0 and self._any_permits() and (self.type == "Key_Shared" or not self._replay):
            start = self._normalized_read_position()
            if start is not None:
                entries = await self.ml.read(start, min(n, room))
                if self._epoch != epoch:
                    return True  # stale, as above
                next_read = None
                for pos, entry in entries:
                    if self.cursor.is_acked(pos):
                        next_read = pos
                        continue
                    if delays:
                        at = _deliver_at(entry)
                        if at > now:
                            if not self._delayed.add(pos, at):
                                self._log_delayed_full()
                                break  # the tracker is full: read no further until some come due
                            next_read = pos
                            continue
                    consumer, count, h = self._choose(pos, entry, blocked)
                    if consumer is None:
                        if self.type != "Key_Shared":
                            break
                        if h is not None:
                            self._entry_hash[pos] = h
                        self._add_replay(pos)  # held: delivered from the replay set, in order, later
                        next_read = pos
                        continue
                    self._send(consumer, pos, entry, count, h, out)
                    next_read = pos
                    sent = True
                if next_read is not None:
                    self.cursor.read_position = self.ml.next_position(next_read)
                    sent = True
        self._deliver(out)
        if delays:
            self._arm_delay_timer(now)
        return sent

    def _delays(self) -> bool:
        """Whether this subscription holds delayed messages (see the module docstring)."""
        return self.durable and self.type in ("Shared", "Key_Shared") and self.config.delayed_delivery_enabled

    def _arm_delay_timer(self, now: int) -> None:
        """Wake the dispatcher when the earliest held message comes due (one timer; re-armed when that changes).
        A message already due waits for permits instead: flow() wakes the dispatcher."""
        due = self._delayed.next_due_ms()
        if self._delay_timer is not None:
            if due is not None and self._delay_timer[0] == due and not self._delay_timer[1].done():
                return
            self._delay_timer[1].cancel()
            self._delay_timer = None
        if due is None or due <= now or self.closed:
            return

        async def fire(delay_ms: int) -> None:
            await self._clock.sleep_ms(delay_ms)
            self.wake()

        self._delay_timer = (due, asyncio.get_running_loop().create_task(fire(due - now)))

    def _log_delayed_full(self) -> None:
        if not self._delay_full_logged:
            self._delay_full_logged = True
            self._log(f"subscription {self.name} of {self.topic}: {len(self._delayed)} delayed messages held "
                      f"(topic.delayed_messages_per_subscription_max); reading no further until some come due")

    def _normalized_read_position(self) -> Position | None:
        """The cursor's read position moved onto an existing entry, or None when it is past the last one."""
        pos = self.cursor.read_position
        last = self.ml.last_confirmed
        if pos > last:
            return None
        if self.ml.contains(pos):
            return pos
        if pos.ledger not in self.ml.ledger_ids() or pos.entry < 0:
            first = self.ml.first_position()
            pos = first if pos < first else self.ml.next_position(self.ml.previous_position(pos))
        else:
            pos = self.ml.next_position(Position(pos.ledger, (self.ml.entries_in(pos.ledger) or 0) - 1))
        if not self.ml.contains(pos):
            return None
        self.cursor.read_position = pos
        return pos

    def _choose(self, pos: Position, entry: bytes, blocked: set[int]) -> tuple[Consumer | None, int, int | None]:
        """The consumer that gets this entry now (None = it must wait), its message count, its key hash."""
        try:
            header = read_header(entry)
            count, key = header.num_messages, header.sticky_key
        except FormatError:
            count, key = 1, None  # not a message entry (written by hand into a ledger): delivered as one message
        limit = self.config.consumer_unacked_max
        if self.type in ("Exclusive", "Failover"):
            c = self._active
            ok = c is not None and c.take(count) and c.unacked_messages < limit
            return (c if ok else None), count, None
        if self.type == "Shared":
            ready = [c for c in self.consumers if c.take(count) and c.unacked_messages < limit]
            if not ready:
                return None, count, None
            best = min(c.priority for c in ready)  # round robin within the best priority level that has room
            ready = sorted((c for c in ready if c.priority == best), key=lambda c: c.order)
            chosen = next((c for c in ready if c.order > self._last_order), ready[0])
            self._last_order = chosen.order
            return chosen, count, None
        h = murmur3_32(key or "")
        if h in blocked:
            return None, count, h
        target = self._sticky.select(slot_of(h)) if self._sticky is not None else self._ring.select(h)
        holder = self._hash_holder.get(h)
        if holder is not None and holder[0] is not target and holder[0] in self.consumers:
            blocked.add(h)  # the key's in-flight messages are still with its previous consumer
            return None, count, h
        if target is None or not target.take(count) or target.unacked_messages >= limit:
            blocked.add(h)
            return None, count, h
        return target, count, h

    def _send(self, consumer: Consumer, pos: Position, entry: bytes, count: int, h: int | None, out) -> None:
        consumer.permits -= count
        if not self.durable:  # a reader: consumed as it is sent (see the module docstring)
            delivery = Delivery(pos, entry, 0, tuple(self.cursor.acked_batch_indexes(pos)))
            # INVALID_ACK: its ledger was trimmed while it was read (retention ignores readers); the read returned
            # it, so it is sent all the same, and the reader goes on at the first entry left
            try:
                self.cursor.ack_cumulative(pos)
            except TopicError as e:
                if e.status is not TopicStatus.INVALID_ACK:
                    raise
            consumer.messages_out += count
            consumer.bytes_out += len(entry)
            self.messages_out += count
            self.bytes_out += len(entry)
            out[consumer.order].append(delivery)
            return
        consumer.pending[pos] = count
        consumer.unacked_messages += count
        consumer.messages_out += count
        consumer.bytes_out += len(entry)
        self.messages_out += count
        self.bytes_out += len(entry)
        if h is not None:
            self._entry_hash[pos] = h
            holder = self._hash_holder.get(h)
            self._hash_holder[h] = (consumer, (holder[1] + 1) if holder and holder[0] is consumer else 1)
        out[consumer.order].append(Delivery(pos, entry, self.cursor.redelivery_count(pos),
                                            tuple(self.cursor.acked_batch_indexes(pos))))

    # ---- stats --------------------------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "type": self.type,
            "isDurable": self.durable,
            "msgBacklog": self.cursor.backlog(),
            "unackedMessages": self._subscription_unacked(),
            "msgOutCounter": self.messages_out,
            "bytesOutCounter": self.bytes_out,
            "totalMsgExpired": self.expired_entries,
            "lastExpireTimestamp": self.last_expire_ms,
            "activeConsumerName": self._active.name if self._active is not None else None,
            "replayQueueSize": len(self._replay),
            "msgDelayed": len(self._delayed),
            "consumers": [{"consumerName": c.name, "priorityLevel": c.priority, "availablePermits": c.permits,
                           "unackedMessages": c.unacked_messages, "msgOutCounter": c.messages_out,
                           "bytesOutCounter": c.bytes_out, "redeliveredCounter": c.redelivered,
                           "connectedSince": c.connected_ms,
                           "active": c.active if self.type in ("Exclusive", "Failover") else None,
                           "keyHashRanges": [f"[{a}, {b}]" for a, b in self._sticky.ranges_of(c)]
                           if self._sticky is not None else None}
                          for c in sorted(self.consumers, key=lambda c: c.order)],
            "keySharedMode": ("STICKY" if self._sticky is not None else "AUTO_SPLIT")
            if self.type == "Key_Shared" else None,
        }


def _deliver_at(entry: bytes) -> int:
    """An entry's delivery time (0 = at once; not a message entry = at once)."""
    try:
        return read_header(entry).deliver_at_ms
    except FormatError:
        return 0
