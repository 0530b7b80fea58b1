"""The reader (Pulsar's Reader): reads a topic from a message id, or from the earliest or latest message, without
a durable subscription. Create with `Client.create_reader`.

Broker side a reader is a non-durable cursor (topics/non_durable_cursor.py): no znode, no cursor ledger, an
Exclusive subscription named "reader-<10 hex>" that goes away with the stream, and messages acknowledged by
the broker as it sends them. So the client keeps the position: each partition remembers where it resumes —
after the last message `read_next()` returned, else the start the broker reported when it subscribed
(Subscribed.start: "latest" becomes a fixed position then), else the start it was given; a seek moves it to
the position the broker names in its SeekResult. When a stream is lost (the owner failed or unloaded the
topic), the messages queued and not yet returned are dropped and the partition subscribes again from that
point, exclusive: nothing returned is returned again and nothing is skipped.

Partitioned topics: one reader stream per partition, their messages merged (Pulsar's MultiTopicsReader); such
a reader starts from earliest or latest, and a message id (which names one partition) is refused with
BAD_REQUEST: read that partition's topic ("<topic>-partition-<i>") instead.

It is a Consumer (consumer.py) that acknowledges nothing: flow control, receive queue, reconnects and seeks
are the consumer's.
"""
from __future__ import annotations

import asyncio
import secrets

from bksim.client.consumer import Consumer, _PartitionConsumer
from bksim.client.errors import ClientError
from bksim.client.types import InitialPosition, Message, MessageId, SubscriptionType
from bksim.gen import topic_pb2
from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError
from bksim.topics.names import TopicName

READER_PREFIX = "reader-"


class _Resume:
    """Where one partition's stream starts: a message id (exclusive or inclusive) or an initial position."""
    __slots__ = ("message_id", "inclusive", "initial", "batch_size")

    def __init__(self, message_id: MessageId | None, inclusive: bool, initial: InitialPosition,
                 batch_size: int = 0) -> None:
        """batch_size: messages in the entry of `message_id` (0: not a batch; -1: not known)."""
        self.message_id = message_id
        self.inclusive = inclusive
        self.initial = initial
        self.batch_size = batch_size

    def more_before(self, last: topic_pb2.LastMessageId) -> bool:
        """Whether a message comes after this point, the topic's last entry being `last`."""
        if last.entry_id < 0:
            return False
        mid = self.message_id
        if mid is None:  # not subscribed yet: from earliest, anything; from latest, only what comes later
            return self.initial is InitialPosition.Earliest or self.inclusive
        here, end = (mid.ledger, mid.entry), (last.ledger_id, last.entry_id)
        if end > here:
            return True
        if end < here:
            return False
        if self.inclusive:
            return True
        if self.batch_size < 0:  # a start inside a batch of unknown size: later messages of it may follow
            return mid.batch_index >= 0
        return 0 <= mid.batch_index < self.batch_size - 1


class _ReaderConsumer(Consumer):
    _tracks_acks = False

    def __init__(self, client, topic: str, partitions: int, *, start: MessageId | None, initial: InitialPosition,
                 inclusive: bool, receiver_queue_size: int, reader_name: str) -> None:
        super().__init__(client, topic, partitions, reader_name, subscription_type=SubscriptionType.Exclusive,
                         consumer_name=reader_name, priority=0, initial_position=initial,
                         receiver_queue_size=receiver_queue_size, ack_timeout_ms=0,
                         negative_ack_redelivery_delay_ms=0, ack_group_time_ms=0)
        self._resume = {part: _Resume(start, inclusive, initial, -1) for part in self._parts}

    def _open_message(self, part: _PartitionConsumer, name: str) -> topic_pb2.SubscribeOpen:
        with self._lock:
            r = self._resume[part]
            message = topic_pb2.SubscribeOpen(topic=part.topic, subscription=self._subscription,
                                              type=topic_pb2.EXCLUSIVE, consumer_name=name, non_durable=True,
                                              initial_position=r.initial.value,
                                              start_message_id_inclusive=r.inclusive)
            if r.message_id is not None:
                message.start_message_id.CopyFrom(topic_pb2.AckId(ledger_id=r.message_id.ledger,
                                                                  entry_id=r.message_id.entry,
                                                                  batch_index=r.message_id.batch_index))
        return message

    def _subscribed(self, part: _PartitionConsumer, subscribed: topic_pb2.Subscribed) -> None:
        with self._lock:
            if self._resume[part].message_id is None:  # from now on a fixed position ("latest" moves)
                self._resume[part] = _Resume(MessageId(subscribed.start_ledger_id, subscribed.start_entry_id,
                                                       part.index), False, self._initial_position)

    def _dequeued(self, part: _PartitionConsumer, message: Message) -> None:
        self._resume[part] = _Resume(message.message_id(), False, self._initial_position, message.batch_size())

    def _seeked(self, part: _PartitionConsumer, result: topic_pb2.SeekResult) -> None:
        with self._lock:
            self._resume[part] = _Resume(MessageId(result.ledger_id, result.entry_id, part.index), False,
                                         self._initial_position)

    async def _has_message_available(self) -> bool:
        lasts = await asyncio.gather(*(p.request_last_message_id() for p in self._parts))
        with self._lock:
            if self._queue:
                return True
            return any(self._resume[p].more_before(last) for p, last in zip(self._parts, lasts))


