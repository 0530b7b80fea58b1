"""Readers (topics/non_durable_cursor.py): where a reader starts (pure, over FakeLayout) and how a non-durable
subscription dispatches (over a real ManagedLedger on the in-memory store and FakeBookies): from a message id
exclusive or inclusive, inside a batch, refusing malformed and unknown ids, and consuming as it sends."""
from __future__ import annotations

import asyncio

import pytest

from bksim.formats.message import Message, encode_entry
from bksim.model.config import TopicConfig
from bksim.model.status import TopicStatus
from bksim.topics.errors import TopicError
from bksim.topics.non_durable_cursor import NonDurableCursor, reader_start
from bksim.topics.positions import MessageId, Position
from bksim.topics.subscription import Subscription
from fakes.clock import ManualClock
from fakes.layout import FakeLayout
from helpers import wait_until_async
from tests.unit.topics.test_managed_ledger import world
from tests.unit.topics.test_subscription import Sink


def start(layout, mid=None, initial="earliest", inclusive=False):
    return reader_start(layout, message_id=mid, initial=initial, inclusive=inclusive)


def test_start_positions_earliest_latest_and_message_ids():
    layout = FakeLayout([(3, 4), (7, 5)])  # ledger 3: entries 0..3, ledger 7: entries 0..4 (7:4 is the last)
    assert start(layout) == (Position(3, -1), None, frozenset())
    assert start(layout, initial="latest") == (Position(7, 4), None, frozenset())
    assert start(layout, initial="latest", inclusive=True) == (Position(7, 3), None, frozenset())
    assert start(layout, MessageId(3, 2)) == (Position(3, 2), None, frozenset())            # after 3:2
    assert start(layout, MessageId(3, 2), inclusive=True) == (Position(3, 1), None, frozenset())
    assert start(layout, MessageId(7, 0), inclusive=True) == (Position(7, -1), None, frozenset())
    # inside a batch: the entry is delivered with the messages before the start reported as acknowledged
    assert start(layout, MessageId(7, 1, -1, 2)) == (Position(7, 0), Position(7, 1), frozenset({0, 1, 2}))
    assert start(layout, MessageId(7, 1, -1, 2), inclusive=True) == (Position(7, 0), Position(7, 1),
                                                                     frozenset({0, 1}))
    assert start(layout, MessageId(7, 1, -1, 0), inclusive=True) == (Position(7, 0), None, frozenset())
    # before the first entry (a trimmed ledger): from the first entry left
    assert start(layout, MessageId(1, 9)) == (Position(3, -1), None, frozenset())
    # a position "before ledger L" (entry -1, exclusive): from that ledger on, or from the next ledger when it is gone
    assert start(layout, MessageId(7, -1)) == (Position(7, -1), None, frozenset())
    assert start(layout, MessageId(5, -1)) == (Position(7, -1), None, frozenset())
    assert start(layout, MessageId(1, -1)) == (Position(3, -1), None, frozenset())


@pytest.mark.parametrize("mid, words", [
    (MessageId(-1, 0), "malformed"), (MessageId(3, -2), "malformed"), (MessageId(3, 0, -1, -2), "malformed"),
    (MessageId(3, -1, -1, 0), "malformed"), (MessageId(8, -1), "after every ledger"),
    (MessageId(7, 5), "not a message of this topic"),   # after the last one
    (MessageId(5, 0), "not a message of this topic"),   # a ledger the topic does not have
    (MessageId(9, 0), "not a message of this topic"),
])
def test_bad_start_message_ids_are_refused_with_bad_request(mid, words):
    layout = FakeLayout([(3, 4), (7, 5)])
    with pytest.raises(TopicError) as e:
        start(layout, mid)
    assert e.value.status is TopicStatus.BAD_REQUEST and words in e.value.message


async def _reader(mid, inclusive, entries):
    _, _, [ml] = await world()
    await ml.open()
    positions = []
    for i, count in enumerate(entries):
        batch = [Message(b"e%d-m%d" % (i, j), sequence_id=i * 10 + j) for j in range(count)]
        positions.append(await ml.append(encode_entry(batch, producer_name="p", publish_time_ms=i,
                                                      batch=count > 1)))
    md, skip_at, skip = reader_start(ml, message_id=mid(positions) if mid else None, initial="earliest",
                                     inclusive=inclusive)
    cursor = NonDurableCursor(ml, "reader-1", config=TopicConfig(), mark_delete=md, skip_position=skip_at,
                              skip_indexes=skip)
    sub = Subscription(topic="persistent://t/ns/r", name="reader-1", sub_type="Exclusive", cursor=cursor, ml=ml,
                       clock=ManualClock(sleeps_advance=True), config=TopicConfig(), durable=False)
    return ml, positions, sub


