"""The consumer: flow-control permits, decoding entries into messages, acknowledgements (individual, batch
index, cumulative), negative acks, the ack timeout, seek, and reconnects.

Shape. A `Consumer` (the sync facade) has one `_PartitionConsumer` per partition (one for a non-partitioned
topic), each with its own Subscribe stream; their messages go into one receive queue (merged receive).
A Delivery's entry is decoded (formats/message.py) into its records; the batch indexes the broker says are
already acknowledged are skipped. The receive queue holds one item per delivered entry (_Queued), and receive()
makes each Message as it takes it, so a full queue is not two Python objects per message for the garbage
collector to walk. A message of a batch has MessageId(ledger, entry, partition, index) and is acknowledged with
a batch-index ack (AckId batch_index / batch_size); a single message with index -1.

Flow control (as Pulsar): at subscribe time each partition consumer grants `receiver_queue_size` permits
(messages); a message counts against the permits when the broker sends it, and the consumer grants them again
once the application has received half a queue's worth, or its receive queue is empty (skipped,
already-acknowledged batch messages count as received at once). The broker never sends beyond the permits, so
a consumer that waited for half a queue while the broker waited for permits would stall: granting back on an
empty queue prevents that. The receive queue therefore holds at most about `receiver_queue_size` messages per
partition (plus the rest of one batch: the broker may finish an entry).

Acknowledgements. `acknowledge()` of a message this consumer delivered is grouped: acks are sent at most
`ack_group_time_ms` later or when ACK_GROUP_MAX are waiting (close() sends what is left); the grouped indexes of
one batch entry go as one ack set (AckId batch_index plus more_batch_indexes), so acking a batch of n messages
costs the broker one id, not n. An id this consumer
does not hold as unacknowledged goes to the broker at once and waits for its answer, so an unknown id gets
the broker's INVALID_ACK. `acknowledge_cumulative()` waits for the broker's answer (on Shared and Key_Shared
the broker refuses it with NOT_ALLOWED). `negative_acknowledge()` asks for redelivery after
`negative_ack_redelivery_delay_ms`; with `ack_timeout_ms` > 0, a received message not acknowledged within it is
redelivered (both through a Redeliver request; the broker raises the redelivery count).

Dead letters and retries (dead_letter.py): with a `dead_letter_policy`, a received message whose redelivery count
is >= max_redeliver_count is published to the dead-letter topic and acknowledged when it is next due for
redelivery (negative ack, ack timeout) instead of being redelivered. With `retry_enable` the consumer has one
more stream, on the retry topic (same subscription), and `reconsume_later(msg, delay_ms)` moves a message there.

Reconnects. The stream's lifecycle (lookup, open, reconnect with back-off, close) is stream.py's
PartitionStream, shared with the producer; the partition consumer is its role. On NOT_OWNER, TOPIC_FENCED,
SERVICE_UNAVAILABLE (or the transport failing), ... a partition consumer looks the topic up again and subscribes
again (Backoff: bounded attempts, overall `operation_timeout_ms`), dropping the messages it had
queued but the application had not received, and granting its permits again. Messages received but not
acknowledged may come again (at-least-once); acks waiting to be sent are sent on the new stream. Any other
refusal, or giving up, fails the consumer: receive() raises the error once the queue is empty.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import types
from typing import Iterable

from bksim.client.dead_letter import DeadLetter, DeadLetterPolicy, resolve as resolve_dead_letter
from bksim.client.errors import ClientError, from_error_pb
from bksim.client.stream import CLOSE_WAIT_S, PartitionStream, StreamKind
from bksim.client.types import InitialPosition, KeySharedPolicy, Message, MessageId, SubscriptionType
from bksim.formats.message import RECORD_FIELDS, decode_records, read_header
from bksim.gen import topic_pb2
from bksim.model.errors import FormatError
from bksim.model.status import TopicStatus

log = logging.getLogger("bksim.client")

RECEIVER_QUEUE_SIZE_DEFAULT = 1000
RECEIVER_QUEUE_SIZE_MAX = 1_000_000  # the most permits one Flow may grant
NEGATIVE_ACK_DELAY_MS_DEFAULT = 60_000
ACK_GROUP_TIME_MS_DEFAULT = 10
ACK_GROUP_MAX = 1000          # grouped acks sent at once when this many wait
ACK_IDS_PER_REQUEST_MAX = 10_000  # ids in one Ack / Redeliver request
TICK_MIN_S, TICK_MAX_S = 0.01, 1.0   # the redelivery tracker's tick (a quarter of the shortest delay)
MAX_RECONSUME_TIMES_DEFAULT = 16     # retry_enable without a dead_letter_policy (Pulsar's MAX_RECONSUME_TIMES)


_new_id = tuple.__new__  # MessageId from a tuple of its fields, without the named tuple's Python-level __new__
_NO_PROPERTIES = types.MappingProxyType({})  # the properties of every message that has none (read-only, shared)


def _ack_id(mid: MessageId, batch_size: int) -> topic_pb2.AckId:
    if mid.batch_index >= 0:
        return topic_pb2.AckId(ledger_id=mid.ledger, entry_id=mid.entry, batch_index=mid.batch_index,
                               batch_size=batch_size)
    return topic_pb2.AckId(ledger_id=mid.ledger, entry_id=mid.entry, batch_index=-1)


class Consumer:
    """Receives from one subscription of one topic (all its partitions). Create with `Client.subscribe`."""

    _tracks_acks = True  # a Reader (reader.py) acknowledges nothing: the broker does as it sends

    # -- hooks for reader.py (the loop thread calls them, except _dequeued: the caller's, under self._lock) ----
    def _open_message(self, part: "_PartitionConsumer", name: str) -> topic_pb2.SubscribeOpen:
        return topic_pb2.SubscribeOpen(topic=part.topic, subscription=self._subscription, type=self._type.value,
                                       consumer_name=name, priority=self._priority,
                                       initial_position=self._initial_position.value,
                                       key_shared_policy=self._key_shared_policy.to_pb()
                                       if self._key_shared_policy is not None else None)

    def _subscribed(self, part: "_PartitionConsumer", subscribed: topic_pb2.Subscribed) -> None:
        pass

    def _dequeued(self, part: "_PartitionConsumer", message: Message) -> None:
        pass

    def _seeked(self, part: "_PartitionConsumer", result: topic_pb2.SeekResult) -> None:
        pass

    def __init__(self, client, topic: str, partitions: int, subscription: str, *,
                 subscription_type: SubscriptionType, consumer_name: str | None, priority: int,
                 initial_position: InitialPosition, receiver_queue_size: int, ack_timeout_ms: int,
                 negative_ack_redelivery_delay_ms: int, ack_group_time_ms: int,
                 dead_letter_policy: DeadLetterPolicy | None = None, retry_enable: bool = False,
                 key_shared_policy: KeySharedPolicy | None = None) -> None:
        if not 1 <= receiver_queue_size <= RECEIVER_QUEUE_SIZE_MAX:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              f"receiver_queue_size must be 1..{RECEIVER_QUEUE_SIZE_MAX}, got "
                              f"{receiver_queue_size}")
        if ack_timeout_ms < 0 or negative_ack_redelivery_delay_ms < 0 or ack_group_time_ms < 0:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              "ack_timeout_ms, negative_ack_redelivery_delay_ms and "
                              "ack_group_time_ms must be >= 0")
        if not subscription:
            raise ClientError(TopicStatus.BAD_REQUEST, "a subscription name is required")
        self._client = client
        self._loop = client._loop
        self._topic = topic
        self._partitioned = partitions > 0
        self._subscription = subscription
        self._type = subscription_type
        self._requested_name = consumer_name or ""
        self._priority = priority
        self._key_shared_policy = key_shared_policy  # KEY_SHARED only (the broker refuses it elsewhere)
        self._initial_position = initial_position
        self._queue_size = receiver_queue_size
        self._refill_at = max(1, receiver_queue_size // 2)
        self._ack_timeout_s = ack_timeout_ms / 1000.0
        self._nack_delay_s = negative_ack_redelivery_delay_ms / 1000.0
        self._ack_group_s = ack_group_time_ms / 1000.0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the same lock; waits for messages
        self._queue: collections.deque[_Queued] = collections.deque()  # entries with messages not yet received
        self._queued = 0  # messages in _queue
        self._waiters = 0
        # delivered, not acked: (ledger, entry, partition, batch index) -> (its partition consumer, batch size); a
        # plain tuple, equal to the MessageId, so the collector stops tracking it
        self._unacked: dict[tuple[int, int, int, int], tuple[_PartitionConsumer, int]] = {}
        self._ack_deadlines: collections.OrderedDict[MessageId, float] = collections.OrderedDict()
        self._nacks: dict[MessageId, float] = {}       # id -> when to ask for its redelivery
        self._ack_group: list[MessageId] = []   # acked ids waiting to be sent ...
        self._ack_group_tracked: list[tuple[_PartitionConsumer, int]] = []  # ... and their _unacked values
        self._ack_flush_armed = False  # a flush is scheduled ack_group_time_ms after the group's first ack
        self._ack_flush_now = False    # a flush is scheduled at once (the group reached ACK_GROUP_MAX)
        self._error: ClientError | None = None
        self._closed = False
        self.last_ack_error: ClientError | None = None  # the latest refusal of a grouped ack (they are not awaited)
        count = partitions if self._partitioned else 1
        self._parts = [_PartitionConsumer(self, f"{topic}-partition-{i}" if self._partitioned else topic,
                                          i if self._partitioned else -1) for i in range(count)]
        self._tracker_task: asyncio.Task | None = None
        if retry_enable and dead_letter_policy is None:
            dead_letter_policy = DeadLetterPolicy(MAX_RECONSUME_TIMES_DEFAULT)
        self._dead_letter_policy = dead_letter_policy
        self._dead_letter: DeadLetter | None = None       # its producers, once attached (_attach_dead_letter)
        self._dlq_candidates: dict[MessageId, Message] = {}  # received with redelivery count >= the maximum
        self._dlq_topics: tuple[str, str | None] | None = None
        if dead_letter_policy is not None:
            self._dlq_topics = resolve_dead_letter(dead_letter_policy, topic, subscription, subscription_type,
                                                   retry_enable)
            if self._dlq_topics[1] is not None:   # the retry topic: one more stream, same subscription
                self._parts.append(_PartitionConsumer(self, self._dlq_topics[1], -1))

    def _attach_dead_letter(self) -> None:
        """Create the dead-letter (and retry) topics if needed and their producers; the application's thread,
        before _start (which subscribes to the retry topic too)."""
        if self._dlq_topics is not None:
            self._dead_letter = DeadLetter(self._client, self._dead_letter_policy, *self._dlq_topics)

    async def _start(self) -> None:
        first = self._parts[0]
        await first.start(self._requested_name)
        rest = self._parts[1:]
        if rest:
            results = await asyncio.gather(*(p.start(first.name) for p in rest), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        delays = [d for d in (self._ack_timeout_s, self._nack_delay_s) if d > 0]
        tick = min(TICK_MAX_S, max(TICK_MIN_S, min(delays) / 4)) if delays else TICK_MAX_S
        self._tracker_task = asyncio.get_running_loop().create_task(self._track_redeliveries(tick))

    # -- facts -------------------------------------------------------------------------------------------------
    def topic(self) -> str:
        return self._topic

    def subscription_name(self) -> str:
        return self._subscription

    def consumer_name(self) -> str:
        return self._parts[0].name

    def is_active(self) -> bool | None:
        """Exclusive/Failover: whether the broker last said this consumer is active (None: not said yet)."""
        states = [p.active for p in self._parts if p.active is not None]
        return None if not states else any(states)

    def unacked_count(self) -> int:
        return len(self._unacked)

    def queued(self) -> int:
        """Messages received from the broker and not yet taken by receive()."""
        return self._queued

    # -- receive -----------------------------------------------------------------------------------------------
    def receive(self, timeout_ms: int | None = None) -> Message:
        """The next message (waits at most `timeout_ms`; None = until one comes). ClientError TIMEOUT when none
        came in time; the consumer's error when it failed; BAD_REQUEST when it is closed."""
        if self._loop.in_loop:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              "receive() was called from a client callback (it would block the "
                              "client's thread)")
        deadline = None  # set when the queue is first found empty
        with self._lock:
            while not self._queue:
                if deadline is None and timeout_ms is not None:
                    deadline = time.monotonic() + timeout_ms / 1000.0
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise ClientError(TopicStatus.BAD_REQUEST,
                                      f"consumer {self.consumer_name()} of {self._subscription} on "
                                      f"{self._topic} is closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ClientError(TopicStatus.TIMEOUT,
                                      f"no message on {self._topic} (subscription {self._subscription}) "
                                      f"within {timeout_ms} ms")
                self._waiters += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiters -= 1
            queued = self._queue[0]
            msg = queued.take()
            if not queued.left:
                self._queue.popleft()
            self._queued -= 1
            part = queued.part
            self._dequeued(part, msg)
            if (self._dead_letter_policy is not None
                    and msg._redelivery_count >= self._dead_letter_policy.max_redeliver_count):
                self._dlq_candidates[msg._id] = msg
            flows = None
            if queued.epoch == part.stream.opened:
                part.refill += 1
                if part.refill >= self._refill_at:
                    flows = [(part, part.refill, part.epoch)]
                    part.refill = 0
            if not self._queue:
                # the queue is empty: grant back everything received, or a broker holding an entry bigger than the
                # permits it has left would wait for permits that only come after more messages (a stall)
                for other in self._parts:
                    if other.refill > 0:
                        if flows is None:
                            flows = []
                        flows.append((other, other.refill, other.epoch))
                        other.refill = 0
            if self._ack_timeout_s > 0:
                self._ack_deadlines[msg._id] = time.monotonic() + self._ack_timeout_s
                self._ack_deadlines.move_to_end(msg._id)
        if flows is not None:
            for flow in flows:
                self._loop.call(flow[0].send_flow, flow[1], flow[2])
        return msg

    def _deliver(self, part: "_PartitionConsumer", entries: list["_Queued"], skipped: int) -> None:  # loop thread
        flow = None
        with self._lock:
            count = 0
            for queued in entries:
                count += queued.left
                if self._tracks_acks:
                    unacked = self._unacked
                    tracked = (part, queued.size)  # shared by the entry's messages
                    for key in queued.keys:
                        unacked[key] = tracked
            self._queue.extend(entries)
            self._queued += count
            if skipped:
                part.refill += skipped
                if part.refill >= self._refill_at:
                    flow = part.refill
                    part.refill = 0
            if self._waiters and count:
                self._cond.notify_all()
        if flow is not None:
            part.send_flow(flow, part.epoch)

    def _purge(self, part: "_PartitionConsumer") -> int:  # loop thread
        """Drop the messages of `part` not yet received by the application (a new stream or a seek will send
        them again); their tracker entries go too. Returns the permits to grant again on the same stream: the
        dropped messages plus those received since the last Flow."""
        with self._lock:
            keep = collections.deque(q for q in self._queue if q.part is not part)
            dropped = 0
            for q in self._queue:
                if q.part is part:
                    for key in q.keys[q.next:]:
                        self._unacked.pop(key, None)
                    dropped += q.left
            self._queue = keep
            self._queued -= dropped
            permits = dropped + part.refill
            part.refill = 0
        return permits

    # -- acknowledgements --------------------------------------------------------------------------------------
    def _id_of(self, message: Message | MessageId) -> MessageId:
        if isinstance(message, Message):
            return message._id
        if isinstance(message, MessageId):
            return message
        if isinstance(message, tuple) and len(message) == 4:
            return MessageId(*message)
        raise ClientError(TopicStatus.BAD_REQUEST, f"expected a Message or a MessageId, got {type(message).__name__}")

    def _part_of(self, mid: MessageId) -> "_PartitionConsumer":
        if not self._partitioned:
            return self._parts[0]
        if 0 <= mid.partition < len(self._parts):
            return self._parts[mid.partition]
        raise ClientError(TopicStatus.BAD_REQUEST,
                          f"message id {mid} names partition {mid.partition}; {self._topic} has "
                          f"partitions 0..{len(self._parts) - 1}")

    def acknowledge(self, message: Message | MessageId) -> None:
        """Acknowledge one message (see the module docstring: grouped when this consumer delivered it)."""
        mid = message._id if type(message) is Message else self._id_of(message)
        if self._error is not None or self._closed:
            self._check_usable()
        arm = None
        with self._lock:
            tracked = self._unacked.pop(mid, None)
            if self._dlq_candidates:
                self._dlq_candidates.pop(mid, None)
            if tracked is not None:
                if self._ack_deadlines:
                    self._ack_deadlines.pop(mid, None)
                if self._nacks:
                    self._nacks.pop(mid, None)
                group = self._ack_group
                group.append(mid)
                self._ack_group_tracked.append(tracked)
                if len(group) >= ACK_GROUP_MAX or self._ack_group_s == 0:
                    if not self._ack_flush_now:
                        self._ack_flush_now = True
                        arm = "now"
                elif not self._ack_flush_armed:
                    self._ack_flush_armed = True
                    arm = "later"
        if tracked is None:
            batch_size = message._batch_size if isinstance(message, Message) else 0
            part = self._part_of(mid)
            self._run(part.request_ack([_ack_id(mid, batch_size)], cumulative=False))
            return
        if arm == "now":
            self._loop.call(self._flush_acks)
        elif arm == "later":
            self._loop.call(self._arm_ack_flush)

    def acknowledge_cumulative(self, message: Message | MessageId) -> None:
        """Acknowledge every message of the message's partition up to and including it; waits for the broker
        (NOT_ALLOWED on Shared and Key_Shared subscriptions)."""
        mid = self._id_of(message)
        self._check_usable()
        part = self._part_of(mid)
        with self._lock:
            tracked = self._unacked.get(mid)
        batch_size = tracked[1] if tracked else (message._batch_size if isinstance(message, Message) else 0)
        self._run(part.request_ack([_ack_id(mid, batch_size)], cumulative=True))
        with self._lock:
            for other in [m for m, (p, _) in self._unacked.items() if p is part and m <= mid]:
                self._unacked.pop(other, None)
                self._ack_deadlines.pop(other, None)
                self._nacks.pop(other, None)
                self._dlq_candidates.pop(other, None)

    def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask for the message to be delivered again after negative_ack_redelivery_delay_ms."""
        mid = self._id_of(message)
        self._check_usable()
        with self._lock:
            self._ack_deadlines.pop(mid, None)
            self._nacks[mid] = time.monotonic() + self._nack_delay_s

    def _arm_ack_flush(self) -> None:  # loop thread
        self._loop.loop.call_later(self._ack_group_s, self._flush_acks)

    def _flush_acks(self) -> None:  # loop thread
        with self._lock:
            group, self._ack_group = self._ack_group, []
            tracked, self._ack_group_tracked = self._ack_group_tracked, []
            self._ack_flush_armed = self._ack_flush_now = False
        if not group:
            return
        if len(self._parts) == 1:
            self._parts[0].send_acks(zip(group, [t[1] for t in tracked]))
            return
        by_part: dict[_PartitionConsumer, list[tuple[MessageId, int]]] = {}
        for mid, (part, batch_size) in zip(group, tracked):
            by_part.setdefault(part, []).append((mid, batch_size))
        for part, ids in by_part.items():
            part.send_acks(ids)

    async def _track_redeliveries(self, tick: float) -> None:
        """Every tick: Redeliver the negatively acknowledged messages that are due and the received ones whose
        ack timeout passed."""
        while True:
            await asyncio.sleep(tick)  # a periodic check, not synchronisation
            now = time.monotonic()
            due: dict[_PartitionConsumer, list[topic_pb2.AckId]] = {}
            dead: list[Message] = []
            with self._lock:
                for mid in [m for m, when in self._nacks.items() if when <= now]:
                    del self._nacks[mid]
                    if self._dead_letter is not None and mid in self._dlq_candidates:
                        dead.append(self._dlq_candidates.pop(mid))
                        continue
                    tracked = self._unacked.get(mid)
                    part = tracked[0] if tracked else self._part_of_or_none(mid)
                    if part is not None:
                        due.setdefault(part, []).append(_ack_id(mid, tracked[1] if tracked else 0))
                while self._ack_deadlines:
                    mid, when = next(iter(self._ack_deadlines.items()))
                    if when > now:
                        break
                    del self._ack_deadlines[mid]
                    if self._dead_letter is not None and mid in self._dlq_candidates:
                        dead.append(self._dlq_candidates.pop(mid))
                        continue
                    tracked = self._unacked.get(mid)
                    if tracked is not None:
                        due.setdefault(tracked[0], []).append(_ack_id(mid, tracked[1]))
            for part, ids in due.items():
                part.send_redeliver(ids)
            for msg in dead:
                self._send_to_dead_letter(msg)

    def _send_to_dead_letter(self, msg: Message) -> None:  # loop thread
        """Publish `msg` to the dead-letter topic, then acknowledge it; if the publish fails, redeliver it."""
        def done(error: ClientError | None, _mid) -> None:
            if error is None:
                with self._lock:
                    self._unacked.pop(msg._id, None)
                    self._ack_deadlines.pop(msg._id, None)
                    self._nacks.pop(msg._id, None)
                msg._owner.send_acks([(msg._id, msg._batch_size)])
            else:
                log.warning("consumer of %s: dead-lettering %s to %s failed (%s); redelivering it", self._topic,
                            msg._id, self._dead_letter.dlq_topic, error)
                msg._owner.send_redeliver([_ack_id(msg._id, msg._batch_size)])
        try:
            self._dead_letter.send_to_dlq_async(msg, done)
        except ClientError as e:
            done(e, None)

    def reconsume_later(self, message: Message, delay_ms: int) -> None:
        """Deliver `message` again after `delay_ms` through the retry topic (or to the dead-letter topic once it
        was retried max_redeliver_count times), then acknowledge it here; needs retry_enable=True."""
        self._check_usable()
        if not isinstance(message, Message):
            raise ClientError(TopicStatus.BAD_REQUEST, f"reconsume_later takes a received Message, not "
                                                       f"{type(message).__name__}")
        if self._dead_letter is None or self._dead_letter.retry is None:
            raise ClientError(TopicStatus.BAD_REQUEST, f"consumer of {self._subscription} on {self._topic} was not "
                                                       f"subscribed with retry_enable=True")
        self._dead_letter.reconsume_later(message, delay_ms)
        self.acknowledge(message)

    def _part_of_or_none(self, mid: MessageId) -> "_PartitionConsumer | None":
        try:
            return self._part_of(mid)
        except ClientError:
            return None

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to deliver again every message it delivered to this consumer and that is not acked."""
        self._check_usable()
        for part in self._parts:
            self._loop.call(part.send_redeliver, [])

    # -- seek --------------------------------------------------------------------------------------------------
    def seek(self, target: Message | MessageId | int) -> None:
        """Move the subscription: to a message id (the next message delivered is that one) or to a publish time
        in ms (the first message published at or after it, on every partition). Messages queued and not yet
        received are dropped."""
        self._check_usable()
        if isinstance(target, bool) or not isinstance(target, (int, Message, MessageId, tuple)):
            raise ClientError(TopicStatus.BAD_REQUEST, f"seek to a MessageId or a publish time in ms, not {target!r}")
        if isinstance(target, int) and not isinstance(target, MessageId):
            for part in self._parts:
                self._run(part.request_seek(publish_time_ms=target))
            return
        mid = self._id_of(target)
        part = self._part_of(mid)
        self._run(part.request_seek(position=topic_pb2.AckId(ledger_id=mid.ledger, entry_id=mid.entry,
                                                            batch_index=mid.batch_index)))

    # -- state -------------------------------------------------------------------------------------------------
    def _run(self, coroutine):
        return self._loop.run(coroutine, self._client._operation_timeout_s + 1.0)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ClientError(TopicStatus.BAD_REQUEST, f"consumer of {self._subscription} on {self._topic} is closed")

    def _fail(self, error: ClientError) -> None:
        with self._lock:
            if self._error is None and not self._closed:
                self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        """Send the acks still grouped, then end every stream (the broker keeps the subscription)."""
        if self._closed:
            return
        try:
            self._loop.run(self._close(), CLOSE_WAIT_S * 2 + 1)
        except ClientError:
            pass
        finally:
            with self._lock:
                self._closed = True
                self._cond.notify_all()
            if self._dead_letter is not None:
                self._dead_letter.close()
            self._client._forget(self)

    async def _close(self) -> None:
        self._flush_acks()
        if self._tracker_task is not None:
            self._tracker_task.cancel()
        await asyncio.gather(*(p.stop() for p in self._parts), return_exceptions=True)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SUBSCRIBE_STREAM = StreamKind(method="Subscribe", open_name="Subscribe", ready_kind="subscribed",
                              stream_name="subscribe", ready_words="the consumer was subscribed",
                              busy_status=TopicStatus.CONSUMER_BUSY)


