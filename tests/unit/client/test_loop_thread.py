"""The client's loop thread (client/core.py LoopThread): a blocking call made from another thread while the client
closes (its loop stops) ends with a ClientError that says so, not with the loop's cancellation of the call."""
from __future__ import annotations

import asyncio
import threading

import pytest

from bksim.client.core import LoopThread
from bksim.client.errors import ClientError


class BlockedCaller:
    """A thread blocked in `loop.run` on a call that never ends by itself; `error()` is what the call raised."""

    def __init__(self, loop: LoopThread) -> None:
        self.started = threading.Event()
        self.tasks: list[asyncio.Task] = []
        self.outcome: list[BaseException] = []
        self.thread = threading.Thread(target=self._call, args=(loop,))
        self.thread.start()
        assert self.started.wait(10)

    async def _forever(self) -> None:
        self.tasks.append(asyncio.current_task())
        self.started.set()
        await asyncio.Event().wait()

    def _call(self, loop: LoopThread) -> None:
        try:
            loop.run(self._forever(), 30.0)
        except BaseException as e:  # noqa: BLE001 - what it raised is the thing under test
            self.outcome.append(e)

    def error(self) -> BaseException:
        self.thread.join(10)
        assert not self.thread.is_alive()
        [error] = self.outcome
        return error


def test_a_call_pending_when_the_loop_stops_fails_with_a_client_error():
    loop = LoopThread("test-loop")
    caller = BlockedCaller(loop)
    loop.stop()
    error = caller.error()
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
    caller = BlockedCaller(loop)
    loop.begin_close()
    loop.call(caller.tasks[0].cancel)  # what closing a channel does to a call on it
    error = caller.error()
    loop.stop()
    assert isinstance(error, ClientError), repr(error)
    assert "closed" in str(error)