def test_a_reader_starts_inside_a_batch_and_consumes_as_it_sends():
    async def main():
        ml, positions, sub = await _reader(lambda p: MessageId(p[1].ledger, p[1].entry, -1, 1), False, [1, 4, 1])
        sink = Sink()
        consumer = sub.add_consumer("r", 0, sink, "Exclusive")
        with pytest.raises(TopicError) as e:
            sub.add_consumer("other", 0, Sink(), "Shared")
        assert e.value.status is TopicStatus.BAD_REQUEST
        sub.flow(consumer, 1_000)
        await wait_until_async(lambda: len(sink.got) == 2, 5)
        assert [d.position for d in sink.got] == positions[1:]
        assert sink.got[0].acked_batch_indexes == (0, 1)  # messages 0 and 1 of the batch are before the start
        assert sink.got[1].acked_batch_indexes == ()
        # nothing is held unacknowledged: the cursor moved with the dispatch (a reader acks as it reads)
        assert consumer.unacked_messages == 0 and not consumer.pending
        assert sub.cursor.mark_delete == positions[2] and sub.cursor.backlog() == 0
        await sub.seek(positions[0])
        await wait_until_async(lambda: len(sink.got) == 5, 5)
        assert [d.position for d in sink.got[2:]] == positions
        assert sink.got[3].acked_batch_indexes == ()  # a seek forgets the start's skipped indexes
        await sub.close()
    asyncio.run(main())


def test_a_reader_from_a_message_id_inclusive_and_exclusive():
    async def main():
        for inclusive, expect in ((False, [3, 4]), (True, [2, 3, 4])):
            ml, positions, sub = await _reader(lambda p: MessageId(p[2].ledger, p[2].entry), inclusive,
                                               [1, 1, 1, 1, 1])
            sink = Sink()
            sub.flow(sub.add_consumer("r", 0, sink, "Exclusive"), 100)
            await wait_until_async(lambda: len(sink.got) == len(expect), 5)
            await wait_until_async(lambda: sub.idle, 5)
            assert [d.position for d in sink.got] == [positions[i] for i in expect]
            await sub.close()
    asyncio.run(main())


def test_decoded_messages_of_a_delivery():
    """adapters/topic_server.received_messages: the MESSAGES format, acknowledged batch indexes left out, a
    single message with batch index -1 and size 0, an entry not in the message format as one raw message."""
    from bksim.adapters.topic_server import received_messages
    from bksim.topics.subscription import Delivery

    batch = encode_entry([Message(b"a", key="k", properties={"p": "1"}, event_time_ms=5, sequence_id=7),
                          Message(b"b", sequence_id=8), Message(b"c", key="", sequence_id=9)],
                         producer_name="prod", publish_time_ms=1234, batch=True)
    got = received_messages(Delivery(Position(4, 2), batch, 3, (1,)), partition=2)
    assert [(m.payload, m.id.batch_index, m.id.batch_size) for m in got] == [(b"a", 0, 3), (b"c", 2, 3)]
    first = got[0]
    assert (first.key, first.has_key, dict(first.properties), first.event_time_ms, first.publish_time_ms,
            first.sequence_id, first.producer_name, first.redelivery_count, first.partition) == \
        ("k", True, {"p": "1"}, 5, 1234, 7, "prod", 3, 2)
    assert (got[1].key, got[1].has_key) == ("", True)
    assert (first.id.ledger_id, first.id.entry_id) == (4, 2)
    single = encode_entry([Message(b"s", sequence_id=1)], producer_name="prod", publish_time_ms=1, batch=False)
    [m] = received_messages(Delivery(Position(4, 3), single, 0, ()), partition=-1)
    assert (m.payload, m.id.batch_index, m.id.batch_size, m.has_key) == (b"s", -1, 0, False)
    [raw] = received_messages(Delivery(Position(4, 4), b"written by hand", 0, ()), partition=-1)
    assert (raw.payload, raw.id.batch_index, raw.producer_name) == (b"written by hand", -1, "")