class _PartitionConsumer:
    """One partition's flow control and pending requests, and the role they play on its Subscribe stream
    (stream.py; see the module docstring)."""

    def __init__(self, consumer: Consumer, topic: str, index: int) -> None:
        self.consumer = consumer
        self.topic = topic
        self.index = index
        self.refill = 0          # messages received (or skipped) since the last Flow, under the consumer's lock
        self.active: bool | None = None
        self._request_id = 0
        self._waiting: dict[int, tuple[asyncio.Future | None, str]] = {}  # request id -> (future, kind)
        self._ack_backlog: list[tuple[MessageId, int]] = []  # grouped acks while no stream is up
        self.stream = PartitionStream(consumer._client, topic, SUBSCRIBE_STREAM, self)

    @property
    def name(self) -> str:
        return self.stream.name

    @property
    def epoch(self) -> int:
        """Streams opened so far; a message remembers the one it came on (permits of an older one are void)."""
        return self.stream.opened

    # -- requests (loop thread) --------------------------------------------------------------------------------
    def _put(self, request: topic_pb2.ConsumeRequest) -> bool:
        return self.stream.put(request)

    def send_flow(self, permits: int, epoch: int) -> None:
        if epoch == self.epoch and permits > 0:
            self._put(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=permits)))

    def send_acks(self, ids: Iterable[tuple[MessageId, int]]) -> None:
        """Grouped acks of (message id, batch size): not awaited; a refusal is logged and kept as
        consumer.last_ack_error. Kept for the next stream while none is up."""
        if not self.stream.up:
            self._ack_backlog.extend(ids)
            return
        # one id per entry: the batch indexes of one entry travel together (first in batch_index, the rest in
        # more_batch_indexes), so acking a whole batch costs the broker one id, not one per message
        entries: dict[tuple[int, int], list] = {}
        held, held_ledger, held_entry = None, -1, -1
        for mid, batch_size in ids:
            ledger, entry, _partition, index = mid
            if held is None or entry != held_entry or ledger != held_ledger:
                held_ledger, held_entry = ledger, entry
                held = entries.get((ledger, entry))
                if held is None:
                    entries[(ledger, entry)] = held = [batch_size, [index]]
                    continue
            if index >= 0 and held[1][0] >= 0:
                held[1].append(index)
            else:  # the whole entry: it covers every index
                held[1] = [-1]
        items = list(entries.items())
        for start in range(0, len(items), ACK_IDS_PER_REQUEST_MAX):
            self._request_id += 1
            self._waiting[self._request_id] = (None, "ack")
            request = topic_pb2.ConsumeRequest()
            request.ack.request_id = self._request_id
            add = request.ack.ids.add
            for (ledger, entry), (batch_size, indexes) in items[start:start + ACK_IDS_PER_REQUEST_MAX]:
                if indexes[0] >= 0:
                    add(ledger_id=ledger, entry_id=entry, batch_index=indexes[0], batch_size=batch_size,
                        more_batch_indexes=indexes[1:])
                else:
                    add(ledger_id=ledger, entry_id=entry, batch_index=-1)
            self._put(request)

    def send_redeliver(self, ids: list[topic_pb2.AckId]) -> None:
        for start in range(0, max(1, len(ids)), ACK_IDS_PER_REQUEST_MAX):
            self._put(topic_pb2.ConsumeRequest(redeliver=topic_pb2.Redeliver(
                ids=ids[start:start + ACK_IDS_PER_REQUEST_MAX])))

    async def request_ack(self, ids: list[topic_pb2.AckId], cumulative: bool) -> None:
        self._request_id += 1
        rid = self._request_id
        future = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (future, "ack")
        if not self._put(topic_pb2.ConsumeRequest(ack=topic_pb2.Ack(request_id=rid, ids=ids, cumulative=cumulative))):
            self._waiting.pop(rid, None)
            raise ClientError(TopicStatus.SERVICE_UNAVAILABLE,
                              f"consumer of {self.topic} is reconnecting; ack again later")
        await future

    async def request_seek(self, position: topic_pb2.AckId | None = None, publish_time_ms: int | None = None) -> None:
        self._request_id += 1
        rid = self._request_id
        future = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (future, "seek")
        seek = (topic_pb2.Seek(request_id=rid, position=position) if position is not None
                else topic_pb2.Seek(request_id=rid, publish_time_ms=publish_time_ms))
        if not self._put(topic_pb2.ConsumeRequest(seek=seek)):
            self._waiting.pop(rid, None)
            raise ClientError(TopicStatus.SERVICE_UNAVAILABLE,
                              f"consumer of {self.topic} is reconnecting; seek again later")
        await future

    async def request_last_message_id(self) -> topic_pb2.LastMessageId:
        self._request_id += 1
        rid = self._request_id
        future = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (future, "last_message_id")
        if not self._put(topic_pb2.ConsumeRequest(get_last_message_id=topic_pb2.GetLastMessageId(request_id=rid))):
            self._waiting.pop(rid, None)
            raise ClientError(TopicStatus.SERVICE_UNAVAILABLE,
                              f"reader of {self.topic} is reconnecting; ask again later")
        return await future

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self, name: str) -> None:
        await self.stream.start(name)

    async def stop(self) -> None:
        await self.stream.stop()

    # -- the stream's role (loop thread) -----------------------------------------------------------------------
    def describe(self) -> str:
        return f"consumer of {self.topic} (subscription {self.consumer._subscription})"

    def open_request(self, name: str) -> topic_pb2.ConsumeRequest:
        return topic_pb2.ConsumeRequest(open=self.consumer._open_message(self, name))

    def opened(self, subscribed: topic_pb2.Subscribed) -> str:
        """A new stream: grant the whole receive queue's permits again, and send the acks kept meanwhile."""
        consumer = self.consumer
        with consumer._lock:
            self.refill = 0
        consumer._subscribed(self, subscribed)
        self._put(topic_pb2.ConsumeRequest(flow=topic_pb2.Flow(permits=consumer._queue_size)))
        if self._ack_backlog:
            backlog, self._ack_backlog = self._ack_backlog, []
            self.send_acks(backlog)
        return subscribed.consumer_name

    def writer(self, outbox: asyncio.Queue) -> None:
        return None

    def received(self, response: topic_pb2.ConsumeResponse) -> ClientError | None:
        kind = response.WhichOneof("kind")
        if kind == "deliveries":
            try:
                self._on_deliveries(response.deliveries.deliveries)
            except FormatError as e:
                return ClientError(TopicStatus.INTERNAL,
                                   f"broker {self.stream.address} delivered an entry of {self.topic} "
                                   f"that does not decode: {e}", from_broker=True)
        elif kind == "ack_result":
            self._answer(response.ack_result.request_id, response.ack_result)
        elif kind == "seek_result":
            if not response.seek_result.HasField("error"):
                permits = self.consumer._purge(self)  # what came before the seek is stale
                self.consumer._seeked(self, response.seek_result)
                self.send_flow(permits, self.epoch)
            self._answer(response.seek_result.request_id, response.seek_result)
        elif kind == "last_message_id":
            future, _kind = self._waiting.pop(response.last_message_id.request_id, (None, ""))
            if future is not None and not future.done():
                future.set_result(response.last_message_id)
        elif kind == "active_change":
            self.active = response.active_change.active
        elif kind == "error":
            return from_error_pb(response.error, self.stream.address)
        return None

    def ended(self, error: ClientError) -> None:
        """Requests waiting for an answer fail (also when stopping)."""
        waiting, self._waiting = self._waiting, {}
        for future, _kind in waiting.values():
            if future is not None and not future.done():
                future.set_exception(ClientError(error.status, f"the stream ended before the answer: {error.message}",
                                                 from_broker=error.from_broker))

    def lost(self, error: ClientError) -> bool:
        """Messages queued and not yet received are dropped (the next stream sends them again)."""
        self.consumer._purge(self)
        return False

    def fail(self, error: ClientError) -> None:
        self.consumer._fail(error)

    def _answer(self, request_id: int, result) -> None:
        future, kind = self._waiting.pop(request_id, (None, ""))
        error = from_error_pb(result.error, self.stream.address) if result.HasField("error") else None
        if future is None:
            if error is not None:
                self.consumer.last_ack_error = error
                log.warning("consumer of %s: grouped ack refused: %s", self.topic, error)
            return
        if not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(None)

    def _on_deliveries(self, deliveries) -> None:
        epoch = self.epoch
        topic = self.topic
        out: list[_Queued] = []
        skipped = 0
        for d in deliveries:
            entry = d.entry
            header = read_header(entry)
            fields = decode_records(entry, header)
            partition, ledger, entry_id = d.partition, d.ledger_id, d.entry_id
            if header.is_batch:
                size = header.num_messages
                acked = set(d.acked_batch_indexes)
                skipped += len(acked)
                keys = [(ledger, entry_id, partition, i) for i in range(size) if i not in acked]
            else:
                size = 0
                keys = [(ledger, entry_id, partition, -1)]
            if keys:
                out.append(_Queued(self, epoch, keys, fields, d.redelivery_count, header.publish_time_ms, topic, size,
                                   header.producer_name))
        if out or skipped:
            self.consumer._deliver(self, out, skipped)


