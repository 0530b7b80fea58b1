"""Test helpers shared by every kind of test: waiting on a condition with a deadline, free ports (the product's
bksim.adapters.ports.free_port: below the ephemeral range, never the same port twice in one process).

Tests never sleep to synchronise: they wait for an observable condition with `wait_until`, which polls
with a bounded deadline and fails with a message that says what did not happen.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import time
from typing import Callable, TypeVar

from bksim.adapters import processes
from bksim.adapters.ports import free_port  # noqa: F401 - tests take it from here

T = TypeVar("T")


def wait_until(pred: Callable[[], T], timeout_s: float, interval_s: float = 0.02, message: str = "") -> T:
    """Poll `pred()` until it returns a truthy value (returned) or `timeout_s` passes (AssertionError).

    An exception raised by `pred` counts as "not yet"; the last one is quoted in the failure message.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            value = pred()
            if value:
                return value
            last_error = None
        except Exception as e:  # not yet: e.g. a connection refused while a server starts
            last_error = e
        if time.monotonic() >= deadline:
            what = message or getattr(pred, "__name__", repr(pred))
            detail = f"; last error: {last_error!r}" if last_error is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.2f}s ({attempts} attempts) waiting for {what}{detail}")
        time.sleep(interval_s)


async def wait_until_async(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.02,
                           message: str = ""):
    """`wait_until` inside an event loop: `pred` may be a plain function or return an awaitable. Polls (the
    event loop keeps running between polls) until a truthy value, or fails with AssertionError at the
    deadline (measured on the loop's clock)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() >= deadline:
            what = message or getattr(pred, "__name__", repr(pred))
            raise AssertionError(f"timed out after {timeout_s:.2f}s waiting for {what}")
        await asyncio.sleep(interval_s)  # poll interval of a bounded wait


def checked(method):
    """`method` wrapped so that `self.check_invariants()` runs when it returns or raises (a refused
    constructor leaves no object to check): monkeypatched onto a state machine's events by a test's fixture,
    a state that breaks an invariant fails the test that reached it, whatever that test asserts itself."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            result = method(self, *args, **kwargs)
        except Exception:
            if method.__name__ != "__init__":
                self.check_invariants()
            raise
        self.check_invariants()
        return result
    return wrapper


def kill_leftovers(text: str) -> list[int]:
    """SIGKILL every process whose command line contains `text` (processes.processes_mentioning); the pids
    killed."""
    pids = list(processes.processes_mentioning(text))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids
