"""Garbage collection and compaction of a bookie's storage: the policy over the engine's primitives
(bookie/engine.py "Garbage collection", bookie/compaction.py), and the metadata port it compares against.

There is no delete RPC: a ledger is deleted by removing its metadata; each bookie finds out by comparing
(BookKeeper's ScanAndCompareGarbageCollector). One round (`run`):

1. generation G = engine.gc_generation (before anything is read from the metadata store);
2. local = the ledgers in the bookie's ledger index; if any, existing = `source.ledger_ids()`, a complete
   listing; candidates = local - existing;
3. with `gc_verify_metadata` (default on; BookKeeper's verifyMetadataOnGC), each candidate is read again on
   its own (`source.ledger_exists`) and kept if it exists;
4. `engine.delete_ledgers(candidates, G)`: a ledger touched after G (an add, a fence, a key or LAC write, in
   particular a ledger created while the listing ran) is not deleted this round;
5. entry logs left with no live ledger are deleted (`engine.delete_dead_logs`);
6. compaction, when due: every sealed log whose live fraction is below the threshold (sparsest first) is
   compacted, at most `compaction_rate_bytes_per_s` (a TokenBucket).

Any error from the metadata store (listing or verification) aborts the round before anything is deleted:
an unknown answer is never taken for "gone". The source refuses to list a metadata store of another cluster.

Schedule (the periodic loop, `start`): a round every `gc_wait_time_ms` (Pulsar's bookkeeper.conf: 15 min;
BookKeeper's code default is 10 min); it compacts at the major threshold (0.5) when `major_compaction_interval_ms`
(1 day) has passed since the last major compaction, else at the minor threshold (0.2) when
`minor_compaction_interval_ms` (1 h) has passed, else not at all. A threshold of 0 turns that kind off.
Disk full (the engine read-only because of disk usage): a round runs at once, and every round while the
disk stays full compacts at the major threshold (BookKeeper's force-GC when no space); the bookie becomes
writable again through the disk monitor's low-water mark (`disk_usage_lwm_threshold`).

Rounds never overlap: `run` called while one is running waits for it, then runs its own.

API for commands, the simulator and benchmarks: `run(kind) -> GcReport` with kind "gc" (deletions only),
"minor", "major"; `status()` (last round of each kind, totals, schedule, the logs as of the last round);
`await entry_log_stats()` (per log: id, bytes, live bytes, live ratio, ledgers; logs sealed since the last
round are recorded first); `statistics()` (counters); `trigger()` (wake the loop now).
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Collection, Protocol

from bksim.model.config import BookieConfig
from bksim.ports.clock import Clock
from bksim.ports.ratelimit import TokenBucket

KINDS = ("gc", "minor", "major")


class LedgerSource(Protocol):
    """What garbage collection asks the metadata store (adapters/bookie_gc.py implements it over the
    MetadataStore port). Both raise on any failure or doubt: an exception is never read as "absent"."""

    async def ledger_ids(self) -> Collection[int]:
        """Every ledger id in the metadata store: a complete listing, or an exception."""

    async def ledger_exists(self, ledger_id: int) -> bool:
        """Whether the ledger's metadata exists now (False only on a definite answer)."""


