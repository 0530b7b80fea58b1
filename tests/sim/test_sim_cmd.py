"""`bksim sim`: prints the seed and every knob, PASS with the trace digest, or the violated invariant with
the trace tail and the replay commands; `--sweep` prints progress and a summary listing each failure."""
from __future__ import annotations

import pytest

from bksim.cli.main import main
from bksim.sim.bookie_scenario import run_bookie_sim
from bksim.sim.known_issues import KNOWN_ENGINE_ISSUES


def test_one_passing_seed_prints_its_plan_and_pass(capsys):
    assert main(["sim", "--seed", "3", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "bksim sim: seed 3; replay: make sim SEED=3 STEPS=60" in out
    for knob in ("crash_probability = ", "disk.torn_tail_probability = ", "write_cache_bytes_max = ",
                 "journal_file_bytes_max = ", "bit_flip_probability = "):
        assert knob in out
    assert "PASS seed=3" in out and f"sha256 {run_bookie_sim(3, 60).digest}" in out


def test_a_failing_seed_prints_the_invariant_the_tail_and_the_replay_line(capsys):
    seed = KNOWN_ENGINE_ISSUES["LacMonotonicAcrossRestarts"][0]
    assert main(["sim", "--seed", str(seed)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL seed={seed}: LacMonotonicAcrossRestarts violated" in out
    assert "known engine issue" in out and "trace tail (last 40 of" in out
    assert out.rstrip().endswith(f"replay: make sim SEED={seed}   |   bksim sim --seed {seed} --trace")


def test_trace_prints_every_line(capsys):
    assert main(["sim", "--seed", "3", "--steps", "30", "--trace"]) == 0
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if " op#" in line]) >= 30


def test_a_sweep_prints_a_summary_and_lists_failures_with_replay_commands(capsys):
    seed = KNOWN_ENGINE_ISSUES["LacMonotonicAcrossRestarts"][0]
    assert main(["sim", "--sweep", "3", "--from", str(seed - 1)]) == 1
    captured = capsys.readouterr()
    assert "3/3 seeds" in captured.err
    assert "failed in" in captured.out and "LacMonotonicAcrossRestarts" in captured.out
    assert f"replay: make sim SEED={seed}   |   bksim sim --seed {seed} --trace" in captured.out
    assert main(["sim", "--sweep", "3", "--from", str(seed - 1), "--tolerate-known"]) == 0
    assert "3 passed, 0 failed" in capsys.readouterr().out


def test_bad_arguments_exit_2(capsys):
    assert main(["sim", "--seed", "1", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim"])  # --seed or --sweep is required
