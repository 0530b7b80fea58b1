"""Smoke test of `bksim perf audit` (bounded by --size; it has no --seconds, so not conftest's run_perf): the three
figures and the two ratios are reported, the audits found the generated data clean, nothing is left behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from perf.perf_smoke_checks import assert_figures

pytestmark = pytest.mark.benchmark_run  # a long benchmark's smoke run: `make test-perf`, not `make test`

RUN_TIMEOUT_S = 240.0


def test_perf_audit_reports_bare_local_and_spark_figures(tmp_path, repo_root):
    base = tmp_path / "perf"
    argv = [sys.executable, "-m", "bksim.cli.main", "perf", "audit", "--json", "--size", "20MB", "--idle-min", "0",
            "--idle-wait-s", "0", "--dir", str(base)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["benchmark"] == "audit"
    bare, local, spark = report["results"]
    records = bare["records"]
    assert records > 18_000  # 20 MB of ~1 KiB entries
    for result, name in ((bare, "audit-bare-parse"), (local, "audit-local"), (spark, "audit-spark")):
        assert_figures(result, name, records, bare["record_bytes"], 1)
        assert result["bytes"] >= 20_000_000
    assert spark["session_s"] > 0 and spark["parquet_s"] > 0 and spark["master"] == "local[2]"
    assert local["parse_s"] > 0 and local["process_s"] >= local["elapsed_s"]
    assert [(q["subject"], q["target"]) for q in report["ratios"]] == [("audit-spark", 0.4), ("audit-local", 0.8)]
    assert len(report["targets"]) == 2
    assert "rec/s" in done.stderr and "target --local >= 0.8x" in done.stderr
    assert list(base.iterdir()) == [], f"temp files left behind: {list(base.iterdir())}"
