"""The autorecovery world (bksim.sim.autorecovery_scenario): the auditor and the replication workers run beside
the ledger world's brokers and bookies, bookies are lost for good, autorecovery nodes crash mid-copy, lose their
sessions and their locks; a sweep keeps every invariant, a worker that publishes a replacement before it copied
is caught, one seed gives one trace, and the seeds that found bugs in the worker stay green."""
from __future__ import annotations

import time

import pytest

from bksim.autorecovery import worker as worker_mod
from bksim.sim.autorecovery_scenario import run_autorecovery_sim
from bksim.sim.ledger_scenario import run_ledger_sim
from bksim.sim.plan import AutorecoveryPlan, LedgerPlan

SWEEP_SEEDS = 150
SWEEP_SECONDS_MAX = 60.0  # generous: about 12 s here (~80 ms a seed); a regression to seconds per seed fails
BROKEN_SEEDS_MAX = 20


def test_a_sweep_of_150_seeds_keeps_every_autorecovery_invariant():
    started = time.perf_counter()
    failures = []
    totals = {k: 0 for k in ("bookies_lost", "replacements", "lost_ledgers", "node_crashes", "auditor_expiries",
                             "locks_lost", "worker_recoveries", "entries_copied", "acked")}
    seeds_with_a_loss = 0
    for seed in range(1, SWEEP_SEEDS + 1):
        result = run_autorecovery_sim(seed)
        if not result.passed:
            failures.append(f"seed {seed}: {result.violation}")
        seeds_with_a_loss += result.stats["bookies_lost"] > 0
        for key in totals:
            totals[key] += result.stats[key]
    elapsed_s = time.perf_counter() - started
    assert not failures, "\n".join(failures)
    assert elapsed_s < SWEEP_SECONDS_MAX, f"{SWEEP_SEEDS} seeds took {elapsed_s:.1f} s"
    # the sweep exercised what it claims to: bookies lost for good in most seeds, replicas copied and published,
    # ledgers destroyed beyond repair reported lost, every autorecovery fault
    assert seeds_with_a_loss > SWEEP_SEEDS // 2, seeds_with_a_loss
    assert totals["replacements"] > 150 and totals["entries_copied"] > 1000, totals
    assert totals["lost_ledgers"] > 0 and totals["worker_recoveries"] > 0, totals
    assert totals["node_crashes"] > 3 and totals["auditor_expiries"] > 30 and totals["locks_lost"] > 3, totals


def test_the_same_seed_gives_a_byte_identical_trace():
    seed = 3
    first, second = run_autorecovery_sim(seed), run_autorecovery_sim(seed)
    assert first.passed and first.trace == second.trace and first.digest == second.digest
    assert first.stats["bookies_lost"] >= 1
    assert run_autorecovery_sim(4).digest != first.digest


def test_the_autorecovery_plan_leaves_the_ledger_plan_of_the_seed_as_it_was():
    plan = LedgerPlan.from_seed(7)
    autorecovery = AutorecoveryPlan.from_seed(7, plan)
    assert plan == LedgerPlan.from_seed(7) and autorecovery == AutorecoveryPlan.from_seed(7, plan)
    lines = autorecovery.describe()
    assert any(line.startswith("autorecovery.lost_bookie = ") for line in lines)
    kinds = {e.kind for seed in range(1, 40) for e in AutorecoveryPlan.from_seed(seed, LedgerPlan.from_seed(seed))
             .events}
    assert kinds == {"crash_autorecovery", "expire_auditor_session", "lose_lock"}
    # the ledger world of the same seed is not changed by this one (it has no autorecovery)
    assert run_ledger_sim(2).passed


def test_a_ledger_destroyed_beyond_repair_is_reported_lost_not_repaired():
    seed = 38  # a second bookie lost for good once every ledger is CLOSED: one ledger had entries only on the two
    result = run_autorecovery_sim(seed)
    assert result.passed, result.violation
    lost = [line for line in result.trace if "beyond repair" in line and "reported lost" in line]
    assert len(lost) == result.stats["lost_ledgers"] > 0


def test_a_worker_that_publishes_a_replacement_before_it_copied_is_caught(monkeypatch):
    async def copy_nothing(self, ledger_id, metadata, segment, step, replacement, missing):
        return []  # BROKEN: the replacement is CASed into the metadata without a single entry copied
    monkeypatch.setattr(worker_mod.ReplicationWorker, "_copy", copy_nothing)
    for seed in range(1, BROKEN_SEEDS_MAX + 1):
        result = run_autorecovery_sim(seed)
        if not result.passed:
            assert result.violation.invariant == "ReplacementHoldsItsEntries", (seed, result.violation)
            return
    pytest.fail(f"no seed of {BROKEN_SEEDS_MAX} caught a worker that publishes before it copies")


@pytest.mark.parametrize("seed, found", [
    (11, "a write set of one bookie (Qw = 1): the worker's read had no replica to ask and raised IndexError"),
    (30, "a marked bookie back with its copies was not asked: the ledger was reported lost"),
    (26, "the only spare was a marked bookie that came back: the repair failed forever (NOT_ENOUGH_BOOKIES)"),
    (710894, "a ledger found lost while a marked bookie was down for now stayed reported lost after it registered "
             "again (the worker waited lost_ledger_retry_ms)"),
    (711720, "a Qw = 1 ledger found lost while its only bookie was down for now stayed reported lost after the "
             "bookie registered again"),
    (711974, "a marked bookie asked before it was back answered nothing and was counted as no copy although it "
             "was registered when the worker judged"),
    (712228, "a marked bookie down for now and asked before it registered again was counted as no copy (and, "
             "earlier, a read lost on the network to a registered marked bookie)"),
    (753674, "two registered marked bookies, each at an index that must hold no entry of a segment, answered "
             "NO_LEDGER there and were swapped for each other in it until every claim gave up: the mark stayed"),
    (756194, "a lost bookie registered again between two bookie checks, a worker kept it and removed the marks, "
             "and it was lost for good before the next check: the auditor, which never saw it back, did not "
             "mark its ledgers again"),
    (764273, "a ledger found lost while a marked bookie was down for now stayed reported lost after the bookie "
             "registered again: the worker that found it was busy in another claim, the other worker's claim, "
             "begun before the bookie was back, failed without withdrawing the verdict, and nothing else could "
             "tell the verdict rested on that bookie"),
    (786941, "a marked bookie kept in one segment of a claim was lost for good before the claim ended; the "
             "auditor's mark named it already and changed nothing, so the claim removed the mark with a segment "
             "still naming the lost bookie, and nothing marked it again before the next full bookie check"),
])
def test_seeds_that_found_worker_bugs_pass(seed, found):
    result = run_autorecovery_sim(seed)
    assert result.passed, f"{found}: {result.violation}"
