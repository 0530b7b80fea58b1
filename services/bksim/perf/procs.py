"""The helper processes of one benchmark run (echo server, audit job, py-spy), over bksim.adapters.processes,
and the benchmark's own event loops (a cluster's processes are adapters.local_cluster's).

Every process started through a `ProcessGroup` is stopped by `stop_all()` (SIGTERM, bounded wait, then
SIGKILL, by pid), which the benchmarks call in a `finally`, so Ctrl-C or an exception never leaves a server
behind. Only pids this group started are ever signalled.

`run_interruptible(coro)` is the benchmarks' `asyncio.run`: Ctrl-C or SIGTERM cancels the coroutine at its
next await instead of raising KeyboardInterrupt wherever the main thread happens to be. A KeyboardInterrupt
raised inside gRPC aio's callbacks or its teardown (the channel's dealloc joins the completion-queue poller
thread, an interruptible wait) leaves the completion queue half torn down while its poller thread still runs;
the process then aborts in native code ("corrupted double-linked list", abseil "Mutex corrupt") before its
`finally` blocks have stopped the children.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

from bksim.adapters import processes
from bksim.adapters.processes import INTERRUPTS, interrupts_deferred  # noqa: F401 - the benchmarks take it from here
from bksim.adapters.ports import free_port  # noqa: F401 - the benchmarks take it from here

T = TypeVar("T")

STOP_GRACE_S = 15.0  # a bookie drains and checkpoints on SIGTERM; give it time before SIGKILL


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, where SIGINT and SIGTERM cancel the coroutine (at its next await: its `finally` and
    `async with` blocks close their gRPC channels) and then raise KeyboardInterrupt, once the loop is closed and
    the objects it made are collected. Until then a signal is only recorded: nothing is raised inside the loop,
    a gRPC callback or a gRPC object's teardown. Off the main thread it is plain asyncio.run."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    caught: list[int] = []
    running: dict[str, Any] = {}  # "loop", "task" while the coroutine runs

    def on_signal(signum: int, frame) -> None:
        # every signal cancels (again): Python 3.11's wait_for swallows a cancellation that arrives as its inner
        # future completes, and the benchmark then runs on to its bound unless interrupted once more
        caught.append(signum)
        if running:
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime: the record is enough
                running["loop"].call_soon_threadsafe(running["task"].cancel)

    async def main() -> T:
        running.update(loop=asyncio.get_running_loop(), task=asyncio.current_task())
        try:
            if caught:  # interrupted while the loop was starting
                raise asyncio.CancelledError
            return await coro
        finally:
            running.clear()

    previous = {sig: signal.signal(sig, on_signal) for sig in INTERRUPTS}
    try:
        try:
            result = asyncio.run(main())
        except BaseException:
            if not caught:
                raise
            result = None  # what the interrupted coroutine raised is a consequence of the interrupt
        finally:
            coro.close()  # never started (interrupted early): no "never awaited" warning
            gc.collect()  # gRPC objects of the closed loop are torn down here, while signals are only recorded
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        raise KeyboardInterrupt
    return result


@dataclass
class Child:
    name: str
    pid: int
    log_path: str

    def alive(self) -> bool:
        return processes.is_alive(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        return processes.tail(self.log_path, lines)


@dataclass
class ProcessGroup:
    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], log_path: str, env: dict[str, str] | None = None) -> Child:
        with interrupts_deferred():  # a Ctrl-C between the fork and the append would orphan the child
            child = Child(name, processes.spawn(argv, env, log_path), log_path)
            self.children.append(child)
        return child

    def stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop one child; True when it is gone."""
        gone = processes.stop(child.pid, grace_s)
        if gone and child in self.children:
            self.children.remove(child)
        return gone

    def stop_all(self) -> None:
        """Stop every child, newest first; report any that would not go."""
        for child in reversed(list(self.children)):
            try:
                if not self.stop(child):
                    print(f"# {child.name} (pid {child.pid}) did not stop", file=sys.stderr)
            except Exception as e:  # keep stopping the others
                print(f"# could not stop {child.name} (pid {child.pid}): {e}", file=sys.stderr)
