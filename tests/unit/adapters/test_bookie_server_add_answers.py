"""AddEntries answers (adapters/bookie_server.py, adapters/bookie_client.py) over a controlled engine, without a
network: answers that are ready together leave in one AddResponse (the first request's answer, the others in
`next`, in request order); an answer not ready yet is held back and leaves later, still in order; the client's
AddStream resolves every request's future from such a message."""
from __future__ import annotations

import asyncio

from bksim.adapters.bookie_client import AddStream
from bksim.adapters.bookie_server import BookieServicer
from bksim.gen import bookie_pb2
from bksim.model.config import BookieConfig
from bksim.model.status import StatusCode
from fakes.streams import ScriptedCall
from helpers import wait_until_async

OK = StatusCode.OK
KEY = b"k" * 32


class ControlledBatch:
    """An engine add batch whose durability the test decides."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.durable = asyncio.get_running_loop().create_future()

    def ready(self) -> bool:
        return self.durable.done()

    async def result(self):
        await self.durable
        return [OK] * self.n, ""


class ControlledEngine:
    def __init__(self) -> None:
        self.batches: list[ControlledBatch] = []

    def start_adds(self, items):
        batch = ControlledBatch(len(items))
        self.batches.append(batch)
        return batch

    def start_adds_compact(self, entries, master_key, flags):
        return self.start_adds(entries)


def request(batch_id: int, n: int = 2) -> bookie_pb2.AddRequest:
    return bookie_pb2.AddRequest(batch_id=batch_id, data=[b"e" * 40] * n, master_key=KEY)


async def requests_from(queue: asyncio.Queue):
    while (item := await queue.get()) is not None:
        yield item


def answered(message: bookie_pb2.AddResponse) -> list[tuple[int, int]]:
    """(batch id, statuses) of the message's answers, in the order they ride."""
    return [(a.batch_id, len(a.statuses)) for a in (message, *message.next)]


def test_answers_ready_together_share_one_message_and_a_late_one_keeps_its_place():
    async def main():
        engine = ControlledEngine()
        servicer = BookieServicer(engine, BookieConfig(), "b", log=lambda line: None)
        incoming: asyncio.Queue = asyncio.Queue()
        answers = servicer.AddEntries(requests_from(incoming), None)
        for batch_id, n in ((1, 2), (2, 3), (3, 1), (4, 2)):
            incoming.put_nowait(request(batch_id, n))
        message = asyncio.ensure_future(answers.__anext__())  # the handler starts reading the requests
        await wait_until_async(lambda: len(engine.batches) == 4, 5.0)
        first, second, third, fourth = engine.batches
        for batch in (first, second, fourth):  # the third is not durable yet: it holds the fourth back
            batch.durable.set_result(None)
        assert answered(await message) == [(1, 2), (2, 3)]
        message = asyncio.ensure_future(answers.__anext__())
        third.durable.set_result(None)
        assert answered(await message) == [(3, 1), (4, 2)]
        message = asyncio.ensure_future(answers.__anext__())
        incoming.put_nowait(request(5, 1))
        await wait_until_async(lambda: len(engine.batches) == 5, 5.0)
        engine.batches[4].durable.set_result(None)
        assert answered(await message) == [(5, 1)]
        incoming.put_nowait(None)  # the client half-closes: every request was answered, the stream ends
        assert [m async for m in answers] == []
        assert servicer.statistics()["add_answer_messages"] == 3
    asyncio.run(main())


def one_message(taken: list[bookie_pb2.AddRequest]) -> list[bookie_pb2.AddResponse]:
    """Every request answered OK in one message."""
    first, *rest = [bookie_pb2.AddResponse(batch_id=r.batch_id, statuses=[OK] * len(r.data)) for r in taken]
    first.next.extend(rest)
    return [first]


class OneMessageStub:
    def __init__(self, expected: int) -> None:
        self._expected = expected

    def AddEntries(self, requests):
        return ScriptedCall(requests, self._expected, one_message)


def test_the_client_resolves_each_request_from_a_message_with_next():
    async def main():
        stream = AddStream(OneMessageStub(3), window_max=8, response_timeout_s=5.0, bookie="b")
        futures = [await stream.send(batch_id, [(b"e" * 40, KEY, 0)] * n) for batch_id, n in ((7, 2), (8, 1), (9, 3))]
        results = await asyncio.gather(*futures)
        assert [(r.batch_id, r.statuses) for r in results] == [(7, [OK] * 2), (8, [OK]), (9, [OK] * 3)]
        assert stream.answered == 3
        await stream.close()
    asyncio.run(main())
