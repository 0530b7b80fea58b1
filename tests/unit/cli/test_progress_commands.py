"""The progress line of real commands: each runs as `python -m bksim.cli.main` with its stderr on a
pseudo-terminal (the `pty` module) and its stdout on a pipe; the line appears on the terminal, is erased at the
end, and stdout carries what it carries without a terminal. With stderr on a pipe, with --json or with
BKSIM_PROGRESS=0 no line is drawn. Commands that need no cluster: `sim --sweep`, `audit --local` (a synthetic
cluster's files), `perf fsync-baseline`."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from tests.audit.synth import Synth

TIMEOUT_S = 60
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update(extra)
    return env


def run_on_tty(*args: str, cwd: str = ROOT, **env: str) -> tuple[int, str, str]:
    """(exit status, stdout, what reached the terminal) of `bksim ARGS` with stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))  # 24 rows, 200 columns
    try:
        child = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", *args], stdout=subprocess.PIPE,
                                 stderr=slave, stdin=subprocess.DEVNULL, env=_env(**env), cwd=cwd)
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            chunks.append(data)
        stdout = child.stdout.read().decode()
        status = child.wait(timeout=TIMEOUT_S)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return status, stdout, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")  # the tty's onlcr


def run_on_pipes(*args: str, cwd: str = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], capture_output=True, text=True,
                          env=_env(**env), cwd=cwd, timeout=TIMEOUT_S)


def untimed(text: str) -> str:
    return re.sub(r"[0-9.]+ (s|ms)\b", "T", text)


def frames(terminal: str) -> list[str]:
    """The status lines drawn (the text between carriage returns, blanks left out)."""
    return [f.strip() for f in terminal.split("\r") if f.strip()]


def assert_ends_clean(terminal: str) -> None:
    tail = terminal.rsplit("\n", 1)[-1]  # after the last full line written to stderr
    assert tail.endswith("\r") and tail.split("\r")[-2].strip() == "", repr(tail[-200:])


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


def test_sim_sweep_is_silent_on_a_terminal_with_bksim_progress_0():
    status, stdout, terminal = run_on_tty("sim", "--world", "bookie", "--sweep", "3", "--steps", "50",
                                          BKSIM_PROGRESS="0")
    assert status == 0 and "3 passed" in stdout
    assert "\r" not in terminal and "3/3 seeds" in terminal  # the plain line of a non-terminal run


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
