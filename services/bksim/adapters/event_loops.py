"""Closing a private event loop: one a blocking wrapper (SyncBrokerClient, SyncBookieClient) or a client's loop
thread made for itself.

`close_loop` ends it as asyncio.run ends its own: the tasks still pending are cancelled and run to their end, the
async generators shut down, then the loop closes. A loop closed with a task pending leaves the task to be
destroyed at garbage collection, and asyncio then writes "Task was destroyed but it is pending!" to stderr;
grpc.aio leaves such a task behind a cancelled call (the watcher of its status), for instance when the reader of
`bksim ledger read` goes away and the read stream is cancelled.

Must not: be called from inside the loop, or while it runs.
"""
from __future__ import annotations

import asyncio


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel `loop`'s pending tasks and let them finish, shut down its async generators, close it."""
    try:
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
