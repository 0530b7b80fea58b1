"""The ledger simulation (bksim.sim.ledger_scenario): a 500-seed sweep keeps every ledger invariant, one seed
gives one byte-identical trace (also across processes with different string hashing), the plan is a function
of the seed and lists every knob and fault, and the checkers catch real bugs: deliberately broken variants of
the broker layer, the ledger state machines and the bookie are found within a few seeds."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bksim.bookie import engine as engine_mod
from bksim.broker import driver as driver_mod
from bksim.broker import recovery as broker_recovery_mod
from bksim.ledger import recovery as recovery_mod
from bksim.ledger.writer import LedgerWriter, WriterState
from bksim.metadata import ledger_metadata
from bksim.metadata.paths import ledger_path
from bksim.model.status import StatusCode
from bksim.sim.ledger_scenario import run_ledger_sim
from bksim.sim.plan import LedgerPlan

SWEEP_SEEDS = 500  # make test runs at least 500 seeds
SWEEP_SECONDS_MAX = 240.0  # generous: about 45 s here (~85 ms a seed); a regression to seconds per seed fails
BROKEN_SEEDS_MAX = 40  # a deliberately broken variant must be caught within this many seeds
# the takeover race needs a double recovery, a bookie of that ledger's ensemble down and a write-back that reaches
# it: rarer (seeds 408 and 1,079 of the first 1,200 show it). `make test` runs those two seeds; the search of the
# first 1,200 (about 50 s) runs with BKSIM_LONG_SWEEPS=1 (`make test-sweeps`)
TAKEOVER_RACE_SEEDS_MAX = 1200
TAKEOVER_RACE_SEEDS = (408, 1079)
LONG_SWEEPS = os.environ.get("BKSIM_LONG_SWEEPS", "") not in ("", "0")


def test_a_sweep_of_500_seeds_keeps_every_ledger_invariant():
    started = time.perf_counter()
    failures = []
    totals = {k: 0 for k in ("acked", "entries_read", "recoveries_ok", "broker_crashes", "takeovers",
                             "fence_coverages", "cas_conflicts", "bookie_crashes", "bookie_replayed_records",
                             "bookie_session_expiries", "net_lost", "net_duplicated", "writer_failures")}
    for seed in range(1, SWEEP_SEEDS + 1):
        result = run_ledger_sim(seed)
        if not result.passed:
            failures.append(f"seed {seed}: {result.violation} (replay: bksim sim --seed {seed} --trace)")
        for key in totals:
            totals[key] += result.stats[key]
    elapsed_s = time.perf_counter() - started
    assert not failures, "\n".join(failures)
    assert elapsed_s < SWEEP_SECONDS_MAX, f"{SWEEP_SEEDS} seeds took {elapsed_s:.1f} s"
    # the sweep exercised what it claims to: faults of every kind happened, data was acknowledged and read back
    assert totals["acked"] > 10_000 and totals["entries_read"] > totals["acked"], totals
    assert totals["recoveries_ok"] > 300 and totals["takeovers"] > 100 and totals["broker_crashes"] > 100, totals
    assert totals["fence_coverages"] > 50 and totals["cas_conflicts"] > 10, totals
    assert totals["bookie_crashes"] > 200 and totals["bookie_replayed_records"] > 800, totals
    assert totals["bookie_session_expiries"] > 50 and totals["net_lost"] > 300 and totals["net_duplicated"] > 300, \
        totals


def test_the_same_seed_gives_a_byte_identical_trace():
    seed = 4  # broker crashes and takeovers, a fencing recovery, a bookie crash, a lossy network
    first = run_ledger_sim(seed)
    second = run_ledger_sim(seed)
    assert first.passed and first.trace == second.trace and first.digest == second.digest
    assert first.stats["broker_crashes"] >= 1 and first.stats["recoveries_ok"] >= 1 and first.stats["net_lost"] > 0
    assert len(first.trace) > 300
    assert run_ledger_sim(5).digest != first.digest


def test_the_trace_does_not_depend_on_string_hashing_or_the_process():
    seed = 8
    expected = run_ledger_sim(seed).digest
    code = f"from bksim.sim.ledger_scenario import run_ledger_sim; print(run_ledger_sim({seed}).digest)"
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        assert out.stdout.strip() == expected, f"PYTHONHASHSEED={hash_seed}"


def test_the_plan_is_a_function_of_the_seed_and_lists_every_knob_and_fault():
    plan = LedgerPlan.from_seed(3)
    assert plan == LedgerPlan.from_seed(3) and plan != LedgerPlan.from_seed(4)
    lines = plan.describe()
    knobs = dict(line.split(" = ") for line in lines if " = " in line)
    for name in ("seed", "bookies", "brokers", "bookie_timeout_ms", "session_timeout_ms", "net_jitter_ms",
                 "disk.latency_ms_max", "disk.torn_tail_probability", "slow_disk_bookie", "flush_interval_ms",
                 "events"):
        assert name in knobs, name
    assert int(knobs["events"]) == len(plan.events) > 0
    events = [line for line in lines if line.startswith("  at ")]
    assert len(events) == len(plan.events)
    assert [e.at_ms for e in plan.events] == sorted(e.at_ms for e in plan.events)
    kinds = {e.kind for seed in range(1, 60) for e in LedgerPlan.from_seed(seed).events}
    assert kinds == {"partition", "slow_bookie", "lossy_network", "crash_bookie", "expire_bookie_session",
                     "crash_broker", "recover", "double_recovery", "expire_broker_session"}
    one_way = [e for seed in range(1, 60) for e in LedgerPlan.from_seed(seed).events
               if e.kind == "partition" and e.one_way]
    assert one_way and " -> " in one_way[0].describe()


# -- the checkers catch deliberately broken code -----------------------------------------------------------------
def _first_violation(max_seeds: int = BROKEN_SEEDS_MAX):
    for seed in range(1, max_seeds + 1):
        result = run_ledger_sim(seed)
        if not result.passed:
            return seed, result.violation
    return None, None


def test_a_recovery_that_does_not_fence_is_caught(monkeypatch):
    original = recovery_mod.LedgerRecovery.start_recovery

    def start_without_fencing(self):  # BROKEN: fencing reads without the FENCE flag
        return [recovery_mod.ReadEntry(c.bookie, c.entry_id, fence=False) for c in original(self)]
    monkeypatch.setattr(recovery_mod.LedgerRecovery, "start_recovery", start_without_fencing)
    original_init = recovery_mod.LedgerRecovery.__init__
    monkeypatch.setattr(recovery_mod.LedgerRecovery, "__init__",
                        lambda self, *a, **kw: original_init(self, *a, **dict(kw, fence_reads=False)))
    seed, violation = _first_violation()
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught a recovery that never fences"
    assert violation.invariant == "NoDivergenceBetweenClientAndMetaData", (seed, violation)


def test_a_bookie_that_ignores_its_fence_is_caught(monkeypatch):
    original = engine_mod.BookieEngine._check_ledger

    def check_ignoring_fence(self, ledger_id, master_key, flags):  # BROKEN: a fenced ledger takes normal adds
        status, why = original(self, ledger_id, master_key, flags)
        return (StatusCode.OK, "") if status is StatusCode.FENCED else (status, why)
    monkeypatch.setattr(engine_mod.BookieEngine, "_check_ledger", check_ignoring_fence)
    seed, violation = _first_violation()
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught bookies that ignore fences"
    assert violation.invariant in ("FencedWriterMakesNoProgress", "NoDivergenceBetweenClientAndMetaData"), \
        (seed, violation)


def test_a_writer_that_acknowledges_below_the_ack_quorum_is_caught(monkeypatch):
    original_init = LedgerWriter.__init__

    def init_acking_early(self, *args, **kwargs):  # BROKEN: acknowledges at Qa - 1 bookies
        original_init(self, *args, **kwargs)
        self.ack_quorum_size = max(1, self.ack_quorum_size - 1)
    monkeypatch.setattr(LedgerWriter, "__init__", init_acking_early)
    seed, violation = _first_violation()
    assert violation is not None, f"no seed of {BROKEN_SEEDS_MAX} caught a writer acknowledging below Qa"
    assert violation.invariant == "AllCommittedEntriesReachAckQuorum", (seed, violation)


def test_a_writer_that_holds_back_a_complete_entry_is_caught_by_its_own_invariants(monkeypatch):
    """The world checks every live writer's check_invariants() after each loop step: a complete head that is not
    acknowledged is named at once (AcknowledgeAtQuorum), long before a stalled writer would show as a liveness
    failure."""
    original = LedgerWriter.on_add_results

    def results_recorded_not_acknowledged(self, bookie, entry_ids, statuses, writable_bookies=()):
        if self.state is not WriterState.WRITING or not all(s is StatusCode.OK for s in statuses):
            return original(self, bookie, entry_ids, statuses, writable_bookies)
        self.events += 1  # BROKEN: the fast path records the acks and never acknowledges
        for entry_id in entry_ids:
            pending, index = self._pending.get(entry_id), self._index_of(bookie, entry_id)
            if pending is not None and index is not None:
                pending.acked.add(index)
        return []
    monkeypatch.setattr(LedgerWriter, "on_add_results", results_recorded_not_acknowledged)
    seed, violation = _first_violation(5)
    assert violation is not None and violation.invariant == "AcknowledgeAtQuorum", (seed, violation)
    assert "writer" in violation.detail and "acks" in violation.detail


def test_a_blind_metadata_write_is_caught(monkeypatch):
    async def write_without_cas(store, ledger_id, metadata, version):  # BROKEN: overwrites whatever is there
        return await store.set(ledger_path(ledger_id), ledger_metadata.encode(metadata), -1)
    monkeypatch.setattr(driver_mod, "write_ledger_metadata", write_without_cas)
    seed, violation = _first_violation(5)
    assert violation is not None and violation.invariant == "MetadataVersionsIncrease", (seed, violation)


def test_absence_decided_on_one_negative_is_caught(monkeypatch):
    # BROKEN: an entry counts as absent after a single NO_ENTRY (instead of Qw - Qa + 1)
    monkeypatch.setattr(recovery_mod, "negatives_needed_for_absence", lambda qw, qa: 1)
    seed, violation = _first_violation(60)
    assert violation is not None, "no seed of 60 caught absence decided on one negative"
    # or recovery refuses forever: one replica's NO_ENTRY for an entry at the recovered LAC "proves" it absent
    assert violation.invariant in ("NoDivergenceBetweenClientAndMetaData", "AllAckedEntriesAreReadable",
                                   "EveryLedgerGetsClosed"), (seed, violation)


def test_a_recovery_that_publishes_its_ensemble_changes_at_once_is_caught(monkeypatch):
    # BROKEN: the write-back's ensemble changes are CASed at once (a concurrent recovery can replace them), and
    # the close takes whatever segments it re-reads after a conflict
    monkeypatch.setattr(broker_recovery_mod.RecoveryRun, "_update_ensemble", driver_mod.LedgerDriver._update_ensemble)
    monkeypatch.setattr(broker_recovery_mod.RecoveryRun, "_closed_value", driver_mod.LedgerDriver._closed_value)
    if LONG_SWEEPS:
        seed, violation = _first_violation(TAKEOVER_RACE_SEEDS_MAX)
        assert violation is not None, \
            f"no seed of {TAKEOVER_RACE_SEEDS_MAX} caught a close over another recovery's segment"
        caught = [(seed, violation)]
    else:
        caught = [(seed, run_ledger_sim(seed).violation) for seed in TAKEOVER_RACE_SEEDS]
        assert all(violation is not None for _seed, violation in caught), caught
    # an entry below Qa in the closed metadata, or (a published segment of a recovery that then failed) a later
    # recovery reading only the new bookie and closing below acknowledged entries
    for seed, violation in caught:
        assert violation.invariant in ("AllCommittedEntriesReachAckQuorum",
                                       "NoDivergenceBetweenClientAndMetaData"), (seed, violation)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_passing_seed_closes_every_ledger_and_audits_it(seed):
    result = run_ledger_sim(seed)
    assert result.passed, result.violation
    audits = [line for line in result.trace if " audit ledger " in line]
    assert len(audits) == result.stats["ledgers"] > 0
    assert all("replicas identical" in line for line in audits)
    assert result.trace[-1].endswith("PASS")
