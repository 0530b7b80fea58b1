"""A deterministic, virtual-time asyncio event loop for the simulator.

Owns: the virtual clock (`time()`), the order in which callbacks run, and the refusal of everything that
would make a run depend on the outside world (threads, sockets, pipes, signals).

Invariants:
- Time is virtual, counted in integer nanoseconds from 0 (`time()` is that in seconds). It moves only when
  nothing is ready to run: then the loop jumps to the earliest timer instead of waiting. `block_ms()`
  moves it while a callback runs (a call that blocks the loop's thread, like an fdatasync on the loop).
  It never moves backwards.
- A timer with a positive delay is due at least 1 ns later, so it always sees time advance. (With float
  seconds, `now + tiny` rounds to `now`: a loop like "wait_for(event, deadline - now)" would then spin
  forever at a frozen time, which no real clock allows.)
- Order is deterministic: `call_soon` callbacks run FIFO; timers run by due time, ties in the order they
  were scheduled.
- Tasks and futures hash by creation order, not by address: sets of tasks (asyncio.wait, TaskGroup,
  all_tasks) iterate in the same order in every run of a seed.
- No threads: `run_in_executor` (and so `asyncio.to_thread`) raises SimThreadsRefused. No sockets, no
  pipes, no signals: there is no selector; the loop never polls for I/O.
- `after_step`, when set, runs after every iteration (the world's invariant checks); it must not schedule
  anything, so setting it leaves a seed's trace unchanged.
- Nothing ready and no timer pending while the main coroutine is unfinished is a deadlock: SimDeadlock.
  More than SAME_TIME_ITERATIONS_MAX iterations without time moving is a livelock: SimLivelock.

Must not: read the wall clock, sleep for real, or iterate over anything in an address-dependent order.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from bksim.model.errors import BksimError

T = TypeVar("T")
_NS_PER_S = 1_000_000_000
# like BaseEventLoop: rebuild the timer heap when more than half of 100+ timers are cancelled
_CANCELLED_TIMERS_MIN = 100
_CANCELLED_TIMERS_FRACTION = 0.5
# iterations that run callbacks without virtual time moving: beyond this, tasks are spinning (a livelock)
SAME_TIME_ITERATIONS_MAX = 1_000_000


class SimulationError(BksimError):
    """The simulated world was used in a way it does not support."""


class SimThreadsRefused(SimulationError):
    pass


class SimDeadlock(SimulationError):
    pass


class SimLivelock(SimulationError):
    pass


class _SimTask(asyncio.Task):
    """A Task whose hash is its creation sequence number (deterministic set order)."""

    def __init__(self, coro, *, loop, name=None, context=None) -> None:
        self.sim_seq = loop._next_seq()  # before Task.__init__, which puts the task in a WeakSet (hashes it)
        super().__init__(coro, loop=loop, name=name, context=context)

    def __hash__(self) -> int:
        return self.sim_seq


class _SimFuture(asyncio.Future):
    """A Future whose hash is its creation sequence number."""

    def __init__(self, *, loop) -> None:
        self.sim_seq = loop._next_seq()
        super().__init__(loop=loop)

    def __hash__(self) -> int:
        return self.sim_seq


class _SimTimerHandle(asyncio.TimerHandle):
    """A TimerHandle due at an integer virtual nanosecond, ordered by (due time, scheduling sequence)."""

    __slots__ = ("sim_when_ns", "sim_seq")

    def __init__(self, when_ns: int, seq: int, callback, args, loop, context=None) -> None:
        super().__init__(when_ns / _NS_PER_S, callback, args, loop, context)
        self.sim_when_ns, self.sim_seq = when_ns, seq

    def __lt__(self, other) -> bool:
        return (self.sim_when_ns, self.sim_seq) < (other.sim_when_ns, other.sim_seq)

    def __le__(self, other) -> bool:
        return (self.sim_when_ns, self.sim_seq) <= (other.sim_when_ns, other.sim_seq)

    def __gt__(self, other) -> bool:
        return (self.sim_when_ns, self.sim_seq) > (other.sim_when_ns, other.sim_seq)

    def __ge__(self, other) -> bool:
        return (self.sim_when_ns, self.sim_seq) >= (other.sim_when_ns, other.sim_seq)


class SimLoop(asyncio.BaseEventLoop):
    """BaseEventLoop with a virtual clock and no I/O. `seed` is only remembered (for messages)."""

    def __init__(self, seed: int = 0) -> None:
        self._seq = itertools.count()
        self._now_ns = 0
        self._same_time_iterations = 0
        self._same_time_ns = 0
        super().__init__()
        self.seed = seed
        self.set_task_factory(lambda loop, coro, **kw: _SimTask(coro, loop=loop, **kw))
        self.uncaught: list[str] = []  # exception-handler messages (kept out of traces: GC timing varies)
        self.after_step: Callable[[], None] | None = None
        self.set_exception_handler(self._record_uncaught)

    def _next_seq(self) -> int:
        return next(self._seq)

    # -- time --------------------------------------------------------------------------------------------
    def time(self) -> float:
        return self._now_ns / _NS_PER_S

    def block_ms(self, ms: float) -> None:
        """The running callback blocked the loop's thread for `ms` milliseconds (e.g. an fdatasync)."""
        assert ms >= 0, f"time cannot go backwards ({ms} ms)"
        self._now_ns += math.ceil(ms * 1_000_000)

    def call_later(self, delay, callback, *args, context=None):
        if delay is None:
            raise TypeError("delay cannot be None")
        delay_ns = math.ceil(delay * _NS_PER_S) if delay > 0 else 0
        return self._schedule(self._now_ns + max(delay_ns, 1 if delay > 0 else 0), callback, args, context)

    def call_at(self, when, callback, *args, context=None):
        if when is None:
            raise TypeError("when cannot be None")
        when_ns = math.ceil(when * _NS_PER_S)
        if when > self.time() and when_ns <= self._now_ns:
            when_ns = self._now_ns + 1
        return self._schedule(when_ns, callback, args, context)

    def _schedule(self, when_ns: int, callback, args, context) -> _SimTimerHandle:
        self._check_closed()
        timer = _SimTimerHandle(when_ns, self._next_seq(), callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """One iteration: if nothing is ready, jump to the earliest timer; move due timers to the ready
        queue; run what was ready at the start of the iteration (FIFO)."""
        scheduled = self._scheduled
        if len(scheduled) > _CANCELLED_TIMERS_MIN and \
                self._timer_cancelled_count / len(scheduled) > _CANCELLED_TIMERS_FRACTION:
            live = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    live.append(handle)
            heapq.heapify(live)
            self._scheduled = scheduled = live
            self._timer_cancelled_count = 0
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        if not self._ready and not self._stopping:
            if not scheduled:
                raise SimDeadlock(f"virtual time {self.time() * 1000.0:.3f} ms: every task is waiting and no "
                                  f"timer is scheduled: nothing can ever happen again")
            self._now_ns = max(self._now_ns, scheduled[0].sim_when_ns)
        while scheduled and scheduled[0].sim_when_ns <= self._now_ns:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            self._ready.append(handle)
        for _ in range(len(self._ready)):
            handle = self._ready.popleft()
            if not handle._cancelled:
                handle._run()
        handle = None  # break reference cycles through an exception's traceback
        if self.after_step is not None:
            self.after_step()
        if self._now_ns != self._same_time_ns:
            self._same_time_ns, self._same_time_iterations = self._now_ns, 0
        else:
            self._same_time_iterations += 1
            if self._same_time_iterations > SAME_TIME_ITERATIONS_MAX:
                raise SimLivelock(f"virtual time {self.time() * 1000.0:.3f} ms: {SAME_TIME_ITERATIONS_MAX} loop "
                                  f"iterations without time moving: tasks are spinning")

    # -- futures -----------------------------------------------------------------------------------------
    def create_future(self) -> asyncio.Future:
        return _SimFuture(loop=self)

    # -- what the simulator refuses ----------------------------------------------------------------------
    def run_in_executor(self, executor, func, *args):
        raise SimThreadsRefused("run_in_executor (or asyncio.to_thread) under the simulator: sim ports never use "
                                "threads, so code that needs one cannot run here deterministically")

    def set_default_executor(self, executor) -> None:
        raise SimThreadsRefused("the simulator has no executor")

    def _write_to_self(self) -> None:
        pass  # call_soon_threadsafe: there are no other threads to wake us

    def _process_events(self, event_list) -> None:
        pass

    def add_reader(self, *args, **kwargs):
        raise SimulationError("no file descriptors under the simulator")

    add_writer = add_reader

    def add_signal_handler(self, *args, **kwargs):
        raise SimulationError("no signals under the simulator")

    # -- errors nobody awaited ---------------------------------------------------------------------------
    def _record_uncaught(self, loop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self.uncaught.append(f"{context.get('message', '')}: {type(exc).__name__}: {exc}" if exc else
                             str(context.get("message", "")))


def run(main: Coroutine[Any, Any, T], seed: int = 0) -> T:
    """Run `main` to completion on a fresh SimLoop; then cancel what is left (in creation order) and close."""
    loop = SimLoop(seed)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


def _cancel_all(loop: SimLoop) -> None:
    pending = sorted((t for t in asyncio.all_tasks(loop) if not t.done()), key=lambda t: t.sim_seq)
    if not pending:
        return
    for task in pending:
        task.cancel()
    try:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    except SimDeadlock:
        pass  # maybe: a task that swallows its cancellation and waits forever; the loop is closed anyway
