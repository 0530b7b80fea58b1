"""The garbage-collection world: the bookie world (bookie_scenario) with a metadata store of ledgers, ledgers
deleted from it, and garbage-collection and compaction rounds (the real bookie/gc.py GarbageCollector over the
real BookieEngine) running among the adds, reads, fences and checkpoints, crashed at every one of their steps.

A world of its own rather than more knobs of the bookie world: deleting ledgers changes what may be demanded
of a read (gc_checks), and the bookie world's seeds keep their traces.

Owns, besides what the bookie world owns:
- the metadata store (ledger_source.SimLedgerSource, a simulator fake of gc.py's LedgerSource): each ledger is
  created there before it is written; the workload deletes ledgers from it, mostly ones no writer writes any
  more, sometimes one still being written (its writer goes on: those adds may vanish with the ledger); its
  listing fails, breaks off midway, lags, or (with verification on) answers a stale state (plan.GcPlan);
- the workload's extra operations (plan.GC_OP_WEIGHTS): a writer rolling to a new ledger, a deletion from the
  metadata, and rounds "gc", "minor" and "major" submitted like any other client operation (rounds never
  overlap: a round submitted during another waits for it);
- crashes at the fault steps of garbage collection and compaction (engine.GC_AND_COMPACTION_STEPS, through the
  engine's fault hook): the plan's crash points name (step, k); the k-th time the engine reaches the step, the
  disk, the key-value store and the engine crash right there (the hook raises, as power loss stops the code),
  and the driver restarts the bookie through journal replay and compaction's start-up recovery at its next
  step. The seed's number picks the first point's step, so every step is aimed at over any ten seeds. The
  bookie world's faults stay: crashes at random moments and during start-up, torn tails, bit flips.

Phases: the safety phase (`plan.steps` steps with faults); the liveness phase: the store answers every listing
at once, every operation finishes, a checkpoint, then a final round "gc" and a round "major" must succeed, after which no
entry log but the one being written holds only deleted ledgers' bytes and no compaction file is left
(SpaceReclaimed); an audit; a clean stop whose restart replays nothing; a last audit.

Invariants: gc_checks (LiveEntriesStayReadable, DeletedStaysDeleted), SpaceReclaimed, GcFailsOnlyUnderFaults (a
round answered by a live incarnation stops early only on an injected failure of the metadata store),
and the bookie world's.

Determinism: as the bookie world (every draw from plan.rng_for streams; the metadata store has its own).
"""
from __future__ import annotations

import os
from typing import Callable

from bksim.bookie.engine import GC_AND_COMPACTION_STEPS
from bksim.bookie.gc import GarbageCollector, GcReport
from bksim.formats import entry_log as log_fmt
from bksim.formats.entry import parse_ids
from bksim.formats import index as index_fmt
from bksim.model.errors import FormatError
from bksim.model.status import FLAG_RECOVERY_ADD
from bksim.sim import loop as sim_loop
from bksim.sim.bookie_checks import InvariantViolation, LedgerHistory
from bksim.sim.bookie_scenario import LEDGER_DIR, LOCATIONS_KV, BookieWorld, SimResult, _Op, _run
from bksim.sim.gc_checks import GcHistory
from bksim.sim.ledger_source import FAILURE_MARK, SimLedgerSource
from bksim.sim.plan import GC_OP_WEIGHTS, STEPS_DEFAULT, BookiePlan, GcPlan, rng_for

CRASH_STEPS = GC_AND_COMPACTION_STEPS
FINAL_ROUNDS = ("gc", "major")  # the second records the logs the first one's checkpoint sealed
ENTRY_LOG_DIR = os.path.join(LEDGER_DIR, "entrylogs")


class CrashedAtStep(Exception):
    """Raised by the fault hook after the world crashed at a step: the engine's code stops there."""


def gc_plans(seed: int, steps: int = STEPS_DEFAULT) -> tuple[BookiePlan, GcPlan]:
    """The two plans of one seed (pure functions of seed and steps)."""
    gc_plan = GcPlan.from_seed(seed, CRASH_STEPS)
    return gc_plan.bookie_plan(BookiePlan.from_seed(seed, steps)), gc_plan


