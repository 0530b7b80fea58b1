"""The BookieAdmin service (adapters/bookie_admin.py) through a real grpc.aio server and BookieClient over loopback,
against a real BookieEngine (files and RocksDB in a tmp dir) and GarbageCollector; only the metadata store is an
in-memory set (the collector's LedgerSource port), gated where a test must hold a round in its listing.

- RunGc frees a ledger absent from the metadata and reports it; GcStatus shows the round, the totals, the
  schedule and the logs; EntryLogStats pages through every log;
- refusals (unknown kind, negative first_log_id, no collector) carry their gRPC code and change nothing;
- at most RUN_GC_CALLS_MAX rounds asked through RunGc are in progress: the next call is RESOURCE_EXHAUSTED;
- a caller that goes away does not stop its round; the server's stop does, and refuses new calls.
"""
from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from bksim.adapters.bookie_admin import RUN_GC_CALLS_MAX
from bksim.adapters.bookie_client import BookieAdminError, BookieClient
from bksim.adapters.bookie_server import BookieServer
from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.bookie.gc import GarbageCollector
from bksim.formats.entry import encode_entry
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode
from helpers import wait_until_async

KEY = b"k" * 32
WAIT_S = 10.0


class Source:
    """The metadata store's ledgers as a set; `gate` (when set up) holds each listing until it is set."""

    def __init__(self, ids, gated: bool = False) -> None:
        self.ids = set(ids)
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()
        self.lists = 0

    async def ledger_ids(self):
        self.lists += 1
        await self.gate.wait()
        return set(self.ids)

    async def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self.ids


class Bookie:
    def __init__(self, tmp_path, source: Source | None) -> None:
        self.config = dataclasses.replace(BookieConfig(), port=0, entry_log_bytes_max=4096,
                                          compaction_rate_bytes_per_s=0, gc_wait_time_ms=3_600_000,
                                          minor_compaction_interval_ms=3_600_000)
        self.engine = BookieEngine(self.config, disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                                   instance_id=str(uuid.uuid4()), journal_dir=str(tmp_path / "journal"),
                                   ledger_dir=str(tmp_path / "ledgers"), log=lambda line: None)
        self.source = source
        self.gc = (GarbageCollector(self.engine, source, self.config, SystemClock(), log=lambda line: None)
                   if source is not None else None)
        self.server: BookieServer | None = None
        self.client: BookieClient | None = None

    async def __aenter__(self) -> "Bookie":
        await self.engine.start()
        self.server = BookieServer(self.engine, self.config, "admin-test", disk=LocalDisk(), clock=SystemClock(),
                                   journal_dir=self.engine.journal_dir, ledger_dir=self.engine.ledger_dir,
                                   log=lambda line: None, gc=self.gc)
        port = await self.server.start()
        self.client = BookieClient(f"127.0.0.1:{port}")
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        if self.source is not None:
            self.source.gate.set()
        await self.server.stop(1000)
        await self.engine.close()

    async def write(self, ledger_id: int, n: int, size: int = 500) -> None:
        entries = [(encode_entry(ledger_id, i, i - 1, 0, bytes([i % 251]) * size), KEY, 0) for i in range(n)]
        statuses, message = await self.engine.add_entries(entries)
        assert statuses == [StatusCode.OK] * n, message
        await self.engine.checkpoint()


def run(coroutine):
    asyncio.run(asyncio.wait_for(coroutine, 60.0))


def test_run_gc_frees_a_deleted_ledger_and_status_and_entry_log_stats_show_it(tmp_path):
    async def scenario():
        async with Bookie(tmp_path, Source({2})) as b:
            await b.write(1, 20)
            await b.write(2, 20)
            before = await b.client.entry_log_stats()
            assert before["logs_total"] >= 3 and before["next_log_id"] == -1
            report = await b.client.run_gc("gc")
            assert report["kind"] == "gc" and report["error"] is None
            assert report["ledgers_deleted"] == [1] and report["ledgers_deleted_count"] == 1
            assert report["logs_deleted"] and report["logs_deleted_count"] == len(report["logs_deleted"])
            assert report["bytes_freed"] > 0 and report["candidates"] == 1 and report["logs_compacted"] == []
            assert (await b.client.read_entry(1, 0)).status == StatusCode.NO_LEDGER
            assert (await b.client.read_entry(2, 19)).status == StatusCode.OK

            status = await b.client.gc_status()
            assert [r["kind"] for r in status["last"]] == ["gc"]
            assert status["last"][0]["ledgers_deleted"] == [1] and not status["running"]
            assert status["totals"]["rounds"] == 1 and status["totals"]["ledgers_deleted"] == 1
            assert status["totals"]["bytes_freed"] == report["bytes_freed"]
            assert status["schedule"]["gc_wait_time_ms"] == 3_600_000
            assert status["schedule"]["minor_compaction_threshold"] == pytest.approx(0.2)
            ids = [s["log_id"] for s in status["entry_logs"]]
            assert ids == sorted(ids) and status["entry_logs_total"] == len(ids) and status["message"] == ""
            assert not set(report["logs_deleted"]) & set(ids)
            assert all(0.0 <= s["live_ratio"] <= 1.0 for s in status["entry_logs"])
            assert [s for s in status["entry_logs"] if s["current"]]

            pages, first = [], 0
            while True:  # one log per page: the pages chain through next_log_id and cover every log once
                page = await b.client.entry_log_stats(first, max_logs=1)
                assert len(page["logs"]) == 1
                pages.append(page["logs"][0]["log_id"])
                if page["next_log_id"] == -1:
                    break
                assert page["next_log_id"] > pages[-1]
                first = page["next_log_id"]
            whole = await b.client.entry_log_stats()
            assert pages == [s["log_id"] for s in whole["logs"]] and len(pages) == whole["logs_total"]
            live = {s["log_id"]: s for s in whole["logs"] if not s["current"]}
            assert live and all(s["live_ledgers"] == 1 for s in live.values())
            assert all(s["live_ratio"] == pytest.approx(s["live_bytes"] / s["bytes"]) for s in live.values())
            assert any(0 < s["live_ratio"] < 1 for s in live.values())  # the log both ledgers shared

    run(scenario())


