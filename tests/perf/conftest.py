"""Smoke tests of `bksim perf ...`: tiny runs that check the report, never the speed.

`run_perf(name, *args)` runs the real command in a subprocess with a record bound, no time bound and no
idle wait, parses its --json output, and checks that the temp dir it made under --dir is gone again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

RUN_TIMEOUT_S = 240.0


@pytest.fixture
def run_perf(tmp_path, repo_root):
    def run(name: str, *args: str) -> dict:
        base = tmp_path / "perf"
        argv = [sys.executable, "-m", "bksim.cli.main", "perf", name, "--json", "--seconds", "0",
                "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(base), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
        assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        report = json.loads(done.stdout)
        assert report["benchmark"] == name
        assert report["machine"]["cores"] >= 1 and report["machine"]["grpc"]
        assert "rec/s" not in done.stdout and "p99.9 ms" not in done.stdout  # the human table went to stderr
        assert "rec/s" in done.stderr and "p99.9 ms" in done.stderr
        assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
        return report
    return run