@dataclass(slots=True)
class GcReport:
    kind: str
    started_ms: int = 0  # wall clock, for display
    duration_ms: float = 0.0
    ledgers_deleted: list[int] = field(default_factory=list)
    candidates: int = 0  # local ledgers absent from the listing
    kept_by_verify: int = 0  # candidates whose metadata a second read found
    logs_deleted: list[int] = field(default_factory=list)
    logs_compacted: list[int] = field(default_factory=list)
    bytes_freed: int = 0  # entry-record bytes of deleted logs, plus what compaction gave back
    bytes_copied: int = 0
    entries_copied: int = 0
    error: str | None = None  # why the round stopped early (nothing was deleted after it)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class GarbageCollector:
    def __init__(self, engine, source: LedgerSource, config: BookieConfig, clock: Clock,
                 log: Callable[[str], None] = print) -> None:
        self._engine, self._source, self._config, self._clock, self._log = engine, source, config, clock, log
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        now = clock.monotonic_ms()
        self._last_due = {"minor": now, "major": now}  # compaction intervals count from start, as upstream
        self._last: dict[str, GcReport] = {}
        self._bucket = (TokenBucket(clock, config.compaction_rate_bytes_per_s, config.compaction_rate_bytes_per_s)
                        if config.compaction_rate_bytes_per_s > 0 else None)
        self._was_full = False
        self.totals = {"rounds": 0, "rounds_failed": 0, "ledgers_deleted": 0, "logs_deleted": 0,
                       "logs_compacted": 0, "bytes_freed": 0, "bytes_copied": 0, "entries_copied": 0}

    # -- one round ----------------------------------------------------------------------------------------
    async def run(self, kind: str = "gc") -> GcReport:
        if kind not in KINDS:
            raise ValueError(f"garbage collection kind {kind!r}: one of {', '.join(KINDS)}")
        async with self._lock:
            report = GcReport(kind, started_ms=self._clock.wall_ms())
            started = self._clock.monotonic_ms()
            try:
                await self._round(kind, report)
            except Exception as e:  # noqa: BLE001 - a round that fails is reported and retried next period
                report.error = f"{type(e).__name__}: {e}"
            report.duration_ms = self._clock.monotonic_ms() - started
            self._account(report)
            return report

    async def _round(self, kind: str, report: GcReport) -> None:
        engine = self._engine
        await engine.refresh_log_meta()
        generation = engine.gc_generation  # before the metadata read starts
        local = engine.gc_ledger_ids()
        if local:
            existing = set(await self._source.ledger_ids())
            candidates = [lid for lid in local if lid not in existing]
            report.candidates = len(candidates)
            if candidates and self._config.gc_verify_metadata:
                confirmed = []
                for lid in candidates:
                    if not await self._source.ledger_exists(lid):
                        confirmed.append(lid)
                report.kept_by_verify = len(candidates) - len(confirmed)
                candidates = confirmed
            if candidates:  # shielded: a stop does not cut a checkpoint short (close() waits for its lock)
                report.ledgers_deleted = await asyncio.shield(engine.delete_ledgers(candidates, generation))
        report.logs_deleted, report.bytes_freed = await engine.delete_dead_logs()
        threshold = {"gc": 0.0, "minor": self._config.minor_compaction_threshold,
                     "major": self._config.major_compaction_threshold}[kind]
        if threshold <= 0:
            return
        take = self._bucket.take if self._bucket is not None else None
        for log_id in engine.compaction_candidates(threshold):
            result = await engine.compact_log(log_id, take)
            if not result["kept_old"]:
                report.logs_compacted.append(log_id)
            report.bytes_freed += result["bytes_freed"]
            report.bytes_copied += result["bytes_copied"]
            report.entries_copied += result["entries"]
        now = self._clock.monotonic_ms()
        self._last_due["minor"] = now
        if kind == "major":
            self._last_due["major"] = now

    def _account(self, report: GcReport) -> None:
        self._last[report.kind] = report
        t = self.totals
        t["rounds"] += 1
        t["rounds_failed"] += report.error is not None
        t["ledgers_deleted"] += len(report.ledgers_deleted)
        t["logs_deleted"] += len(report.logs_deleted)
        t["logs_compacted"] += len(report.logs_compacted)
        t["bytes_freed"] += report.bytes_freed
        t["bytes_copied"] += report.bytes_copied
        t["entries_copied"] += report.entries_copied
        if report.error is not None:
            self._log(f"garbage collection ({report.kind}) stopped, nothing more deleted: {report.error}")
        elif report.ledgers_deleted or report.logs_deleted or report.logs_compacted:
            self._log(f"garbage collection ({report.kind}): {len(report.ledgers_deleted)} ledger(s) deleted, "
                      f"{len(report.logs_deleted)} entry log(s) deleted, {len(report.logs_compacted)} compacted, "
                      f"{report.bytes_freed} bytes freed in {report.duration_ms:.0f} ms")

    # -- visibility ---------------------------------------------------------------------------------------
    def status(self) -> dict:
        now = self._clock.monotonic_ms()
        c = self._config
        return {"running": self._lock.locked(), "disk_full": self._engine.disk_full,
                "last": {kind: r.to_dict() for kind, r in self._last.items()}, "totals": dict(self.totals),
                "next_minor_in_ms": max(0.0, self._last_due["minor"] + c.minor_compaction_interval_ms - now),
                "next_major_in_ms": max(0.0, self._last_due["major"] + c.major_compaction_interval_ms - now),
                "entry_logs": self._engine.entry_log_stats()}

    async def entry_log_stats(self) -> list[dict]:
        """Per entry log (engine.entry_log_stats), after recording the logs sealed since the last round."""
        await self._engine.refresh_log_meta()
        return self._engine.entry_log_stats()

    def statistics(self) -> dict:
        return dict(self.totals, compaction_throttled_ms=self._bucket.slept_ms if self._bucket else 0.0)

    # -- the periodic loop --------------------------------------------------------------------------------
    def due_kind(self) -> str:
        """What the next periodic round does (module docstring "Schedule")."""
        c = self._config
        now = self._clock.monotonic_ms()
        if self._engine.disk_full:
            return "major"
        if c.major_compaction_threshold > 0 and now - self._last_due["major"] >= c.major_compaction_interval_ms:
            return "major"
        if c.minor_compaction_threshold > 0 and now - self._last_due["minor"] >= c.minor_compaction_interval_ms:
            return "minor"
        return "gc"

    def trigger(self) -> None:
        """Run a round now (the disk filled up, or an operator asked)."""
        self._wake.set()

    def note_disk_state(self) -> None:
        """Called after each disk check: a round runs at once when the disk has just become full."""
        full = self._engine.disk_full
        if full and not self._was_full:
            self.trigger()
        self._was_full = full

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="garbage-collection")

    async def stop(self) -> None:
        """Stop the loop; a round in progress is cancelled (every step it leaves is safe: compaction.py)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        while True:
            sleeper = asyncio.ensure_future(self._clock.sleep_ms(self._config.gc_wait_time_ms))
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
            self._wake.clear()
            await self.run(self.due_kind())
