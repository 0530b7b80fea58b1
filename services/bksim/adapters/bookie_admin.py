"""The bookie's operator service (proto/bookie.proto `BookieAdmin`) over its GarbageCollector (bookie/gc.py): run a
round now, the collector's status, the entry logs' live ratios. BookKeeper's `/api/v1/bookie/gc` admin endpoint
and shell commands; `bksim bookie gc` and `bksim bookie gc-status` call it. A service of its own: it is not part
of the replication protocol, and the brokers' transports (ports/bookie_transport.py) never call it.

Owns: the rounds it starts (one task each), their bound, and translating GcReport / status dicts to messages.

Refusals, each before anything is changed, as gRPC status codes with a message:
  FAILED_PRECONDITION  the bookie runs without garbage collection (no collector was given to the server);
  UNAVAILABLE          the bookie is shutting down (its add streams drain, or `stop` was called);
  INVALID_ARGUMENT     an unknown kind (not gc, minor, major; empty means gc), a negative first_log_id;
  RESOURCE_EXHAUSTED   RUN_GC_CALLS_MAX rounds asked through RunGc have not finished yet.

RunGc: rounds never overlap (bookie/gc.py): a round asked while one runs waits for it, then runs its own. At most
RUN_GC_CALLS_MAX rounds asked through this service are in progress at once (running or waiting), so a loop of
calls cannot pile rounds up. Each round runs in a task this servicer owns, shielded from its caller: a caller
that goes away (deadline, Ctrl-C) does not cut a compaction short; the round finishes, counts against the bound
until then, and shows in GcStatus. `stop` (the server's shutdown) cancels them, as the collector's own `stop`
does with its loop's round (every step a cancelled round leaves is safe: bookie/compaction.py).

Bounds of an answer (frame_bytes_max is 5 MiB by default; these keep an answer far below it): each id list of a
GcReport holds at most IDS_MAX ids (the `*_count` fields are complete); GcStatus lists at most
ENTRY_LOGS_PAGE_MAX entry logs (the total is given and the message says the list is cut); EntryLogStats pages
by ENTRY_LOGS_PAGE_MAX.

Must not: block the event loop; call the metadata store itself (the collector does, through its port).
"""
from __future__ import annotations

import asyncio
from typing import Callable

import grpc

from bksim.bookie.gc import KINDS
from bksim.gen import bookie_pb2, bookie_pb2_grpc
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieError

RUN_GC_CALLS_MAX = 2  # one round running and one waiting for it: a second call still gets a round that starts
#                       after it was made (what an operator who just deleted a ledger wants); more only queue up
IDS_MAX = 1000  # ids per list of a GcReport: 1000 int64 are < 10 KiB; the counts say how many there were
ENTRY_LOGS_PAGE_MAX = 1000  # entry logs per answer: ~40 bytes each, < 64 KiB; a 1 GiB-per-log bookie of 1 TB fits


def report_message(report: dict) -> bookie_pb2.GcReport:
    """A GcReport message from bookie/gc.py GcReport.to_dict(); each id list cut at IDS_MAX."""
    return bookie_pb2.GcReport(
        kind=report["kind"], started_ms=int(report["started_ms"]), duration_ms=float(report["duration_ms"]),
        ledgers_deleted=report["ledgers_deleted"][:IDS_MAX], ledgers_deleted_count=len(report["ledgers_deleted"]),
        candidates=report["candidates"], kept_by_verify=report["kept_by_verify"],
        logs_deleted=report["logs_deleted"][:IDS_MAX], logs_deleted_count=len(report["logs_deleted"]),
        logs_compacted=report["logs_compacted"][:IDS_MAX], logs_compacted_count=len(report["logs_compacted"]),
        bytes_freed=report["bytes_freed"], bytes_copied=report["bytes_copied"],
        entries_copied=report["entries_copied"], error=report["error"] or "")


def entry_log_message(stat: dict) -> bookie_pb2.EntryLogStat:
    """An EntryLogStat from one dict of bookie/engine.py entry_log_stats (its ledger id list is not sent)."""
    return bookie_pb2.EntryLogStat(log_id=stat["log_id"], bytes=stat["bytes"], live_bytes=stat["live_bytes"],
                                   live_ratio=stat["live_ratio"], ledgers=stat["ledgers"],
                                   live_ledgers=stat["live_ledgers"], current=stat["current"])