class _Queued:
    """The messages of one delivered entry that receive() has not taken yet. The receive queue holds these, not
    a Message per message: a message's objects are made when it is received, so a long queue leaves the garbage
    collector only plain tuples of ints (which it stops tracking) to look at, not two objects per message."""

    __slots__ = ("part", "epoch", "keys", "fields", "next", "redelivered", "publish_ms", "topic", "size",
                 "producer")

    def __init__(self, part: _PartitionConsumer, epoch: int, keys: list[tuple[int, int, int, int]], fields: list,
                 redelivered: int, publish_ms: int, topic: str, size: int, producer: str) -> None:
        self.part = part
        self.epoch = epoch
        self.keys = keys          # (ledger, entry, partition, batch index) of each message to deliver, in order
        self.fields = fields      # decode_records() of the entry (every message, delivered or not)
        self.next = 0             # keys[next] is the next message to take
        self.redelivered = redelivered
        self.publish_ms = publish_ms
        self.topic = topic
        self.size = size          # messages in the entry when it is a batch; 0 when it is not
        self.producer = producer

    @property
    def left(self) -> int:
        return len(self.keys) - self.next

    def take(self) -> Message:
        """The next message (there is one: left > 0)."""
        key = self.keys[self.next]
        self.next += 1
        j = RECORD_FIELDS * key[3] if self.size else 0
        payload, msg_key, props, event_ms, seq = self.fields[j:j + RECORD_FIELDS]
        return Message(payload, msg_key, props if props is not None else _NO_PROPERTIES, _new_id(MessageId, key),
                       self.redelivered, self.publish_ms, event_ms, self.topic, self.size, seq, self.producer,
                       self.part, self.epoch)
