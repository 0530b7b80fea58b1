"""Dead-letter and retry topics (client/dead_letter.py): topic names, the subscription types they apply to, and
the properties a dead-lettered or retried message carries (Pulsar's names)."""
from __future__ import annotations

import pytest

from bksim.client import ClientError, DeadLetterPolicy, Message, MessageId, SubscriptionType
from bksim.client.dead_letter import dead_letter_properties, reconsume_times, resolve, retry_properties
from bksim.model.status import TopicStatus

TOPIC = "persistent://t/ns/orders"


def message(props: dict, topic: str = TOPIC) -> Message:
    return Message(b"p", "k", props, MessageId(7, 3, -1, 2), 0, 1, 0, topic, 4)


def test_default_topic_names_and_explicit_ones():
    assert resolve(DeadLetterPolicy(3), TOPIC, "billing", SubscriptionType.Shared, False) == (
        f"{TOPIC}-billing-DLQ", None)
    assert resolve(DeadLetterPolicy(3), TOPIC, "billing", SubscriptionType.KeyShared, True) == (
        f"{TOPIC}-billing-DLQ", f"{TOPIC}-billing-RETRY")
    policy = DeadLetterPolicy(3, dead_letter_topic="persistent://t/ns/dead", retry_letter_topic="persistent://t/ns/r")
    assert resolve(policy, TOPIC, "b", SubscriptionType.Shared, True) == ("persistent://t/ns/dead",
                                                                           "persistent://t/ns/r")


@pytest.mark.parametrize("policy, kind", [
    (DeadLetterPolicy(0), SubscriptionType.Shared),
    (DeadLetterPolicy(2), SubscriptionType.Exclusive),
    (DeadLetterPolicy(2), SubscriptionType.Failover),
    (DeadLetterPolicy(2, dead_letter_topic=TOPIC), SubscriptionType.Shared),
    ("3", SubscriptionType.Shared),
])
def test_policies_that_cannot_apply_are_refused(policy, kind):
    with pytest.raises(ClientError) as info:
        resolve(policy, TOPIC, "s", kind, True)
    assert info.value.status == TopicStatus.BAD_REQUEST


def test_dead_letter_properties_keep_the_first_origin():
    props = dead_letter_properties(message({"a": "1"}))
    assert props == {"a": "1", "REAL_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": "7:3:-1:2"}
    retried = message(props | {"RECONSUMETIMES": "2"}, topic=f"{TOPIC}-s-RETRY")
    assert dead_letter_properties(retried)["REAL_TOPIC"] == TOPIC
    assert dead_letter_properties(retried)["ORIGIN_MESSAGE_ID"] == "7:3:-1:2"


def test_retry_properties_count_the_reconsumes():
    first = retry_properties(message({}), f"{TOPIC}-s-RETRY", 500)
    assert first["RECONSUMETIMES"] == "1" and first["DELAY_TIME"] == "500" and first["RETRY_TOPIC"] == f"{TOPIC}-s-RETRY"
    second = retry_properties(message(first, topic=f"{TOPIC}-s-RETRY"), f"{TOPIC}-s-RETRY", 900)
    assert second["RECONSUMETIMES"] == "2" and second["REAL_TOPIC"] == TOPIC
    assert reconsume_times(message({"RECONSUMETIMES": "junk"})) == 0
