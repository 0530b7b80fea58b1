"""Value types of the topic client: MessageId, the received Message, and the option enums.

`MessageId` is the topic layer's own (topics/positions.py): (ledger, entry, partition, batch_index),
partition -1 for a non-partitioned topic, batch_index -1 when the entry is not a batch. Ordered by its
fields, so ids of one partition compare in log order.

A received `Message` is immutable and carries what acknowledging it needs (its batch size); its accessors
have pulsar-client's names (data(), key(), properties(), message_id(), ...).
"""
from __future__ import annotations

import enum

from bksim.topics.positions import MessageId
from bksim.gen import topic_pb2

__all__ = ["MessageId", "Message", "SubscriptionType", "InitialPosition", "RoutingMode", "KeySharedPolicy"]


class SubscriptionType(enum.Enum):
    Exclusive = topic_pb2.EXCLUSIVE
    Shared = topic_pb2.SHARED
    Failover = topic_pb2.FAILOVER
    KeyShared = topic_pb2.KEY_SHARED
    Key_Shared = topic_pb2.KEY_SHARED  # alias, as the command line spells it

    @classmethod
    def parse(cls, text: "str | SubscriptionType") -> "SubscriptionType":
        """'Exclusive', 'shared', 'Key_Shared', 'key-shared', ... -> the member; ValueError naming the choices."""
        if isinstance(text, SubscriptionType):
            return text
        wanted = str(text).replace("_", "").replace("-", "").lower()
        for member in cls:
            if member.name.replace("_", "").lower() == wanted:
                return member
        raise ValueError(f"unknown subscription type {text!r}: use Exclusive, Shared, Failover or Key_Shared")


class KeySharedPolicy:
    """How a Key_Shared subscription assigns keys (Pulsar's KeySharedPolicy). `KeySharedPolicy.auto_split()`
    (the default): the broker spreads keys over the consumers. `KeySharedPolicy.sticky([(start, end), ...])`:
    this consumer takes the key slots (murmur3_32(key) mod 65536) in the inclusive ranges; the broker refuses
    ranges that overlap another consumer's (CONSUMER_ASSIGN_ERROR) and holds keys no consumer covers."""

    def __init__(self, mode: int, hash_ranges: tuple[tuple[int, int], ...] = ()) -> None:
        self.mode = mode
        self.hash_ranges = hash_ranges

    @staticmethod
    def auto_split() -> "KeySharedPolicy":
        return KeySharedPolicy(topic_pb2.AUTO_SPLIT)

    @staticmethod
    def sticky(hash_ranges) -> "KeySharedPolicy":
        return KeySharedPolicy(topic_pb2.STICKY, tuple((int(s), int(e)) for s, e in hash_ranges))

    def to_pb(self) -> topic_pb2.KeySharedPolicy:
        return topic_pb2.KeySharedPolicy(mode=self.mode, hash_ranges=[topic_pb2.HashRange(start=s, end=e)
                                                                      for s, e in self.hash_ranges])


class InitialPosition(enum.Enum):
    Latest = topic_pb2.LATEST
    Earliest = topic_pb2.EARLIEST

    @classmethod
    def parse(cls, text: "str | InitialPosition") -> "InitialPosition":
        if isinstance(text, InitialPosition):
            return text
        for member in cls:
            if member.name.lower() == str(text).lower():
                return member
        raise ValueError(f"unknown initial position {text!r}: use earliest or latest")


class RoutingMode(enum.Enum):
    """How a producer picks the partition of a message without a key (a keyed message always goes to
    murmur3_32(key) mod partitions)."""
    RoundRobinPartition = "round-robin"  # the next partition for every batch
    SinglePartition = "single"           # one partition chosen when the producer is created


class Message:
    """One received message. `data()` the payload bytes; the other accessors as in pulsar-client."""

    __slots__ = ("_data", "_key", "_properties", "_id", "_redelivery_count", "_publish_ms", "_event_ms", "_topic",
                 "_batch_size", "_sequence_id", "_producer_name", "_owner", "_epoch")

    def __init__(self, data: bytes, key: str | None, properties: dict[str, str], message_id: MessageId,
                 redelivery_count: int, publish_ms: int, event_ms: int, topic: str, batch_size: int,
                 sequence_id: int = -1, producer_name: str = "", owner: object = None, epoch: int = 0) -> None:
        self._data = data
        self._key = key
        self._properties = properties
        self._id = message_id
        self._redelivery_count = redelivery_count
        self._publish_ms = publish_ms
        self._event_ms = event_ms
        self._topic = topic
        self._batch_size = batch_size  # messages in the entry (0: not a batch)
        self._sequence_id = sequence_id
        self._producer_name = producer_name
        self._owner = owner            # the partition consumer that received it (for acks)
        self._epoch = epoch            # that consumer's connection count when it arrived

    def data(self) -> bytes:
        return self._data

    def value(self) -> bytes:
        return self._data

    def key(self) -> str | None:
        return self._key

    def partition_key(self) -> str | None:
        return self._key

    def properties(self) -> dict[str, str]:
        return dict(self._properties)

    def message_id(self) -> MessageId:
        return self._id

    def redelivery_count(self) -> int:
        return self._redelivery_count

    def publish_timestamp(self) -> int:
        """Milliseconds since the epoch, stamped by the broker when it wrote the entry."""
        return self._publish_ms

    def event_timestamp(self) -> int:
        """The producer's event time in milliseconds (0 = not set)."""
        return self._event_ms

    def topic_name(self) -> str:
        return self._topic

    def sequence_id(self) -> int:
        return self._sequence_id

    def producer_name(self) -> str:
        return self._producer_name

    def batch_size(self) -> int:
        """Messages in this message's entry when it was sent as a batch; 0 otherwise."""
        return self._batch_size

    def __repr__(self) -> str:
        return (f"Message(id={self._id}, key={self._key!r}, {len(self._data)} bytes, "
                f"redelivery_count={self._redelivery_count})")
