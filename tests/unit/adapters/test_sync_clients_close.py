"""The blocking wrappers (SyncBrokerClient, SyncBookieClient) close their private event loop as asyncio.run
does: a task still pending on it (grpc.aio leaves one watching a cancelled call's status, e.g. when
`bksim ledger read | head -1` stops reading) is cancelled and run to its end first. Closed with it pending, the
task is destroyed at garbage collection and asyncio writes "Task was destroyed but it is pending!" to stderr."""
from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from bksim.adapters.bookie_client import SyncBookieClient
from bksim.adapters.broker_client import SyncBrokerClient

NOWHERE = "127.0.0.1:9"  # no call is made: the channels connect lazily


async def leave_a_task_pending(finished: list[str]) -> None:
    """What a cancelled gRPC call leaves behind: a task that waits on a future already done, not yet run again."""
    done = asyncio.get_running_loop().create_future()
    started = asyncio.Event()

    async def watch_status() -> None:
        try:
            started.set()
            await done
            await asyncio.Event().wait()  # never set: only a cancellation ends it
        finally:
            finished.append("watcher")
    asyncio.get_running_loop().create_task(watch_status())
    await started.wait()
    done.set_result(None)


@pytest.mark.parametrize("wrapper", [SyncBrokerClient, SyncBookieClient], ids=["broker", "bookie"])
def test_close_runs_the_pending_tasks_out_before_closing_the_loop(wrapper, caplog):
    finished: list[str] = []
    client = wrapper(NOWHERE)
    client._run(leave_a_task_pending(finished))
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        client.close()
        del client
        gc.collect()
    assert finished == ["watcher"]
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()], caplog.text
