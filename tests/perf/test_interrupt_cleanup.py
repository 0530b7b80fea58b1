"""A benchmark interrupted mid-run (Ctrl-C = SIGINT, or SIGTERM) stops every child it started and removes
its temp dir."""
from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import pytest

from bksim.adapters import processes
from helpers import wait_until

START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0


def children(pid: int) -> list[int]:
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def child_running(pid: int, marker: str) -> int | None:
    for child in children(pid):
        if marker in processes.cmdline(child):
            return child
    return None


@pytest.mark.parametrize("command, marker, sig", [
    ("grpc-baseline", "bksim.perf.grpc_baseline serve", signal.SIGINT),
    ("bookie-add", "bookie run", signal.SIGINT),
    ("bookie-add", "bookie run", signal.SIGTERM),
])
def test_interrupted_benchmark_leaves_nothing_behind(tmp_path, repo_root, command, marker, sig):
    base = tmp_path / "perf"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    # bookie-add measures its baseline for --seconds first, then starts ZooKeeper and the bookie and measures it
    # for as long: the signal must land inside that second measurement, so it lasts long enough that a test
    # process starved of CPU for a few seconds still signals in time (with 2 s, a late signal found the run over)
    seconds = "120" if command == "grpc-baseline" else "8"
    proc = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", "perf", command, "--seconds", seconds,
                             "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(base), "--json"],
                            cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started: list[int] = []
    survivors: list[str] = []
    try:
        target = wait_until(lambda: child_running(proc.pid, marker), START_TIMEOUT_S,
                            message=f"{command} did not start a '{marker}' process")
        started = children(proc.pid)
        assert list(base.iterdir()), "no temp dir while running"
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT_S)
        # whatever the benchmark did, this test leaves nothing running: survivors are noted, then killed by pid
        for pid in started:
            if processes.is_alive(pid):
                survivors.append(f"{processes.cmdline(pid)} (pid {pid})")
                processes.kill9(pid, EXIT_TIMEOUT_S)
    # a run that finished prints its result (JSON) on stdout: then the signal came too late, not unheard
    assert proc.returncode == 130, (stdout.decode(errors="replace")[-2000:], stderr.decode(errors="replace")[-3000:])
    assert stdout == b"", "an interrupted benchmark printed a result"
    assert target in started
    assert survivors == [], "survived the benchmark"
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
