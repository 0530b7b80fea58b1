"""The client's loop thread (client/core.py LoopThread): a blocking call made from another thread while the client
closes (its loop stops) ends with a ClientError that says so, not with the loop's cancellation of the call."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bksim.client.core import LoopThread
from bksim.client.errors import ClientError


def test_a_call_pending_when_the_loop_stops_fails_with_a_client_error():
    loop = LoopThread("test-loop")
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            loop.run(forever(), 30.0)
        except BaseException as e:  # noqa: BLE001 - what it raised is the thing under test
            outcome.append(e)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(10)
    loop.stop()
    thread.join(10)
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, ClientError), repr(error)
    assert "closed" in str(error)


def test_a_call_after_the_loop_stopped_fails_with_a_client_error_too():
    loop = LoopThread("test-loop")
    loop.stop()

    async def nothing() -> None:
        return None

    with pytest.raises(ClientError, match="closed"):
        loop.run(nothing(), 5.0)


def test_a_call_its_owner_cancels_while_closing_fails_with_a_client_error():
    """The client closes its channels before it stops its loop: the calls that cancels fail as closed too."""
    loop = LoopThread("test-loop")
    started = threading.Event()
    tasks: list[asyncio.Task] = []

    async def forever() -> None:
        tasks.append(asyncio.current_task())
        started.set()
        await asyncio.Event().wait()

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            loop.run(forever(), 30.0)
        except BaseException as e:  # noqa: BLE001 - what it raised is the thing under test
            outcome.append(e)

    thread = threading.Thread(target=caller)
    thread.start()
    assert started.wait(10)
    loop.begin_close()
    loop.call(tasks[0].cancel)  # what closing a channel does to a call on it
    thread.join(10)
    loop.stop()
    assert not thread.is_alive()
    [error] = outcome
    assert isinstance(error, ClientError), repr(error)
    assert "closed" in str(error)
