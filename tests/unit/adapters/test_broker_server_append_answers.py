"""Append answers (adapters/broker_server.py, adapters/broker_client.py) over a controlled ledger handle, without a
network: the answers to requests acknowledged together leave in one AppendResponse (the first request's answer,
the others in `next`, in request order); an answer not ready yet is held back and leaves later, still in order;
a failed request ends the stream after the answers before it, never riding with them; the client's AppendStream
resolves every request's future from such a message and fails the stream on an answer out of order."""
from __future__ import annotations

import asyncio

import pytest

from bksim.adapters.broker_client import AppendStream, BrokerCallError
from bksim.adapters.broker_server import ANSWERS_PER_MESSAGE_MAX, BrokerServicer
from bksim.gen import broker_pb2
from bksim.model.config import BrokerConfig
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus
from fakes.streams import ScriptedCall
from helpers import wait_until_async

LEDGER = 7
PASSWORD = b"pw"


class _Writer:
    last_add_pushed = -1


class ControlledHandle:
    """A ledger handle whose acknowledgements the test decides: one future per appended request."""

    def __init__(self) -> None:
        self.writer = _Writer()
        self.last_add_confirmed = -1
        self.acks: list[asyncio.Future] = []

    async def wait_for_room(self) -> None:
        pass

    def append_many(self, payloads: list[bytes]) -> asyncio.Future:
        self.writer.last_add_pushed += len(payloads)
        future = asyncio.get_running_loop().create_future()
        self.acks.append(future)
        return future

    def acknowledge(self, i: int) -> None:
        self.last_add_confirmed = self.writer.last_add_pushed
        self.acks[i].set_result(None)


class ControlledService:
    def __init__(self) -> None:
        self.handle = ControlledHandle()

    async def appender(self, ledger_id: int, password: bytes) -> ControlledHandle:
        assert (ledger_id, password) == (LEDGER, PASSWORD)
        return self.handle


class RecordingContext:
    def __init__(self) -> None:
        self.messages: list[broker_pb2.AppendResponse] = []
        self.aborted: tuple | None = None

    async def write(self, message: broker_pb2.AppendResponse) -> None:
        self.messages.append(message)

    def set_trailing_metadata(self, metadata) -> None:
        pass

    async def abort(self, code, details: str) -> None:
        self.aborted = (code, details)
        raise asyncio.CancelledError  # what grpc.aio's abort does to the handler: it never returns


def append(request_id: int, n: int) -> broker_pb2.AppendRequest:
    return broker_pb2.AppendRequest(ledger_id=LEDGER, password=PASSWORD, request_id=request_id,
                                    payloads=[b"p" * 10] * n)


async def requests_from(queue: asyncio.Queue):
    while (item := await queue.get()) is not None:
        yield item


def answered(message: broker_pb2.AppendResponse) -> list[tuple[int, int, int]]:
    """(request id, first entry id, count) of the message's answers, in the order they ride."""
    return [(a.request_id, a.first_entry_id, a.count) for a in (message, *message.next)]


def start(incoming: asyncio.Queue) -> tuple[ControlledService, RecordingContext, asyncio.Task]:
    service = ControlledService()
    context = RecordingContext()
    servicer = BrokerServicer(service, BrokerConfig(), log=lambda line: None)
    return service, context, asyncio.get_running_loop().create_task(
        servicer.Append(requests_from(incoming), context))


def test_answers_acknowledged_together_share_one_message_and_a_late_one_keeps_its_place():
    async def main():
        incoming: asyncio.Queue = asyncio.Queue()
        service, context, call = start(incoming)
        handle = service.handle
        for request_id, n in ((1, 2), (2, 3), (3, 1), (4, 2)):
            incoming.put_nowait(append(request_id, n))
        await wait_until_async(lambda: len(handle.acks) == 4, 5.0)
        for i in (0, 1, 3):  # the third is not acknowledged yet: it holds the fourth back
            handle.acknowledge(i)
        await wait_until_async(lambda: len(context.messages) == 1, 5.0)
        assert answered(context.messages[0]) == [(1, 0, 2), (2, 2, 3)]
        handle.acknowledge(2)
        await wait_until_async(lambda: len(context.messages) == 2, 5.0)
        assert answered(context.messages[1]) == [(3, 5, 1), (4, 6, 2)]
        incoming.put_nowait(append(5, 1))
        await wait_until_async(lambda: len(handle.acks) == 5, 5.0)
        handle.acknowledge(4)
        await wait_until_async(lambda: len(context.messages) == 3, 5.0)
        assert answered(context.messages[2]) == [(5, 8, 1)]
        incoming.put_nowait(None)  # the client half-closes: every request was answered, the stream ends
        await asyncio.wait_for(call, 5.0)
        assert len(context.messages) == 3 and context.aborted is None
    asyncio.run(main())


