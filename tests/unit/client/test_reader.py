"""The reader's position logic (client/reader.py), pure: whether a message comes after the point a partition
resumes from, given the topic's last entry; and the start values create_reader accepts."""
from __future__ import annotations

import pytest

from bksim.client import ClientError, InitialPosition, MessageId
from bksim.client.reader import _Resume, _start
from bksim.gen import topic_pb2


def last(ledger, entry):
    return topic_pb2.LastMessageId(ledger_id=ledger, entry_id=entry)


def test_more_after_a_message_id():
    after = _Resume(MessageId(5, 3), False, InitialPosition.Latest, 0)
    assert after.more_before(last(5, 4)) and after.more_before(last(6, 0))
    assert not after.more_before(last(5, 3)) and not after.more_before(last(5, -1))
    assert _Resume(MessageId(5, 3), True, InitialPosition.Latest, 0).more_before(last(5, 3))
    # from a position before a ledger's first entry (Subscribed.start of an empty topic, a seek's answer)
    assert _Resume(MessageId(5, -1), False, InitialPosition.Latest).more_before(last(5, 0))


def test_more_inside_a_batch():
    read_mid_batch = _Resume(MessageId(5, 3, -1, 1), False, InitialPosition.Latest, 4)
    assert read_mid_batch.more_before(last(5, 3))       # indexes 2 and 3 of the entry follow
    read_last_of_batch = _Resume(MessageId(5, 3, -1, 3), False, InitialPosition.Latest, 4)
    assert not read_last_of_batch.more_before(last(5, 3))
    start_in_batch = _Resume(MessageId(5, 3, -1, 1), False, InitialPosition.Latest, -1)   # size not known yet
    assert start_in_batch.more_before(last(5, 3))


@pytest.mark.parametrize("value, expected", [
    (MessageId(1, 2, -1, 0), (MessageId(1, 2, -1, 0), InitialPosition.Latest)),
    ((1, 2, 0, -1), (MessageId(1, 2, 0, -1), InitialPosition.Latest)),
    ("earliest", (None, InitialPosition.Earliest)), (InitialPosition.Latest, (None, InitialPosition.Latest)),
])
def test_start_values(value, expected):
    assert _start(value) == expected


def test_a_bad_start_value_is_bad_request():
    with pytest.raises(ClientError) as e:
        _start("12:3")
    assert e.value.status == "BAD_REQUEST"