def run_gc_sim(seed: int, steps: int | None = None, *, tolerated: frozenset[str] = frozenset(),
               plans: tuple[BookiePlan, GcPlan] | None = None) -> SimResult:
    """Run one seed of the garbage-collection world; never raises for an invariant violation."""
    plan, gc_plan = plans or gc_plans(seed, STEPS_DEFAULT if steps is None else steps)
    return sim_loop.run(_run(plan, tolerated, lambda: GcWorld(plan, gc_plan, tolerated)), seed=seed)


class GcWorld(BookieWorld):
    op_weights = GC_OP_WEIGHTS

    def __init__(self, plan: BookiePlan, gc_plan: GcPlan, tolerated: frozenset[str] = frozenset()) -> None:
        super().__init__(plan, tolerated)
        self.gc_plan = gc_plan
        self.config = gc_plan.bookie_config(self.config)
        self.history: GcHistory = GcHistory(
            tolerated, lambda v: self.trace.add(f"TOLERATED (known engine issue) {v}"))
        self.source = SimLedgerSource(
            rng_for(plan.seed, "metadata"), self.clock, self.trace.add, self.history.listing_started,
            on_absent=self.history.verified_absent,
            failure_probability=gc_plan.listing_failure_probability,
            partial_probability=gc_plan.listing_partial_probability, page_ledgers=gc_plan.listing_page_ledgers,
            lag_ms_max=gc_plan.listing_lag_ms_max, exists_failure_probability=gc_plan.exists_failure_probability,
            stale_ms_max=gc_plan.listing_stale_ms_max)
        self.collector: GarbageCollector | None = None
        self._armed = [[step, k] for step, k in gc_plan.crash_points]  # crash points not reached yet
        self._step_faults = True
        self.stats.update({k: 0 for k in (
            "gc_rounds", "gc_rounds_stopped", "ledgers_deleted_from_metadata", "ledgers_deleted_by_gc",
            "kept_by_verification", "logs_deleted", "logs_compacted", "entries_copied", "listings",
            "metadata_failures")})
        self.stats.update({f"crash_at_{step}": 0 for step in CRASH_STEPS})

    # -- the run (BookieWorld.run, through its hooks) ----------------------------------------------------
    def _header(self) -> list[str]:
        return ["bksim sim --world gc: one bookie (BookieEngine + GarbageCollector) on SimDisk + SimKeyValueStore + "
                "SimClock, ledgers listed by SimLedgerSource", *self.plan.describe(), *self.gc_plan.describe()]

    def _liveness_begins(self) -> None:
        self._step_faults = self.source.faults = False

    async def _before_final_audit(self) -> None:
        await self._final_rounds()
        self._check_space_reclaimed()
        self.stats["listings"] = self.source.listings
        self.stats["metadata_failures"] = self.source.failures

    async def _restart_if_crashed(self) -> None:
        """A crash at a fault step happened inside a round: restart (replay) and audit, as after any crash."""
        if not self.alive:
            await self._start(crashes_allowed=True)
            await self._audit(f"after restart of bookie#{self.incarnation}")

    # -- engine lifecycle --------------------------------------------------------------------------------
    def _new_engine(self):
        engine = super()._new_engine()
        n = self.incarnation
        self.collector = GarbageCollector(engine, self.source, self.config, self.clock,
                                          log=lambda message: self._engine_log(n, message))
        return engine

    def _fault_hook(self, incarnation: int) -> Callable[[str], None]:
        return lambda step: self._at_step(incarnation, step)

    def _at_step(self, n: int, step: str) -> None:
        if step not in CRASH_STEPS or n != self.incarnation or not self.alive or not self._step_faults:
            return
        for point in self._armed:
            if point[0] == step:
                point[1] -= 1
                if point[1] == 0:
                    self._armed.remove(point)
                    self.stats[f"crash_at_{step}"] += 1
                    self._crash(f"at fault step {step} of bookie#{n}")
                    raise CrashedAtStep(step)
                return

    # -- the workload ------------------------------------------------------------------------------------
    def _open_ledger(self) -> LedgerHistory:
        ledger = super()._open_ledger()
        self.source.create(ledger.ledger_id)
        self.trace.add(f"metadata: ledger {ledger.ledger_id} created")
        return ledger

    def _probes_fence(self, ledger: LedgerHistory) -> bool:
        return super()._probes_fence(ledger) and ledger.ledger_id not in self.history.meta_deleted_at

    def _submit_roll(self) -> None:
        """The writer of an open ledger closes it (the bookie sees nothing) and writes a new one."""
        lid = self.workload.choice(self._open_ledgers)
        self._open_ledgers.remove(lid)
        ledger = self._open_ledger()
        self.trace.add(f"writer of ledger {lid} rolls to ledger {ledger.ledger_id}")

    def _submit_delete_ledger(self) -> None:
        present = sorted(self.source.present)
        closed = [lid for lid in present if lid not in self._open_ledgers]
        writing = [lid for lid in present if lid in self._open_ledgers]
        if writing and (not closed or self.workload.random() < self.gc_plan.delete_open_probability):
            lid, what = self.workload.choice(writing), "its writer still writes it"
        elif closed:
            lid, what = self.workload.choice(closed), "no writer"
        else:
            return
        self.source.delete(lid)
        self.history.deleted_from_metadata(self.history.ledgers[lid])
        self.stats["ledgers_deleted_from_metadata"] += 1
        self.trace.add(f"metadata: ledger {lid} deleted ({what})")

    def _submit_gc(self) -> None:
        self._submit_round("gc")

    def _submit_minor(self) -> None:
        self._submit_round("minor")

    def _submit_major(self) -> None:
        self._submit_round("major")

    def _submit_round(self, kind: str) -> None:
        collector = self.collector

        async def round_(op: _Op) -> None:
            report = await collector.run(kind)
            self._note_deletions(report)  # durable once reported, even if the incarnation crashed after
            if self._answer(op, _describe(report)):
                self._count(report)
                if report.error is not None and not self._may_stop(report.error):
                    self._fail("GcFailsOnlyUnderFaults", f"{op.label}: the round stopped: {report.error}")
            elif report.ledgers_deleted:
                self.trace.add(f"{op.label}: the crashed bookie#{self.incarnation}'s round had deleted ledgers "
                               f"{report.ledgers_deleted}")
        self._submit(f"gc round {kind}", round_)

    def _submit_adds(self, ledger: LedgerHistory, ids: list[int], recovery: bool) -> None:
        """As the bookie world's, and every add attempt is registered when the engine gets it (gc_checks)."""
        flags = FLAG_RECOVERY_ADD if recovery else 0
        items = [(ledger.entries[i], ledger.master_key, flags) for i in ids]
        for entry, _, _ in items:
            self.history.sent_lac(ledger, parse_ids(entry)[2])

        async def add(op: _Op) -> None:
            attempts = [self.history.add_attempt(ledger, i, op.submitted) for i in ids]
            statuses, message = await op.engine.add_entries(items)
            tick = self.history.next_tick()
            if self._answer(op, ",".join(s.name for s in statuses) + (f" ({message})" if message else "")):
                for entry_id, status, attempt in zip(ids, statuses, attempts):
                    attempt.answered, attempt.status = tick, status
                    self.history.add_answered(ledger, entry_id, recovery, status, op.submitted, tick)
        kind = "recovery-add" if recovery else "add"
        self._submit(f"{kind} {ledger.ledger_id}:{','.join(map(str, ids))}", add)

    # -- rounds --------------------------------------------------------------------------------------------
    def _note_deletions(self, report: GcReport) -> None:
        try:
            self.history.deleted_by_gc(report.ledgers_deleted)
        except InvariantViolation as v:
            if self.violation is None:
                self.violation = v

    def _count(self, report: GcReport) -> None:
        s = self.stats
        s["gc_rounds"] += 1
        s["gc_rounds_stopped"] += report.error is not None
        s["ledgers_deleted_by_gc"] += len(report.ledgers_deleted)
        s["kept_by_verification"] += report.kept_by_verify
        s["logs_deleted"] += len(report.logs_deleted)
        s["logs_compacted"] += len(report.logs_compacted)
        s["entries_copied"] += report.entries_copied

    @staticmethod
    def _may_stop(error: str) -> bool:
        """A round stops early only on an injected failure of the metadata store (SimDisk never fails a write)."""
        return error.startswith("ConnectionLossError") and FAILURE_MARK in error

    async def _final_rounds(self) -> None:
        """The liveness phase's rounds: no fault, so each must finish. A checkpoint first empties the write cache,
        so no log rolls after the rounds looked (the log being written is the only one they leave alone)."""
        await self.engine.checkpoint()
        for kind in FINAL_ROUNDS:
            report = await self.collector.run(kind)
            self._note_deletions(report)
            self._count(report)
            self.trace.add(f"final round {kind} -> {_describe(report)}")
            self.raise_violation()
            if report.error is not None:
                self._violate("GcFailsOnlyUnderFaults", f"final round {kind} (no faults) stopped: {report.error}")

    def _check_space_reclaimed(self) -> None:
        """After the final rounds: every entry log but the current one holds bytes of a ledger in the metadata
        (read from the disk and the durable index, not asked of the engine), and no compaction file is left."""
        current = [s["log_id"] for s in self.engine.entry_log_stats() if s["current"]]
        present = self.source.present
        live_logs, indexed_logs = self._indexed_logs(present)
        for name in sorted(self.disk.list_dir(ENTRY_LOG_DIR)):
            if log_fmt.parse_compaction_file_name(name) is not None:
                self._violate("SpaceReclaimed", f"compaction file {name} left after rounds without faults")
                continue
            log_id = log_fmt.parse_entry_log_file_name(name)
            if log_id is None or log_id in current or log_id in live_logs:
                continue  # maybe: the index points at a record of a live ledger there that a bit flip damaged
            data = self.disk.read_all(os.path.join(ENTRY_LOG_DIR, name))
            try:
                _header, records, stopped = log_fmt.scan(data)
            except FormatError as e:
                records, stopped = [], f"unreadable header: {e}"
            ledgers = sorted({r.ledger_id for r in records if r.entry is not None})
            if set(ledgers) & present:
                continue
            if stopped is not None and log_id in indexed_logs:
                continue  # maybe: past the damage it may hold entries the index still points at
            self._violate("SpaceReclaimed", f"entry log {name} ({len(data)} bytes, ledgers {ledgers[:10]}"
                          f"{', scan stopped: ' + stopped if stopped else ''}) holds no ledger of the metadata "
                          f"after a final gc and major round")

    def _indexed_logs(self, present: set[int]) -> tuple[set[int], set[int]]:
        """(logs the durable location index points into for ledgers in the metadata, for any ledger), over every
        entry ever generated."""
        live, indexed = set(), set()
        for lid, ledger in sorted(self.history.ledgers.items()):
            for entry_id in range(ledger.next_entry_id):
                value = self.kv.durable_get(LOCATIONS_KV, index_fmt.location_key(lid, entry_id))
                if value is not None:
                    log_id = index_fmt.decode_location(value).log_id
                    indexed.add(log_id)
                    if lid in present:
                        live.add(log_id)
        return live, indexed


def _describe(report: GcReport) -> str:
    parts = [f"ledgers deleted {report.ledgers_deleted}" if report.ledgers_deleted else "no ledger deleted",
             f"{report.candidates} candidates, {report.kept_by_verify} kept by verification"]
    if report.logs_deleted:
        parts.append(f"logs deleted {[f'{i:x}' for i in report.logs_deleted]}")
    if report.logs_compacted:
        parts.append(f"logs compacted {[f'{i:x}' for i in report.logs_compacted]} ({report.entries_copied} "
                     f"entries, {report.bytes_copied} bytes copied)")
    parts.append(f"{report.bytes_freed} bytes freed")
    if report.error is not None:
        parts.append(f"STOPPED: {report.error}")
    return ", ".join(parts)

