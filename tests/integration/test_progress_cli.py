"""The progress line of real commands: each runs as `python -m bksim.cli.main` with its stderr on a
pseudo-terminal (the `pty` module) and its stdout on a pipe; the line appears on the terminal, is erased at the
end, and stdout carries what it carries without a terminal. With stderr on a pipe, with --json or with
BKSIM_PROGRESS=0 no line is drawn. Commands that need no cluster: `sim --sweep`, `audit --local` (a synthetic
cluster's files), `perf fsync-baseline`."""
from __future__ import annotations

import json

from pty_run import assert_ends_clean, frames, run_on_pipes, run_on_tty, untimed
from tests.audit.synth import Synth

def test_sim_sweep_shows_seeds_done_rate_eta_and_failures_on_a_terminal_only():
    status, stdout, terminal = run_on_tty("sim", "--sweep", "30")
    assert status == 0 and "30 passed, 0 failed" in stdout
    drawn = [f for f in frames(terminal) if f.startswith("sim --world ledger --sweep")]
    assert drawn, terminal
    assert any("/30 seeds" in f and "/s" in f and "ETA" in f and "0 failed" in f for f in drawn), drawn
    assert_ends_clean(terminal)
    assert "\r" not in stdout

    piped = run_on_pipes("sim", "--sweep", "30")
    assert piped.returncode == 0 and untimed(piped.stdout) == untimed(stdout)
    assert "\r" not in piped.stderr and piped.stderr == "  30/30 seeds (last 30), 0 failed, " + \
        piped.stderr.split(", 0 failed, ")[1]  # the one line a pipe gets


def test_sim_sweep_is_silent_on_a_terminal_with_bksim_progress_0_or_no_progress():
    status, stdout, terminal = run_on_tty("sim", "--world", "bookie", "--sweep", "3", "--steps", "50",
                                          BKSIM_PROGRESS="0")
    assert status == 0 and "3 passed" in stdout
    assert "\r" not in terminal and "3/3 seeds" in terminal  # the plain line of a non-terminal run
    status, stdout, terminal = run_on_tty("--no-progress", "sim", "--world", "bookie", "--sweep", "3", "--steps", "50")
    assert status == 0 and "3 passed" in stdout and "\r" not in terminal and "3/3 seeds" in terminal


def test_audit_shows_its_phases_on_a_terminal(tmp_path):
    synth = Synth(str(tmp_path / "cluster"))
    synth.ledger(1, 3, 2, 2, 10)
    synth.save()
    args = ("audit", "--journals", synth.root, "--metadata", synth.snapshot_path, "--local", "--no-parquet")
    status, stdout, terminal = run_on_tty(*args, "--out", str(tmp_path / "a"))
    assert status == 0 and stdout.startswith("audit: CLEAN")
    drawn = [f for f in frames(terminal) if f.startswith("audit")]
    assert any("parsed" in f and "elapsed" in f for f in drawn), terminal
    assert_ends_clean(terminal)
    piped = run_on_pipes(*args, "--out", str(tmp_path / "b"))
    assert piped.returncode == 0 and "\r" not in piped.stderr and "bksim audit: parsed" in piped.stderr
    status, stdout, terminal = run_on_tty(*args, "--out", str(tmp_path / "c"), "--json", "--quiet")
    assert status == 0 and json.loads(stdout)["verdict"] == "clean" and terminal == ""


def test_perf_shows_the_phase_and_its_seconds_on_a_terminal(tmp_path):
    args = ("perf", "fsync-baseline", "--seconds", "0.6", "--idle-min", "0", "--dir", str(tmp_path))
    status, stdout, terminal = run_on_tty(*args)
    assert status == 0 and "fsync-baseline" in stdout
    drawn = [f for f in frames(terminal) if f.startswith("perf fsync-baseline")]
    assert any("fsync-baseline 1024 B x 16" in f and " s)" in f for f in drawn), terminal
    assert_ends_clean(terminal)
    status, stdout, terminal = run_on_tty(*args, "--json")
    assert status == 0 and json.loads(stdout) and "\r" not in terminal
