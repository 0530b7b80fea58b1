"""A bookie wiped and formatted while a ledger it held is open: recovery through another broker must keep every
acknowledged entry (bksim.sim.format_scenario: the real broker layer and BookieEngine on the simulator)."""
from __future__ import annotations

from bksim.sim.format_scenario import run_format_scenario

SEEDS = 8


def test_recovery_after_a_bookie_format_keeps_every_acknowledged_entry():
    failures = []
    for seed in range(1, SEEDS + 1):
        result = run_format_scenario(seed)
        assert result.acked_max == 299, result  # the run acknowledged everything it appended
        # the formatted bookie lacks entry 0 (below the recovered LAC: never written back) and does not deny it
        assert (result.limbo_ledger_id_max, result.formatted_answer) == (result.ledger_id + 1, "UNKNOWN_STATE"), result
        if result.problems:
            failures.append(f"seed {seed}: " + "; ".join(result.problems))
        else:
            assert result.read_back == result.last_entry_id + 1, result
    assert not failures, "\n".join(failures)