class BookieAdminServicer(bookie_pb2_grpc.BookieAdminServicer):
    """`gc`: the bookie's GarbageCollector, or None; `bookie`: the Bookie servicer (its `draining` flag)."""

    def __init__(self, gc, config: BookieConfig, bookie, log: Callable[[str], None]) -> None:
        self._gc = gc
        self._config = config
        self._bookie = bookie
        self._log = log
        self._rounds: set[asyncio.Task] = set()
        self._stopping = False
        # statistics
        self.rounds_started = 0
        self.refused = 0

    # -- calls -------------------------------------------------------------------------------------------
    async def RunGc(self, request, context):
        gc = await self._collector(context)
        kind = request.kind or "gc"
        if kind not in KINDS:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"garbage collection kind {kind[:64]!r}: one of {', '.join(KINDS)}")
        if len(self._rounds) >= RUN_GC_CALLS_MAX:
            await self._refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"{len(self._rounds)} garbage collection rounds asked for are not finished yet (at "
                               f"most {RUN_GC_CALLS_MAX}: one running, one waiting for it): ask again once they are")
        task = asyncio.get_running_loop().create_task(gc.run(kind), name=f"garbage-collection-{kind}-asked")
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)
        self.rounds_started += 1
        try:
            report = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # the caller went away: the round goes on (module docstring)
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                "the bookie is shutting down: the round was stopped (every step it left is safe)")
        return report_message(report.to_dict())

    async def GcStatus(self, request, context):
        gc = await self._collector(context)
        try:
            status, statistics = gc.status(), gc.statistics()
        except Exception as e:  # noqa: BLE001 - storage closed under us, or a bug: say so, do not kill the call
            await self._internal(context, "GcStatus", e)
        c = self._config
        logs = sorted(status["entry_logs"], key=lambda s: s["log_id"])
        shown = logs[:ENTRY_LOGS_PAGE_MAX]
        totals = status["totals"]
        return bookie_pb2.GcStatusResponse(
            running=status["running"], disk_full=status["disk_full"],
            last=[report_message(status["last"][kind]) for kind in KINDS if kind in status["last"]],
            totals=bookie_pb2.GcTotals(
                rounds=totals["rounds"], rounds_failed=totals["rounds_failed"],
                ledgers_deleted=totals["ledgers_deleted"], logs_deleted=totals["logs_deleted"],
                logs_compacted=totals["logs_compacted"], bytes_freed=totals["bytes_freed"],
                bytes_copied=totals["bytes_copied"], entries_copied=totals["entries_copied"],
                compaction_throttled_ms=float(statistics.get("compaction_throttled_ms", 0.0))),
            schedule=bookie_pb2.GcSchedule(
                gc_wait_time_ms=c.gc_wait_time_ms, gc_verify_metadata=c.gc_verify_metadata,
                minor_compaction_threshold=c.minor_compaction_threshold,
                minor_compaction_interval_ms=c.minor_compaction_interval_ms,
                major_compaction_threshold=c.major_compaction_threshold,
                major_compaction_interval_ms=c.major_compaction_interval_ms,
                compaction_rate_bytes_per_s=c.compaction_rate_bytes_per_s,
                next_minor_in_ms=status["next_minor_in_ms"], next_major_in_ms=status["next_major_in_ms"]),
            entry_logs=[entry_log_message(s) for s in shown], entry_logs_total=len(logs),
            message="" if len(shown) == len(logs) else
            f"{len(logs)} entry logs, the first {len(shown)} listed: EntryLogStats pages through all of them "
            f"(`bksim entrylog dump` reads them from the files)")

    async def EntryLogStats(self, request, context):
        gc = await self._collector(context)
        if request.first_log_id < 0:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"first_log_id {request.first_log_id}: must be >= 0")
        page_max = min(request.max_logs or ENTRY_LOGS_PAGE_MAX, ENTRY_LOGS_PAGE_MAX)
        try:
            logs = await gc.entry_log_stats()
        except BookieError as e:  # the engine is closing
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"entry logs not available: {e}")
        except Exception as e:  # noqa: BLE001
            await self._internal(context, "EntryLogStats", e)
        logs = sorted(logs, key=lambda s: s["log_id"])
        wanted = [s for s in logs if s["log_id"] >= request.first_log_id]
        page = wanted[:page_max]
        return bookie_pb2.EntryLogStatsResponse(
            logs=[entry_log_message(s) for s in page],
            next_log_id=wanted[page_max]["log_id"] if len(wanted) > page_max else -1, logs_total=len(logs))

    # -- helpers -----------------------------------------------------------------------------------------
    async def _collector(self, context):
        if self._gc is None:
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                               "this bookie runs without garbage collection")
        if self._stopping or getattr(self._bookie, "draining", False):
            await self._refuse(context, grpc.StatusCode.UNAVAILABLE, "the bookie is shutting down")
        return self._gc

    async def _refuse(self, context, code: grpc.StatusCode, message: str) -> None:
        self.refused += 1
        await context.abort(code, message)

    async def _internal(self, context, what: str, e: Exception) -> None:
        self._log(f"{what} failed: {type(e).__name__}: {e}")
        await context.abort(grpc.StatusCode.INTERNAL, f"bookie internal error in {what}: {type(e).__name__}: {e}")

    async def stop(self) -> None:
        """Refuse new calls and cancel the rounds still running (the server's shutdown; before the engine closes)."""
        self._stopping = True
        rounds = list(self._rounds)
        for task in rounds:
            task.cancel()
        await asyncio.gather(*rounds, return_exceptions=True)

    def statistics(self) -> dict:
        return {"admin_rounds_started": self.rounds_started, "admin_refused": self.refused,
                "admin_rounds_in_progress": len(self._rounds)}
