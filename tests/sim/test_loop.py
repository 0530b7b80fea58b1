"""The virtual-time event loop (bksim.sim.loop): time jumps, FIFO order, timeouts in virtual time, no threads,
deadlocks and livelocks reported, deterministic hashing of tasks."""
from __future__ import annotations

import asyncio
import time

import pytest

from bksim.sim.loop import SimDeadlock, SimLivelock, SimLoop, SimThreadsRefused, run


def test_sleep_jumps_the_virtual_clock_without_waiting():
    async def main():
        loop = asyncio.get_running_loop()
        assert loop.time() == 0.0
        await asyncio.sleep(3600)
        return loop.time()
    started = time.perf_counter()
    assert run(main()) == 3600.0
    assert time.perf_counter() - started < 5.0  # an hour of virtual time, no real hour


def test_wait_for_times_out_in_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 2.5)
        return loop.time()
    assert run(main()) == 2.5


def test_call_soon_is_fifo_and_equal_timers_run_in_scheduling_order():
    async def main():
        loop = asyncio.get_running_loop()
        order = []
        for i in range(5):
            loop.call_later(1.0, order.append, f"t{i}")
        for i in range(5):
            loop.call_soon(order.append, i)
        loop.call_later(0.5, order.append, "early")
        await asyncio.sleep(2)
        return order
    assert run(main()) == [0, 1, 2, 3, 4, "early", "t0", "t1", "t2", "t3", "t4"]


def test_tasks_events_and_gather_work():
    async def worker(delay_s, out):
        await asyncio.sleep(delay_s)
        out.append(delay_s)
        return delay_s

    async def main():
        out = []
        ready = asyncio.Event()
        waiter = asyncio.get_running_loop().create_task(ready.wait())
        results = await asyncio.gather(*(worker(d, out) for d in (0.3, 0.1, 0.2)))
        ready.set()
        await waiter
        return results, out, asyncio.get_running_loop().time()
    results, out, now = run(main())
    assert results == [0.3, 0.1, 0.2] and out == [0.1, 0.2, 0.3] and now == pytest.approx(0.3)


def test_to_thread_and_executors_are_refused():
    async def main():
        with pytest.raises(SimThreadsRefused, match="threads"):
            await asyncio.to_thread(print, "never")
        with pytest.raises(SimThreadsRefused):
            await asyncio.get_running_loop().run_in_executor(None, print)
        return True
    assert run(main())


def test_a_tiny_positive_delay_still_moves_time():
    """`deadline - now` can be far below a float's resolution at `now`: the timer must still see time move,
    or a loop like the engine's `while not room: wait_for(event, deadline - now)` would spin forever."""
    async def main():
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1234.5)
        deadline_ms = loop.time() * 1000.0 + 1e-7  # 0.1 ns away: a float delay that rounds to nothing
        spins = 0
        while loop.time() * 1000.0 < deadline_ms:
            spins += 1
            assert spins < 10
            try:
                await asyncio.wait_for(asyncio.Event().wait(), (deadline_ms - loop.time() * 1000.0) / 1000.0)
            except TimeoutError:
                pass
        return spins
    assert run(main()) == 1


def test_a_deadlock_is_reported():
    async def main():
        await asyncio.Event().wait()
    with pytest.raises(SimDeadlock, match="no timer"):
        run(main())


def test_a_livelock_is_reported(monkeypatch):
    from bksim.sim import loop as sim_loop
    monkeypatch.setattr(sim_loop, "SAME_TIME_ITERATIONS_MAX", 1000)

    async def main():
        while True:
            await asyncio.sleep(0)
    with pytest.raises(SimLivelock, match="without time moving"):
        run(main())


def test_block_ms_moves_time_during_a_callback():
    async def main():
        loop = asyncio.get_running_loop()
        loop.block_ms(2.5)
        return loop.time()
    assert run(main()) == 0.0025


def test_sets_of_tasks_iterate_in_creation_order():
    """Tasks hash by creation order, so asyncio.wait's sets and all_tasks are the same in every run."""
    async def main():
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(asyncio.sleep(0.1 * (5 - i)), name=f"t{i}") for i in range(5)]
        done, pending = await asyncio.wait(tasks, timeout=0.25)
        return [t.get_name() for t in done], [t.get_name() for t in pending]
    assert run(main()) == run(main())
    assert run(main()) == (["t3", "t4"], ["t0", "t1", "t2"])


def test_run_cancels_leftover_tasks_and_closes_the_loop():
    cancelled = []

    async def forever():
        try:
            await asyncio.sleep(1e9)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(1)
        return asyncio.get_running_loop()
    loop = run(main())
    assert cancelled == [True] and isinstance(loop, SimLoop) and loop.is_closed()
