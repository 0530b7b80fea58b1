"""`bksim sim`: prints the seed and every knob (and for the ledger world, the fault plan), PASS with the trace
digest, or the violated invariant with the trace tail and the replay commands; `--sweep` prints progress and
a summary listing each failure. `--world ledger` is the default; `--world bookie` keeps the engine simulation."""
from __future__ import annotations

import re

import pytest

from bksim.cli.main import main
from bksim.formats import journal as jfmt
from bksim.ledger.writer import LedgerWriter
from bksim.sim.bookie_scenario import run_bookie_sim
from bksim.sim.ledger_scenario import run_ledger_sim


def test_one_passing_seed_prints_its_plan_and_pass(capsys):
    assert main(["sim", "--world", "bookie", "--seed", "3", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert ("bksim sim --world bookie: seed 3; replay: make sim SEED=3 STEPS=60 SIM_ARGS='--world bookie'   |   "
            "bksim sim --world bookie --seed 3 --steps 60 --trace") in out
    for knob in ("crash_probability = ", "disk.torn_tail_probability = ", "write_cache_bytes_max = ",
                 "journal_file_bytes_max = ", "bit_flip_probability = "):
        assert knob in out
    assert "PASS seed=3" in out and f"sha256 {run_bookie_sim(3, 60).digest}" in out


@pytest.fixture
def broken_fence(monkeypatch):
    """A deliberately broken engine: the FENCE record is journaled as padding, which replay skips."""
    monkeypatch.setattr(jfmt, "fence_record", lambda ledger_id: jfmt.encode_record(
        jfmt.RecordType.PADDING, 0, jfmt.LEDGER_ID.pack(ledger_id)))


def test_a_failing_seed_prints_the_invariant_the_tail_and_the_replay_line(capsys, broken_fence):
    assert main(["sim", "--world", "bookie", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL seed=1: AcknowledgedFenceHolds violated: " in out
    assert "trace tail (last 40 of" in out and " CRASH " in out
    assert out.rstrip().endswith("replay: make sim SEED=1 SIM_ARGS='--world bookie'   |   "
                                 "bksim sim --world bookie --seed 1 --trace")


def test_trace_prints_every_line(capsys):
    assert main(["sim", "--world", "bookie", "--seed", "3", "--steps", "30", "--trace"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if " op#" in line]) >= 30


def test_a_sweep_prints_a_summary_and_lists_failures_with_replay_commands(capsys, broken_fence):
    assert main(["sim", "--world", "bookie", "--sweep", "4", "--steps", "150"]) == 1
    captured = capsys.readouterr()
    assert "4/4 seeds" in captured.err
    assert "failed in" in captured.out and "failures by invariant: AcknowledgedFenceHolds" in captured.out
    failed = re.findall(r"^  seed (\d+): AcknowledgedFenceHolds: ", captured.out, re.M)
    assert failed and f"{4 - len(failed)} passed, {len(failed)} failed" in captured.out
    for seed in failed:
        assert (f"replay: make sim SEED={seed} STEPS=150 SIM_ARGS='--world bookie'   |   "
                f"bksim sim --world bookie --seed {seed} --steps 150 --trace") in captured.out


def test_a_passing_sweep(capsys):
    assert main(["sim", "--world", "bookie", "--sweep", "3", "--from", "5", "--steps", "50"]) == 0
    assert "3 passed, 0 failed" in capsys.readouterr().out


def test_bad_arguments_exit_2(capsys):
    assert main(["sim", "--world", "bookie", "--seed", "1", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    assert main(["sim", "--seed", "1", "--steps", "50"]) == 2
    assert "--steps applies to --world bookie or gc only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim"])  # --seed or --sweep is required


# -- the ledger world (the default) --------------------------------------------------------------------------
def test_a_ledger_seed_prints_its_plan_and_fault_plan_and_pass(capsys):
    assert main(["sim", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert "bksim sim --world ledger: seed 4; replay: make sim SEED=4   |   bksim sim --seed 4 --trace" in out
    for knob in ("bookies = ", "brokers = ", "bookie_timeout_ms = ", "session_timeout_ms = ", "disk.latency_ms_max = ",
                 "events = 8"):
        assert knob in out, knob
    assert "crash_broker broker-2, broker-1 takes its open ledgers over" in out
    assert "PASS seed=4" in out and f"sha256 {run_ledger_sim(4).digest}" in out


@pytest.fixture
def writer_acking_early(monkeypatch):
    """A deliberately broken writer: it acknowledges an entry at Qa - 1 bookies."""
    original_init = LedgerWriter.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.ack_quorum_size = max(1, self.ack_quorum_size - 1)
    monkeypatch.setattr(LedgerWriter, "__init__", init)


def test_a_failing_ledger_seed_prints_the_invariant_the_tail_and_the_replay_line(capsys, writer_acking_early):
    assert main(["sim", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL seed=1: AllCommittedEntriesReachAckQuorum violated: " in out
    assert "trace tail (last 40 of" in out and "VIOLATION AllCommittedEntriesReachAckQuorum" in out
    assert out.rstrip().endswith("replay: make sim SEED=1   |   bksim sim --seed 1 --trace")


def test_a_ledger_sweep_prints_progress_a_summary_and_replay_lines(capsys, writer_acking_early):
    assert main(["sim", "--sweep", "3"]) == 1
    captured = capsys.readouterr()
    assert "3/3 seeds" in captured.err
    failed = re.findall(r"^  seed (\d+): AllCommittedEntriesReachAckQuorum: ", captured.out, re.M)
    assert failed and f"{3 - len(failed)} passed, {len(failed)} failed" in captured.out
    for seed in failed:
        assert f"    replay: make sim SEED={seed}   |   bksim sim --seed {seed} --trace" in captured.out


def test_a_passing_ledger_sweep(capsys):
    assert main(["sim", "--sweep", "3", "--from", "10"]) == 0
    assert "3 passed, 0 failed" in capsys.readouterr().out


def test_a_ledger_trace_prints_every_line(capsys):
    assert main(["sim", "--seed", "2", "--trace"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if " append " in line]) >= 10
    assert "liveness phase" in out and " audit ledger " in out


def test_the_autorecovery_world_prints_both_plans_and_its_digest(capsys):
    from bksim.sim.autorecovery_scenario import run_autorecovery_sim

    assert main(["sim", "--world", "autorecovery", "--seed", "11"]) == 0
    out = capsys.readouterr().out
    assert "bksim sim --world autorecovery: seed 11; replay: bksim sim --world autorecovery --seed 11 --trace" in out
    assert "crash_autorecovery" in out  # a knob of the autorecovery plan, after the ledger plan's
    assert "PASS seed=11" in out and f"sha256 {run_autorecovery_sim(11).digest}" in out
    assert main(["sim", "--world", "autorecovery", "--sweep", "3"]) == 0
    assert "3 passed, 0 failed" in capsys.readouterr().out
