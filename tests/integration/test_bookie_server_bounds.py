"""The gRPC server's own guarantees, deterministically: a real grpc.aio server and client in-process over
loopback, with a gated fake engine so that adds stay in flight exactly as long as the test wants.

- per-stream and total in-flight bounds answer TOO_MANY_REQUESTS without waiting for the engine;
- responses come back in request order, each matched to its batch;
- draining (SIGTERM path): health NOT_SERVING, accepted adds still answered, new streams refused;
- the disk monitor reports read-only flips through its callback.
"""
from __future__ import annotations

import asyncio
import dataclasses

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.bookie_server import BookieServer
from bksim.adapters.clock import SystemClock
from bksim.formats.entry import encode_entry
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode
from helpers import wait_until_async
from integration.bookie_harness import KEY

PER_STREAM_MAX = 1000
TOTAL_MAX = 1500
WAIT_S = 5.0


class GatedBatch:
    def __init__(self, gate: asyncio.Event, n: int) -> None:
        self.gate, self.n = gate, n

    async def result(self):
        await self.gate.wait()
        return [StatusCode.OK] * self.n, ""


class GatedEngine:
    """An add batch's result waits for `gate`; everything else answers at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = 0  # entries that reached start_adds
        self.read_only = False
        self.usage: list[tuple[int, int]] = []

    def start_adds(self, items):
        self.entered += len(items)
        return GatedBatch(self.gate, len(items))

    def start_adds_compact(self, entries, master_key, flags):
        return self.start_adds(entries)

    def set_disk_usage(self, total_bytes: int, free_bytes: int) -> bool:
        self.usage.append((total_bytes, free_bytes))
        read_only = (total_bytes - free_bytes) / total_bytes >= 0.9
        flipped = read_only != self.read_only
        self.read_only = read_only
        return flipped

    def info(self) -> dict:
        return {"state": "read-only" if self.read_only else "writable", "free_bytes": 1, "total_bytes": 2,
                "instance_id": "i"}


class FakeDisk:
    def __init__(self) -> None:
        self.free = {"/j": 500, "/l": 800}

    def usage(self, path: str) -> tuple[int, int]:
        return 1000, self.free[path]


def batch(ledger: int, first: int, n: int):
    return [(encode_entry(ledger, first + i, -1, 0, b"p"), KEY, 0) for i in range(n)]


async def start(engine, disk=None, on_change=None) -> BookieServer:
    config = dataclasses.replace(BookieConfig(), port=0, add_inflight_per_stream_max=PER_STREAM_MAX,
                                 add_inflight_total_max=TOTAL_MAX, disk_check_interval_ms=20)
    server = BookieServer(engine, config, "test-bookie", disk=disk or FakeDisk(), clock=SystemClock(),
                          journal_dir="/j", ledger_dir="/l", log=lambda m: None, on_read_only_change=on_change)
    await server.start()
    return server


async def until(pred, what: str) -> None:
    """Bounded wait on a condition inside the event loop."""
    await wait_until_async(pred, WAIT_S, interval_s=0.005, message=what)


def test_bounds_answer_too_many_requests_without_waiting_and_in_order():
    async def scenario():
        engine = GatedEngine()
        server = await start(engine)
        try:
            async with BookieClient(f"127.0.0.1:{server.port}") as client:
                a, b = client.add_stream(), client.add_stream()
                a1 = await a.send(1, batch(1, 0, 900))
                await until(lambda: engine.entered == 900, "batch a1 inside the engine")
                a2 = await a.send(2, batch(1, 900, 200))  # 900 + 200 > per-stream 1000: refused, answered after a1
                b1 = await b.send(1, batch(2, 0, 900))    # 900 + 900 > total 1500: refused at once
                b1_result = await b.result(b1, timeout_s=WAIT_S)
                b2 = await b.send(2, batch(2, 900, 500))  # 900 + 500 <= 1500: accepted, waits for the engine
                await until(lambda: engine.entered == 1400, "batch b2 inside the engine")
                a2_done_early, b2_done_early = a2.done(), b2.done()
                engine.gate.set()
                a1_result, a2_result = await a.result(a1), await a.result(a2)
                b2_result = await b.result(b2)
                stats = server.statistics()
                await a.close()
                await b.close()
            return b1_result, a2_done_early, b2_done_early, a1_result, a2_result, b2_result, stats
        finally:
            await server.stop(1000)

    b1, a2_done_early, b2_done_early, a1, a2, b2, stats = asyncio.run(scenario())
    assert b1.statuses == [StatusCode.TOO_MANY_REQUESTS] * 900
    assert "add_inflight_total_max=1500" in b1.message
    assert not a2_done_early, "a refused batch must not overtake the earlier batch of its stream"
    assert not b2_done_early
    assert a1.ok and a1.batch_id == 1
    assert a2.statuses == [StatusCode.TOO_MANY_REQUESTS] * 200 and a2.batch_id == 2
    assert "add_inflight_per_stream_max=1000" in a2.message
    assert b2.ok and b2.batch_id == 2
    assert stats["add_rejected_entries"] == 1100 and stats["add_entries"] == 1400
    assert stats["add_inflight_total"] == 0


def test_drain_answers_accepted_adds_and_refuses_new_streams():
    async def scenario():
        engine = GatedEngine()
        server = await start(engine)
        async with BookieClient(f"127.0.0.1:{server.port}") as client:
            stream = client.add_stream()
            pending = await stream.send(1, batch(3, 0, 10))
            await until(lambda: engine.entered == 10, "the batch inside the engine")
            stopping = asyncio.create_task(server.stop(3000))
            await until(lambda: server.servicer.draining, "draining")
            health = await client.health()
            refused = client.add_stream()
            try:
                await refused.add(1, batch(3, 10, 1))
                refused_error = None
            except BookieUnreachable as e:
                refused_error = e
            assert not pending.done()
            engine.gate.set()
            result = await stream.result(pending)
            await asyncio.wait_for(stopping, WAIT_S)
            await stream.close()
            await refused.close()
        return health, refused_error, result

    health, refused_error, result = asyncio.run(scenario())
    assert health == "NOT_SERVING"
    assert refused_error is not None and refused_error.code == "UNAVAILABLE"
    assert result.ok  # accepted before the drain: answered, not dropped


def test_disk_monitor_reports_read_only_flips_from_the_fuller_disk():
    async def scenario():
        engine = GatedEngine()
        disk = FakeDisk()
        reported: list[bool] = []

        async def on_change(read_only: bool) -> None:
            reported.append(read_only)

        server = await start(engine, disk, on_change)
        try:
            await until(lambda: len(engine.usage) >= 2, "two disk checks")
            first = engine.usage[0]
            disk.free["/j"] = 50  # the journal disk is now the fuller one: 95% used
            await until(lambda: reported == [True], "the read-only report")
            disk.free["/j"] = 500
            await until(lambda: reported == [True, False], "the writable report")
            return first, reported, server.reported_read_only
        finally:
            await server.stop(1000)

    first, reported, reported_read_only = asyncio.run(scenario())
    assert first == (1000, 500)  # journal 50% used is fuller than ledgers 20% used
    assert reported == [True, False]
    assert reported_read_only is False
