"""Seeds that once found a bug (in the bookie engine, or in the ledger protocol / broker layer), kept as
regression tests (ARCHITECTURE.md: "seeds that ever failed are kept"): each must now pass strictly (nothing
tolerated). Replay one: `make sim SEED=N SIM_ARGS='--world bookie'` (engine seeds) or `make sim SEED=N`
(ledger seeds)."""
from __future__ import annotations

import pytest

from bksim.sim.bookie_scenario import run_bookie_sim
from bksim.sim.ledger_scenario import run_ledger_sim

REGRESSION_SEEDS = {
    4: "LacMonotonicAcrossRestarts: after a restart a RECOVERY_ADD of an older entry set the known LAC below "
       "the LAC of the last durable entry (8 < 11)",
    21: "LacMonotonicAcrossRestarts, through replayed records of older entries (44 < 50)",
    24: "CleanStopSucceeds: close() cancelled a checkpoint inside an entry-log roll; its own checkpoint then "
        "failed with FileExistsError on the log left behind",
    1834: "CleanStopSucceeds, seen as 'checkpoint failed' logged during close()",
    342: "LacFromDamagedEntry: a flipped bit in the LAC field of the last entry was served as the known LAC",
    469: "LacFromDamagedEntry without a restart (every add so far had carried LAC -1)",
}


@pytest.mark.parametrize("seed", sorted(REGRESSION_SEEDS))
def test_a_seed_that_once_failed_now_passes(seed):
    result = run_bookie_sim(seed)
    assert result.passed, (f"seed {seed} ({REGRESSION_SEEDS[seed]}) fails again: {result.violation}; "
                           f"replay: make sim SEED={seed}")
    assert result.stats["acked_entries"] > 0


# -- the ledger world (bksim.sim.ledger_scenario) ----------------------------------------------------------------
LEDGER_REGRESSION_SEEDS = {
    875: "WritersFinish: a late FENCED answer for an already acknowledged entry failed the writer with nothing "
         "pending; no AddsFailed was emitted, so the LedgerHandle never learnt it and close() waited forever",
    900: "WritersFinish, the same writer failure with nothing pending",
    976: "WritersFinish, the same",
    1226: "WritersFinish, the same",
    1563: "WritersFinish, the same",
    2981: "WritersFinish, the same",
    305: "NoDivergenceBetweenClientAndMetaData: two recoveries at once, a bookie of the ensemble down; a "
         "recovery CASed its write-back's ensemble change (a segment at entry 0 naming a bookie that got nothing) "
         "and then failed; the next recovery read that segment, found no entry and closed at -1 below an "
         "acknowledged entry",
    1079: "AllCommittedEntriesReachAckQuorum at the close: one recovery closed over the other's segment, whose "
          "new bookie had none of the written-back entries",
    1666: "BrokerNeverRaises: a recovery's ensemble change conflicted with the other's later segment and asked "
          "for a segment starting before it (ValueError)",
}


@pytest.mark.parametrize("seed", sorted(LEDGER_REGRESSION_SEEDS))
def test_a_ledger_seed_that_once_failed_now_passes(seed):
    result = run_ledger_sim(seed)
    assert result.passed, (f"seed {seed} ({LEDGER_REGRESSION_SEEDS[seed]}) fails again: {result.violation}; "
                           f"replay: make sim SEED={seed}")
    assert result.stats["acked"] > 0