class Reader:
    """Reads one topic (every partition) from a start position; see the module docstring."""

    def __init__(self, client, topic: str, partitions: int, start_message_id, *, start_message_id_inclusive: bool,
                 receiver_queue_size: int, reader_name: str | None) -> None:
        start, initial = _start(start_message_id)
        if partitions and start is not None:
            raise ClientError(TopicStatus.BAD_REQUEST,
                              f"{topic} has {partitions} partitions: a reader of all of them starts from earliest "
                              f"or latest; to start at message id {start}, read {topic}-partition-{start.partition}")
        if not partitions and start is not None and start.partition >= 0:
            index = _partition_index(topic)
            if start.partition != index:
                raise ClientError(TopicStatus.BAD_REQUEST,
                                  f"message id {start} names partition {start.partition}; {topic} is "
                                  + ("not partitioned" if index < 0 else f"partition {index}"))
        name = reader_name or f"{READER_PREFIX}{secrets.token_hex(5)}"
        self._client = client
        self._consumer = _ReaderConsumer(client, topic, partitions, start=start, initial=initial,
                                         inclusive=start_message_id_inclusive,
                                         receiver_queue_size=receiver_queue_size, reader_name=name)

    async def _start(self) -> None:
        await self._consumer._start()

    def topic(self) -> str:
        return self._consumer.topic()

    def reader_name(self) -> str:
        """The name of its (non-durable, Exclusive) subscription."""
        return self._consumer.subscription_name()

    def read_next(self, timeout_ms: int | None = None) -> Message:
        """The next message (waits at most `timeout_ms`; None = until one comes). ClientError TIMEOUT when none
        came in time."""
        return self._consumer.receive(timeout_ms)

    def has_message_available(self) -> bool:
        """Whether read_next() has a message to return now or later without anything new being published: one is
        queued, or some partition's last message is after the reader's position (asks each partition's owner;
        SERVICE_UNAVAILABLE while a partition's stream is reconnecting: ask again)."""
        self._consumer._check_usable()
        with self._consumer._lock:
            if self._consumer._queue:
                return True
        return self._consumer._run(self._consumer._has_message_available())

    def seek(self, target: Message | MessageId | int) -> None:
        """To a message id (the next message read is the first of its entry) or a publish time in ms (the first
        message published at or after it, on every partition). Queued messages are dropped."""
        self._consumer.seek(target)

    def close(self) -> None:
        """End the streams; the broker forgets the reader."""
        self._consumer.close()
        self._client._forget(self)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _partition_index(topic: str) -> int:
    try:
        index = TopicName.parse(topic).partition_index
    except TopicError:
        return -1  # the broker says what is wrong with the name
    return -1 if index is None else index


def _start(value) -> tuple[MessageId | None, InitialPosition]:
    """A MessageId (or a 4-tuple), or earliest / latest (InitialPosition or its name)."""
    if isinstance(value, MessageId):
        return value, InitialPosition.Latest
    if isinstance(value, tuple) and len(value) == 4 and all(isinstance(v, int) for v in value):
        return MessageId(*value), InitialPosition.Latest
    try:
        return None, InitialPosition.parse(value)
    except ValueError:
        raise ClientError(TopicStatus.BAD_REQUEST, f"a reader starts at a MessageId, earliest or latest, not "
                                                   f"{value!r}") from None