def test_bad_input_is_refused_with_its_code_and_changes_nothing(tmp_path):
    async def scenario():
        async with Bookie(tmp_path, Source(set())) as b:
            await b.write(1, 5)
            with pytest.raises(BookieAdminError) as refused:
                await b.client.run_gc("full")
            assert refused.value.code == "INVALID_ARGUMENT"
            assert "garbage collection kind 'full': one of gc, minor, major" in str(refused.value)
            with pytest.raises(BookieAdminError) as refused:
                await b.client.entry_log_stats(first_log_id=-1)
            assert refused.value.code == "INVALID_ARGUMENT" and "first_log_id -1" in refused.value.message
            status = await b.client.gc_status()
            assert status["totals"]["rounds"] == 0 and status["last"] == []
            assert (await b.client.read_entry(1, 4)).status == StatusCode.OK  # absent from the metadata, kept

    run(scenario())


def test_a_bookie_without_garbage_collection_says_so(tmp_path):
    async def scenario():
        async with Bookie(tmp_path, None) as b:
            for call in (b.client.run_gc(), b.client.gc_status(), b.client.entry_log_stats()):
                with pytest.raises(BookieAdminError) as refused:
                    await call
                assert refused.value.code == "FAILED_PRECONDITION"
                assert "without garbage collection" in refused.value.message

    run(scenario())


def test_run_gc_calls_are_bounded_and_each_admitted_call_gets_its_own_round(tmp_path):
    async def scenario():
        async with Bookie(tmp_path, Source({2}, gated=True)) as b:
            await b.write(1, 5)
            first = asyncio.create_task(b.client.run_gc("gc"))
            await wait_until_async(lambda: b.source.lists == 1, WAIT_S, message="the first round in its listing")
            others = [asyncio.create_task(b.client.run_gc("major")) for _ in range(RUN_GC_CALLS_MAX - 1)]
            await wait_until_async(lambda: b.server.admin.statistics()["admin_rounds_in_progress"] == RUN_GC_CALLS_MAX,
                                   WAIT_S, message="the second call admitted, waiting")
            with pytest.raises(BookieAdminError) as refused:
                await b.client.run_gc("gc")
            assert refused.value.code == "RESOURCE_EXHAUSTED"
            assert f"at most {RUN_GC_CALLS_MAX}" in refused.value.message
            assert b.source.lists == 1  # the refused call and the waiting one have not listed anything
            b.source.gate.set()
            reports = [await first] + [await t for t in others]
            assert reports[0]["ledgers_deleted"] == [1] and reports[0]["kind"] == "gc"
            assert [r["kind"] for r in reports[1:]] == ["major"] * (RUN_GC_CALLS_MAX - 1)
            assert all(r["ledgers_deleted"] == [] and r["error"] is None for r in reports[1:])
            assert b.source.lists == 1  # the later rounds found no local ledger left: nothing to list
            status = await b.client.gc_status()
            assert status["totals"]["rounds"] == RUN_GC_CALLS_MAX
            assert [r["kind"] for r in status["last"]] == ["gc", "major"]

    run(scenario())


def test_a_caller_that_goes_away_leaves_its_round_running_and_stop_cancels_rounds(tmp_path):
    async def scenario():
        async with Bookie(tmp_path, Source({2}, gated=True)) as b:
            await b.write(1, 5)
            with pytest.raises(BookieUnreachable) as gone:
                await b.client.run_gc("gc", deadline_s=0.3)
            assert gone.value.code == "DEADLINE_EXCEEDED"
            assert b.server.admin.statistics()["admin_rounds_in_progress"] == 1
            b.source.gate.set()
            status = await wait_until_async(lambda: _finished(b), WAIT_S, message="the round recorded")
            assert status["last"][0]["ledgers_deleted"] == [1]

            b.source.gate.clear()
            await b.write(3, 2)  # a local ledger again: the next round waits in its listing
            held = asyncio.create_task(b.client.run_gc("gc"))
            await wait_until_async(lambda: b.source.lists == 2, WAIT_S, message="the second round in its listing")
            await b.server.admin.stop()
            with pytest.raises(BookieUnreachable) as stopped:
                await held
            assert stopped.value.code == "UNAVAILABLE" and "the round was stopped" in str(stopped.value)
            assert b.server.admin.statistics()["admin_rounds_in_progress"] == 0
            with pytest.raises(BookieUnreachable) as refused:
                await b.client.run_gc("gc")
            assert refused.value.code == "UNAVAILABLE" and "shutting down" in str(refused.value)
            assert (await b.client.read_entry(3, 1)).status == StatusCode.OK

    run(scenario())


async def _finished(b: Bookie):
    status = await b.client.gc_status()
    return status if status["totals"]["rounds"] == 1 else None