def test_one_message_carries_at_most_its_bound_of_answers():
    async def main():
        incoming: asyncio.Queue = asyncio.Queue()
        service, context, call = start(incoming)
        n = 2 * ANSWERS_PER_MESSAGE_MAX + 1
        for request_id in range(1, n + 1):
            incoming.put_nowait(append(request_id, 1))
        await wait_until_async(lambda: len(service.handle.acks) == n, 5.0)
        for i in range(n):
            service.handle.acknowledge(i)
        await wait_until_async(lambda: sum(len(answered(m)) for m in context.messages) == n, 5.0)
        incoming.put_nowait(None)
        await asyncio.wait_for(call, 5.0)
        assert [len(answered(m)) for m in context.messages] == [ANSWERS_PER_MESSAGE_MAX] * 2 + [1]
        assert [a[0] for m in context.messages for a in answered(m)] == list(range(1, n + 1))
    asyncio.run(main())


def test_a_half_close_right_behind_the_last_request_ends_the_stream_after_its_answer():
    async def main():
        incoming: asyncio.Queue = asyncio.Queue()
        service, context, call = start(incoming)
        incoming.put_nowait(append(1, 3))
        incoming.put_nowait(None)  # read with the request: the end waits in the queue behind it
        await wait_until_async(lambda: len(service.handle.acks) == 1, 5.0)
        service.handle.acknowledge(0)
        await asyncio.wait_for(call, 5.0)
        assert [answered(m) for m in context.messages] == [[(1, 0, 3)]] and context.aborted is None
    asyncio.run(main())


def test_a_failed_request_ends_the_stream_after_the_answers_before_it():
    async def main():
        incoming: asyncio.Queue = asyncio.Queue()
        service, context, call = start(incoming)
        handle = service.handle
        for request_id in (1, 2, 3):
            incoming.put_nowait(append(request_id, 1))
        await wait_until_async(lambda: len(handle.acks) == 3, 5.0)
        handle.acknowledge(0)
        handle.acks[1].set_exception(LedgerError(LedgerStatus.NOT_ENOUGH_BOOKIES, "ensemble change failed"))
        handle.acknowledge(2)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 5.0)
        assert [answered(m) for m in context.messages[:-1]] == [[(1, 0, 1)]]
        last = context.messages[-1]
        assert (last.error, last.message, list(last.next)) == (
            broker_pb2.LedgerStatus.NOT_ENOUGH_BOOKIES, "ensemble change failed", [])
        assert context.aborted is not None and context.aborted[1] == "ensemble change failed"
    asyncio.run(main())


class ScriptedStub:
    def __init__(self, expected: int, answer) -> None:
        self._expected, self._answer = expected, answer

    def Append(self, requests):
        return ScriptedCall(requests, self._expected,
                            lambda taken: self._answer([(r.request_id, len(r.payloads)) for r in taken]))


def one_message(ids, order=lambda ids: ids):
    first_entry = {}
    entry = 0
    for request_id, n in ids:
        first_entry[request_id] = entry
        entry += n
    first, *rest = [broker_pb2.AppendResponse(request_id=i, first_entry_id=first_entry[i], count=n,
                                              last_add_confirmed=entry - 1) for i, n in order(ids)]
    first.next.extend(rest)
    return [first]


def test_the_client_resolves_each_request_from_a_message_with_next():
    async def main():
        stream = AppendStream(ScriptedStub(3, one_message), "broker", LEDGER, PASSWORD, window_max=8,
                              response_timeout_s=5.0)
        futures = [await stream.send([b"p"] * n) for n in (2, 1, 3)]
        results = await asyncio.wait_for(asyncio.gather(*futures), 5.0)
        assert [(r.first_entry_id, r.count, r.last_add_confirmed) for r in results] == [(0, 2, 5), (2, 1, 5),
                                                                                        (3, 3, 5)]
        assert stream.answered == 3 and stream.entries_acknowledged == 6
        await stream.close()
    asyncio.run(main())


def test_the_client_fails_the_stream_on_an_answer_out_of_order_inside_a_message():
    async def main():
        swapped = lambda ids: one_message(ids, order=lambda ids: [ids[0], ids[2], ids[1]])  # noqa: E731
        stream = AppendStream(ScriptedStub(3, swapped), "broker", LEDGER, PASSWORD, window_max=8,
                              response_timeout_s=5.0)
        futures = [await stream.send([b"p"]) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 5.0)
        assert results[0].count == 1
        assert all(isinstance(r, BrokerCallError) and "expected" in str(r) for r in results[1:]), results
        assert stream.answered == 1
        await stream.close()
    asyncio.run(main())
