"""Dead-letter and retry topics of a consumer (Pulsar's DeadLetterPolicy and retry letter topic), client-side
as in pulsar-client.

`client.subscribe(..., dead_letter_policy=DeadLetterPolicy(max_redeliver_count=N), retry_enable=...)`:

- dead letters: a message this consumer received with redelivery count >= N (it was redelivered N times) is
  remembered; when it is due for redelivery again (negative ack, ack timeout) it is published instead to the
  dead-letter topic (default "<topic>-<subscription>-DLQ") with its payload, key, event time and properties
  plus REAL_TOPIC (the topic it came from) and ORIGIN_MESSAGE_ID (its message id, LEDGER:ENTRY:PARTITION[:BATCH]),
  and once that publish has its receipt it is acknowledged on its own topic. The application so sees a message
  at most N + 1 times. If the publish fails, the message is redelivered as usual (nothing is lost);
- retry: with `retry_enable`, the consumer also subscribes (same subscription name and type) to the retry topic
  (default "<topic>-<subscription>-RETRY"). `consumer.reconsume_later(msg, delay_ms)` publishes the message to
  it as a delayed message (deliver after delay_ms), with RECONSUMETIMES (1 + the count it had), DELAY_TIME,
  REAL_TOPIC, ORIGIN_MESSAGE_ID (the first ones are kept) and RETRY_TOPIC, waits for the receipt and
  acknowledges the original; once RECONSUMETIMES would exceed N it goes to the dead-letter topic instead;
- only on Shared and Key_Shared subscriptions (BAD_REQUEST otherwise), as in Pulsar: only they redeliver a
  message individually and honour a delivery time.

The producers of both topics are created with the consumer and closed with it; a topic that does not exist
yet is created (non-partitioned) first, as Pulsar's automatic topic creation would. Properties names are Pulsar's (RetryMessageUtil).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from bksim.client.errors import ClientError
from bksim.client.types import Message, SubscriptionType
from bksim.model.status import TopicStatus

log = logging.getLogger("bksim.client")

DLQ_SUFFIX = "-DLQ"
RETRY_SUFFIX = "-RETRY"
REAL_TOPIC = "REAL_TOPIC"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RECONSUMETIMES = "RECONSUMETIMES"
DELAY_TIME = "DELAY_TIME"
RETRY_TOPIC = "RETRY_TOPIC"


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """max_redeliver_count >= 1; topic names default to "<topic>-<subscription>-DLQ" / "-RETRY"."""
    max_redeliver_count: int
    dead_letter_topic: str | None = None
    retry_letter_topic: str | None = None


def resolve(policy: DeadLetterPolicy, topic: str, subscription: str, kind: SubscriptionType,
            retry_enable: bool) -> tuple[str, str | None]:
    """(dead-letter topic, retry topic or None); BAD_REQUEST for a policy that cannot apply."""
    if not isinstance(policy, DeadLetterPolicy):
        raise ClientError(TopicStatus.BAD_REQUEST, f"dead_letter_policy must be a DeadLetterPolicy, not {policy!r}")
    if not isinstance(policy.max_redeliver_count, int) or policy.max_redeliver_count < 1:
        raise ClientError(TopicStatus.BAD_REQUEST,
                          f"max_redeliver_count must be an int >= 1, not {policy.max_redeliver_count!r}")
    if kind not in (SubscriptionType.Shared, SubscriptionType.KeyShared):
        raise ClientError(TopicStatus.BAD_REQUEST, f"dead-letter and retry topics need a Shared or Key_Shared "
                                                   f"subscription, not {kind.name}")
    dlq = policy.dead_letter_topic or f"{topic}-{subscription}{DLQ_SUFFIX}"
    retry = (policy.retry_letter_topic or f"{topic}-{subscription}{RETRY_SUFFIX}") if retry_enable else None
    if dlq == topic or retry == topic or (retry is not None and retry == dlq):
        raise ClientError(TopicStatus.BAD_REQUEST, f"the dead-letter topic ({dlq}), the retry topic ({retry}) and "
                                                   f"the topic ({topic}) must all differ")
    return dlq, retry


def dead_letter_properties(msg: Message) -> dict[str, str]:
    props = dict(msg.properties())
    props.setdefault(REAL_TOPIC, msg.topic_name())   # a retried message keeps the topic it first came from
    props.setdefault(ORIGIN_MESSAGE_ID, str(msg.message_id()))
    return props


def retry_properties(msg: Message, retry_topic: str, delay_ms: int) -> dict[str, str]:
    props = dead_letter_properties(msg)
    props[RECONSUMETIMES] = str(reconsume_times(msg) + 1)
    props[DELAY_TIME] = str(delay_ms)
    props[RETRY_TOPIC] = retry_topic
    return props


def reconsume_times(msg: Message) -> int:
    try:
        return int(msg.properties().get(RECONSUMETIMES, "0"))
    except ValueError:
        return 0


def _producer(client, topic: str, batching_enabled: bool):
    try:
        client.create_topic(topic)
    except ClientError as e:
        if e.status != TopicStatus.ALREADY_EXISTS:
            raise
    return client.create_producer(topic, batching_enabled=batching_enabled)


class DeadLetter:
    """The producers of one consumer's dead-letter (and retry) topic. Created on the application's thread."""

    def __init__(self, client, policy: DeadLetterPolicy, dlq_topic: str, retry_topic: str | None) -> None:
        self.policy = policy
        self.dlq_topic = dlq_topic
        self.retry_topic = retry_topic
        self.dlq = _producer(client, dlq_topic, batching_enabled=True)
        self.retry = None
        try:
            if retry_topic is not None:
                self.retry = _producer(client, retry_topic, batching_enabled=False)
        except ClientError:
            self.dlq.close()
            raise

    def send_to_dlq_async(self, msg: Message, callback) -> None:
        """Publish `msg` to the dead-letter topic; `callback(error, message_id)` on the client's thread."""
        self.dlq.send_async(msg.data(), callback, key=msg.key(), properties=dead_letter_properties(msg),
                            event_time_ms=msg.event_timestamp())

    def reconsume_later(self, msg: Message, delay_ms: int) -> str:
        """Publish `msg` to the retry topic after `delay_ms` (or to the dead-letter topic once it was retried
        max_redeliver_count times) and wait for the receipt; returns the topic it went to."""
        if self.retry is None:
            raise ClientError(TopicStatus.BAD_REQUEST, "reconsume_later needs a consumer subscribed with "
                                                       "retry_enable=True and a dead_letter_policy")
        if not isinstance(delay_ms, int) or delay_ms < 0:
            raise ClientError(TopicStatus.BAD_REQUEST, f"delay_ms must be an int >= 0, not {delay_ms!r}")
        if reconsume_times(msg) + 1 > self.policy.max_redeliver_count:
            self.dlq.send(msg.data(), key=msg.key(), properties=dead_letter_properties(msg),
                          event_time_ms=msg.event_timestamp())
            return self.dlq_topic
        self.retry.send(msg.data(), key=msg.key(), properties=retry_properties(msg, self.retry_topic, delay_ms),
                        event_time_ms=msg.event_timestamp(), deliver_after_ms=delay_ms or None)
        return self.retry_topic

    def close(self) -> None:
        for p in (self.dlq, self.retry):
            if p is not None:
                try:
                    p.close()
                except ClientError as e:
                    log.warning("dead-letter producer on %s: close failed: %s", p.topic(), e)
