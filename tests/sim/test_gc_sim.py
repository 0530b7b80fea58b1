"""The garbage-collection world (bksim.sim.gc_scenario): a sweep of seeds keeps every invariant and crashes at every
step of garbage collection and compaction, one seed gives one byte-identical trace (also across processes with
different string hashing), the simulated metadata store never answers a failure as an absence, and deliberately
broken variants of garbage collection and compaction are caught within a few seeds."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import random
import subprocess
import sys
import time

import pytest

from bksim.bookie import engine as engine_mod
from bksim.bookie import gc as gc_mod
from bksim.bookie.index import LocationIndex
from bksim.cli.main import main
from bksim.model.errors import ConnectionLossError
from bksim.sim import loop as sim_loop
from bksim.sim.clock import SimClock
from bksim.sim.gc_scenario import CRASH_STEPS, gc_plans, run_gc_sim
from bksim.sim.known_issues import KNOWN_INVARIANTS
from bksim.sim.ledger_source import SimLedgerSource
from bksim.sim.plan import GcPlan
from helpers import wait_until_async

LONG_SWEEPS = os.environ.get("BKSIM_LONG_SWEEPS", "") not in ("", "0")  # `make test-sweeps`
SWEEP_SEEDS = 3000 if LONG_SWEEPS else 500  # about 27 s here for 500 (about 53 ms a seed of 200 steps)
SWEEP_STEPS = 200
SPLIT_SEEDS = 150  # the sweep with index batches split 2 keys per write (~10 s)
SWEEP_SECONDS_MAX = 180.0  # generous: a regression to a second per seed fails loudly
STEP_CRASHES_MIN = 20  # each of the ten steps is crashed at 75-150 times over the sweep
BROKEN_SEEDS_MAX = 40  # a deliberately broken variant must be caught within this many seeds
GC_INVARIANTS = ("LiveEntriesStayReadable", "DeletedStaysDeleted")


def test_a_sweep_of_seeds_keeps_every_invariant_and_crashes_at_every_step():
    started = time.perf_counter()
    failures = []
    totals: collections.Counter[str] = collections.Counter()
    for seed in range(1, SWEEP_SEEDS + 1):
        result = run_gc_sim(seed, SWEEP_STEPS, tolerated=KNOWN_INVARIANTS)
        if not result.passed:
            failures.append(f"seed {seed}: {result.violation} (replay: bksim sim --world gc --seed {seed} "
                            f"--tolerate-known --trace)")
        totals.update({k: v for k, v in result.stats.items() if isinstance(v, int)})
    elapsed_s = time.perf_counter() - started
    assert not failures, "\n".join(failures)
    assert elapsed_s < SWEEP_SECONDS_MAX, f"{SWEEP_SEEDS} seeds took {elapsed_s:.1f} s"
    # every step of garbage collection and compaction was crashed at, many times
    uncovered = [step for step in CRASH_STEPS if totals[f"crash_at_{step}"] < STEP_CRASHES_MIN]
    assert not uncovered, {step: totals[f"crash_at_{step}"] for step in CRASH_STEPS}
    # and the rest of what the world claims to do happened
    per_800 = SWEEP_SEEDS / 800  # the floors below are for 800 seeds
    assert totals["gc_rounds"] > 8000 * per_800 and totals["ledgers_deleted_by_gc"] > 5000 * per_800, totals
    assert totals["logs_deleted"] > 5000 * per_800 and totals["logs_compacted"] > 1500 * per_800 and \
        totals["entries_copied"] > 10_000 * per_800, totals
    assert totals["metadata_failures"] > 1000 * per_800 and totals["gc_rounds_stopped"] > 1000 * per_800, totals
    # stale listings: verification kept their missing ledgers
    assert totals["kept_by_verification"] > 100 * per_800, totals
    assert totals["crashes"] > 3000 * per_800 and totals["acked_entries"] > 80_000 * per_800 and \
        totals["bit_flips"] > 200 * per_800, totals


def test_index_batches_split_into_many_store_writes_keep_every_invariant_across_crashes(monkeypatch):
    """Checkpoints, deletions and compaction write their index batches 2 keys per store write here, so crashes
    land between the writes of one batch (the simulated store keeps a seeded prefix of unsynced writes)."""
    from bksim.bookie import index as index_mod

    monkeypatch.setattr(index_mod, "BATCH_KEYS_MAX", 2)
    failures = []
    crashes = 0
    for seed in range(1, SPLIT_SEEDS + 1):
        result = run_gc_sim(seed, SWEEP_STEPS, tolerated=KNOWN_INVARIANTS)
        if not result.passed:
            failures.append(f"seed {seed}: {result.violation}")
        crashes += result.stats["crashes"]
    assert not failures, "\n".join(failures)
    assert crashes > SPLIT_SEEDS, crashes


def test_the_same_seed_gives_a_byte_identical_trace():
    first = run_gc_sim(8)  # crashes at gc_ledger_delete and compact_rename, compactions, deletions
    second = run_gc_sim(8)
    assert first.passed and first.trace == second.trace and first.digest == second.digest
    assert first.stats["crash_at_compact_rename"] == 1 and first.stats["logs_compacted"] > 0
    assert first.stats["ledgers_deleted_by_gc"] > 0 and len(first.trace) > 300
    assert run_gc_sim(9).digest != first.digest


def test_the_trace_does_not_depend_on_string_hashing_or_the_process():
    seed, steps = 10, 120
    expected = run_gc_sim(seed, steps).digest
    code = f"from bksim.sim.gc_scenario import run_gc_sim; print(run_gc_sim({seed}, {steps}).digest)"
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        assert out.stdout.strip() == expected, f"PYTHONHASHSEED={hash_seed}"


def test_the_plan_is_a_function_of_the_seed_and_aims_at_every_step_over_ten_seeds():
    assert gc_plans(5) == gc_plans(5) and gc_plans(5) != gc_plans(6)
    first_steps = {GcPlan.from_seed(seed, CRASH_STEPS).crash_points[0][0] for seed in range(20, 20 + len(CRASH_STEPS))}
    assert first_steps == set(CRASH_STEPS)
    plan, gc_plan = gc_plans(5)
    assert plan.entry_log_bytes_max == gc_plan.entry_log_bytes_max  # small logs: sealed logs to collect
    knobs = dict(line.split(" = ") for line in gc_plan.describe())
    for name in ("listing_failure_probability", "listing_partial_probability", "listing_lag_ms_max",
                 "listing_stale_ms_max", "gc_verify_metadata", "major_compaction_threshold", "crash_points"):
        assert f"gc.{name}" in knobs, name


def _source(rng_seed: int, **faults) -> tuple[SimLedgerSource, list[int]]:
    listings: list[int] = []
    knobs = dict(failure_probability=0.0, partial_probability=0.0, page_ledgers=2, lag_ms_max=0.0,
                 exists_failure_probability=0.0) | faults
    source = SimLedgerSource(random.Random(rng_seed), SimClock(), lambda line: None,
                             lambda: listings.append(len(listings)) or len(listings), **knobs)
    return source, listings


def test_the_metadata_fake_fails_or_answers_in_full_never_short():
    async def scenario():
        outcomes = collections.Counter()
        for rng_seed in range(40):
            source, _ = _source(rng_seed, failure_probability=0.3, partial_probability=0.5)
            for lid in range(1, 8):
                source.create(lid)
            try:
                answer = await source.ledger_ids()
            except ConnectionLossError as e:
                assert "simulated" in str(e)
                outcomes["broke off" if "broke off" in str(e) else "failed"] += 1
            else:
                assert answer == list(range(1, 8))
                outcomes["complete"] += 1
        assert outcomes["broke off"] and outcomes["failed"] and outcomes["complete"], outcomes

    sim_loop.run(scenario(), seed=1)


def test_a_lagging_listing_answers_the_state_it_was_asked_in():
    async def scenario():
        source, listings = _source(3, lag_ms_max=10.0)
        source.create(1)
        source.create(2)
        listing = asyncio.ensure_future(source.ledger_ids())
        # the listing began (its tick recorded) and waits for its answer
        await wait_until_async(lambda: listings, 1, interval_s=0, message="the listing to begin")
        assert listings == [0]
        source.create(3)  # created while the listing runs: not in its answer
        source.delete(1)  # deleted meanwhile: still in it
        assert await listing == [1, 2]
        assert await source.ledger_exists(3) and not await source.ledger_exists(1)  # verification: now

    sim_loop.run(scenario(), seed=1)


def test_a_stale_listing_answers_a_state_from_before_it_was_asked():
    async def scenario():
        clock = SimClock()
        answers = collections.Counter()
        source = SimLedgerSource(random.Random(5), clock, lambda line: None, lambda: 0, failure_probability=0.0,
                                 partial_probability=0.0, page_ledgers=4, lag_ms_max=0.0,
                                 exists_failure_probability=0.0, stale_ms_max=20.0)
        source.create(1)
        await clock.sleep_ms(30.0)
        source.create(2)  # older than any stale answer may be: every answer has it
        await clock.sleep_ms(30.0)
        source.create(3)  # just before the listings: a stale answer may miss it
        for _ in range(40):
            answers[tuple(await source.ledger_ids())] += 1
        assert set(answers) == {(1, 2), (1, 2, 3)}, answers

    sim_loop.run(scenario(), seed=1)


def _first_violation(max_seeds: int):
    for seed in range(1, max_seeds + 1):
        result = run_gc_sim(seed, tolerated=KNOWN_INVARIANTS)
        if not result.passed:
            return seed, result.violation
    return None, None


def test_gc_that_ignores_the_generation_is_caught(monkeypatch):
    # BROKEN: a ledger touched after the round's generation was read (an add that arrived while the listing
    # ran) is deleted anyway
    monkeypatch.setattr(engine_mod.BookieEngine, "gc_untouched_since", lambda self, ledger_id, generation: True)
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught GC ignoring the generation"
    assert violation.invariant in GC_INVARIANTS, (seed, violation)


def test_compaction_that_deletes_the_old_log_before_the_index_batch_is_synced_is_caught(monkeypatch):
    # BROKEN: compaction's index batch is written without a sync, and the old log deleted right after: a crash
    # then loses the batch, and the index points into a log that is gone
    compacting = {"now": False}
    put_batch, compact_log = LocationIndex.put_batch, engine_mod.BookieEngine.compact_log

    async def put_batch_maybe_unsynced(self, items):
        if compacting["now"]:
            return await self._store.write(items, [], sync=False)
        return await put_batch(self, items)

    async def compact_log_unsynced(self, log_id, throttle=None):
        compacting["now"] = True
        try:
            return await compact_log(self, log_id, throttle)
        finally:
            compacting["now"] = False
    monkeypatch.setattr(LocationIndex, "put_batch", put_batch_maybe_unsynced)
    monkeypatch.setattr(engine_mod.BookieEngine, "compact_log", compact_log_unsynced)
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught compaction deleting before the sync"
    assert violation.invariant == "LiveEntriesStayReadable", (seed, violation)


class EmptyOnFailure:
    """BROKEN: a listing that fails or breaks off counts as "no ledgers in the metadata"."""

    def __init__(self, source):
        self._source = source

    async def ledger_ids(self):
        try:
            return await self._source.ledger_ids()
        except ConnectionLossError:
            return []

    async def ledger_exists(self, ledger_id):
        return await self._source.ledger_exists(ledger_id)


@pytest.fixture
def broken_listing(monkeypatch):
    init = gc_mod.GarbageCollector.__init__
    monkeypatch.setattr(gc_mod.GarbageCollector, "__init__",
                        lambda self, engine, source, *args, **kwargs: init(self, engine, EmptyOnFailure(source),
                                                                           *args, **kwargs))


def test_gc_that_treats_a_failed_listing_as_empty_is_caught(broken_listing):
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught GC taking a failed listing for empty"
    assert violation.invariant == "LiveEntriesStayReadable", (seed, violation)


def test_gc_that_skips_verification_under_a_stale_listing_is_caught(monkeypatch):
    # BROKEN: the candidates of a listing answered from a store behind the leader are not read again
    init = gc_mod.GarbageCollector.__init__
    monkeypatch.setattr(gc_mod.GarbageCollector, "__init__", lambda self, engine, source, config, *args, **kwargs: init(
        self, engine, source, dataclasses.replace(config, gc_verify_metadata=False), *args, **kwargs))
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None and violation.invariant == "LiveEntriesStayReadable", (seed, violation)


def test_gc_that_leaves_entries_of_deleted_ledgers_indexed_is_caught(monkeypatch):
    async def keep(self, keys):  # BROKEN: the deleted ledger's location records stay
        return None
    monkeypatch.setattr(LocationIndex, "delete_batch", keep)
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None and violation.invariant == "DeletedStaysDeleted", (seed, violation)


def test_gc_that_never_deletes_a_dead_log_is_caught(monkeypatch):
    async def keep_every_log(self):  # BROKEN: logs left with no live ledger stay on disk
        return [], 0
    monkeypatch.setattr(engine_mod.BookieEngine, "delete_dead_logs", keep_every_log)
    seed, violation = _first_violation(BROKEN_SEEDS_MAX)
    assert violation is not None and violation.invariant == "SpaceReclaimed", (seed, violation)


# seeds that found defects of the engine's garbage collection and compaction; each must pass strictly
REGRESSION_SEEDS = {
    105: "a checkpoint crashed between its location batch and its ledger-index flush left locations of a ledger "
         "with no ledger record: garbage collection never listed the ledger, compaction skipped its records as "
         "deleted and deleted their log (IO_ERROR, never NO_LEDGER)",
    182: "a crash between deleting a dead log and dropping its metadata record: the next start reused the log id "
         "for its new log, the stale record called it dead, and a later round deleted live entries",
    399: "a compaction that kept its old log (a scan stopped on a torn record) crashed before its rename was "
         "durable; start-up finished it as a complete one and deleted the old log with live entries",
    1004: "a read while the deletion's index batch was being written put an entry of the deleted ledger back into "
          "the read cache (dropped before the batch): it was served after the round reported the ledger deleted",
}


@pytest.mark.parametrize("seed", sorted(REGRESSION_SEEDS))
def test_a_gc_seed_that_once_failed_now_passes(seed):
    result = run_gc_sim(seed)
    assert result.passed, (f"seed {seed} ({REGRESSION_SEEDS[seed]}) fails again: {result.violation}; replay: "
                           f"bksim sim --world gc --seed {seed} --trace")
    assert result.stats["ledgers_deleted_by_gc"] > 0


# -- the command ---------------------------------------------------------------------------------------------
def test_one_gc_seed_prints_its_plans_and_pass(capsys):
    assert main(["sim", "--world", "gc", "--seed", "8", "--steps", "120"]) == 0
    out = capsys.readouterr().out
    assert ("bksim sim --world gc: seed 8; replay: make sim SEED=8 STEPS=120 SIM_ARGS='--world gc'   |   "
            "bksim sim --world gc --seed 8 --steps 120 --trace") in out
    for knob in ("crash_probability = ", "gc.listing_lag_ms_max = ", "gc.crash_points = ", "gc.gc_verify_metadata = "):
        assert knob in out
    assert "PASS seed=8" in out and f"sha256 {run_gc_sim(8, 120).digest}" in out


def test_a_gc_trace_prints_rounds_and_metadata_answers(capsys):
    assert main(["sim", "--world", "gc", "--seed", "10", "--steps", "120", "--trace"]) == 0
    out = capsys.readouterr().out
    assert " gc round " in out and "metadata: listing #1 " in out and "CRASH at fault step " in out


def test_a_failing_gc_sweep_lists_each_failure_with_its_replay_line(capsys, broken_listing):
    assert main(["sim", "--world", "gc", "--sweep", "3"]) == 1
    out = capsys.readouterr().out
    assert "failures by invariant: LiveEntriesStayReadable" in out
    assert "replay: make sim SEED=1 SIM_ARGS='--world gc'   |   bksim sim --world gc --seed 1 --trace" in out
