"""The benchmarks' event-loop runner (perf/procs.run_interruptible): SIGINT or SIGTERM never raises inside a loop
callback or an object's teardown (where gRPC aio's completion-queue callbacks and channel teardown run); the
coroutine is cancelled at its next await, its cleanup runs to the end, and KeyboardInterrupt comes after."""
from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest

from bksim.perf.procs import run_interruptible

WAIT_S = 30.0  # bounds every wait below; the signal arrives long before


class Torn:
    """Two steps with the signal sent between them (like a gRPC callback interrupted half-way)."""

    def __init__(self, sig: int) -> None:
        self.sig = sig
        self.steps: list[str] = []

    def run(self, name: str) -> None:
        self.steps.append(f"{name} start")
        os.kill(os.getpid(), self.sig)
        for _ in range(1000):  # bytecodes: where a raising handler would strike
            pass
        self.steps.append(f"{name} end")


class Finalized:
    """An object in a reference cycle whose finalizer gets the signal half-way (a gRPC channel's dealloc)."""

    def __init__(self, torn: Torn) -> None:
        self.torn = torn
        self.cycle = self

    def __del__(self) -> None:
        self.torn.run("finalizer")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_cancels_at_an_await_and_raises_after_the_loop_and_its_objects_are_gone(sig):
    torn = Torn(sig)
    events: list[str] = []

    async def benchmark() -> str:
        loop = asyncio.get_running_loop()
        reader, writer = socket.socketpair()
        fired = asyncio.Event()

        def on_readable() -> None:  # a reader callback, as gRPC aio registers for its poller's wake-ups
            reader.recv(1)
            torn.run("callback")
            fired.set()

        loop.add_reader(reader, on_readable)
        Finalized(torn)  # garbage (a cycle) until the next collection
        try:
            writer.send(b"x")
            async with asyncio.timeout(WAIT_S):  # (wait_for would swallow a cancellation racing its result)
                await fired.wait()
            await asyncio.sleep(WAIT_S)  # the cancellation lands here
            events.append("not cancelled")
            return "finished"
        except asyncio.CancelledError:
            events.append("cancelled")
            await asyncio.sleep(0)  # cleanup may still await (closing channels)
            events.append("cleanup awaited")
            raise
        finally:
            loop.remove_reader(reader)
            reader.close()
            writer.close()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        run_interruptible(benchmark())
    assert events == ["cancelled", "cleanup awaited"]
    assert torn.steps[:2] == ["callback start", "callback end"]
    assert torn.steps[2:] == ["finalizer start", "finalizer end"]  # collected before KeyboardInterrupt
    assert {s: signal.getsignal(s) for s in previous} == previous


def test_without_a_signal_it_returns_the_result_and_restores_the_handlers():
    async def benchmark() -> int:
        await asyncio.sleep(0)
        return 42

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert run_interruptible(benchmark()) == 42
    assert {s: signal.getsignal(s) for s in previous} == previous


def test_an_error_without_a_signal_propagates():
    async def benchmark() -> None:
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        run_interruptible(benchmark())
