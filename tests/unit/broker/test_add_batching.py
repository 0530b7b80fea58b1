"""How the broker's ledger driver (broker/driver.py) batches adds per bookie, over FakeBookies (an in-memory fake of
the bookie transport): with `add_requests_per_bookie_max` requests unanswered at a bookie, the entries for it
wait and leave together at the next answer; a bookie that answers at once sees each loop turn's entries at once;
0 is no bound. Every entry is acknowledged either way."""
from __future__ import annotations

import asyncio

from bksim.model.config import BrokerConfig
from helpers import wait_until_async
from .test_ledger_service import PW, world


async def next_turn() -> None:
    """Return after every callback already scheduled on the loop has run (the driver's flush among them)."""
    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


async def appends_behind_a_held_bookie(requests_max: int) -> tuple[list[list[int]], list[list[int]]]:
    """One entry, then ten more one loop turn apart while the ensemble holds its answers: the add calls each
    bookie saw before and after the answers are released."""
    config = BrokerConfig(speculative_read_ms=50, add_requests_per_bookie_max=requests_max)
    _, fake, [svc] = await world(config=config)
    h = await svc.create_ledger(3, 3, 2, password=PW)
    bookies = [fake[b] for b in h.metadata.ensemble]
    for b in bookies:
        b.gate = asyncio.Event()
    futures = [h.append(b"first")]
    await wait_until_async(lambda: all(b.waiting == 1 for b in bookies), 5.0)
    for i in range(10):
        futures.append(h.append(b"next-%d" % i))
        await next_turn()
    held = [list(b.add_calls) for b in bookies]
    for b in bookies:
        b.gate.set()
    assert await asyncio.gather(*futures) == list(range(11))
    return held, [b.add_calls for b in bookies]


def test_entries_for_a_bookie_with_a_request_unanswered_wait_and_leave_in_one_request():
    held, after = asyncio.run(appends_behind_a_held_bookie(1))
    assert held == [[1]] * 3  # ten loop turns passed: nothing more was sent while the first was unanswered
    assert after == [[1, 10]] * 3


def test_up_to_the_bound_requests_leave_at_once():
    held, after = asyncio.run(appends_behind_a_held_bookie(2))
    assert held == [[1, 1]] * 3  # the second request went at once; the other nine waited for an answer
    assert after == [[1, 1, 9]] * 3


def test_with_no_bound_each_loop_turn_sends_its_entries():
    held, after = asyncio.run(appends_behind_a_held_bookie(0))
    assert held == after == [[1] * 11] * 3
