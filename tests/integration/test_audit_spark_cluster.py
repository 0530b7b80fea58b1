"""The audit submitted to a Spark standalone cluster gives the report --local gives: the procedure of
docs/audit.md "Submitting to a cluster", command for command, on free loopback ports.

`bksim audit cluster up` starts a real master and two real workers (JVMs from the PySpark installation's jars,
adapters/spark_standalone.py); `bksim audit --master spark://127.0.0.1:PORT` runs the job with its executors in
the worker processes, reading the journals through their paths (shared storage, as NFS would give); the
same journals audited with --local must give the same report.json apart from its "run" section (report.strip_timing:
run.mode, run.master, run.timing_s, run.outputs are the only fields that differ). The journals are synthetic
(audit/synth.py: the project's format code, several bookies, a rolled journal, an entry log, a gap, a torn
tail and a damaged copy), so each rule class is in the comparison. The daemons are stopped by pid at the end
(`bksim audit cluster down`, and the adapter again in a finally if the test failed before it).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from audit.synth import Synth, flip, record_offsets, truncate
from bksim.adapters import processes
from bksim.adapters.spark_standalone import StandaloneCluster
from bksim.audit.report import strip_timing
from helpers import free_port

CLI_TIMEOUT_S = 120.0  # one command; the whole test takes about 30 s on 2 idle cores, 70 s at load average 10
WORKERS = 2


def bksim(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BKSIM_", "SPARK_", "PYSPARK_"))}
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=CLI_TIMEOUT_S)


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "spark"
    try:
        yield path
    finally:
        if (path / "cluster.json").exists():
            StandaloneCluster.from_run_dir(str(path)).stop()  # by pid; nothing if `down` already ran


def corpus(root: str) -> Synth:
    """Four bookies' journals (B1's rolled once, B4's entry log) with a gap, a torn tail and a flipped byte."""
    synth = Synth(root)
    b1, b2, b3, b4 = synth.bookies
    synth.ledger(1, 3, 2, 2, 40, skip={4: set(synth.bookies)})  # entry 4 on no bookie: a gap
    synth.roll(b1)
    synth.ledger(2, 3, 3, 2, 30)
    synth.ledger(3, 3, 3, 2, 20, close=False, segments=[(0, (b2, b3, b4))])
    synth.log_entry(b4, 3, 0)
    paths = synth.save()
    older = record_offsets(paths[(b1, 1)])
    flip(paths[(b1, 1)], older[2].end - 1)  # a payload byte: a CRC failure, one copy fewer
    newest = record_offsets(paths[(b3, 1)])
    truncate(paths[(b3, 1)], newest[-1].offset + 7)  # the newest journal's last record torn
    return synth


def report_of(out) -> dict:
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def test_the_audit_on_a_standalone_cluster_reports_what_local_reports(tmp_path, run_dir):
    synth = corpus(str(tmp_path / "shared" / "bookies"))
    port, ui_port = free_port(count=WORKERS + 1), free_port(count=WORKERS + 1)
    master = f"spark://127.0.0.1:{port}"

    up = bksim("audit", "cluster", "up", "--run-dir", str(run_dir), "--port", str(port), "--ui-port", str(ui_port),
               "--workers", str(WORKERS), cwd=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"Spark standalone master {master} " in up.stdout and f"{WORKERS} workers ALIVE" in up.stdout

    audit = ["audit", "--journals", synth.root, "--entrylogs", synth.root, "--metadata", synth.snapshot_path,
             "--no-parquet", "--quiet"]
    on_cluster = bksim(*audit, "--out", "cluster", "--master", master, cwd=tmp_path)
    local = bksim(*audit, "--out", "local", "--local", cwd=tmp_path)
    assert (on_cluster.returncode, local.returncode) == (1, 1), on_cluster.stderr + local.stderr
    on_cluster_report, local_report = report_of(tmp_path / "cluster"), report_of(tmp_path / "local")
    assert json.dumps(strip_timing(on_cluster_report), sort_keys=True) == \
        json.dumps(strip_timing(local_report), sort_keys=True)
    assert {f["rule"] for f in local_report["violations"]} == {"gap", "journal_crc_failure", "below_ack_quorum"}
    assert [f["rule"] for f in local_report["benign"]] == ["torn_tail"]
    assert local_report["totals"]["entrylog_files"] == 1
    run = on_cluster_report["run"]
    assert (run["mode"], run["master"]) == ("spark", master)

    # the job ran there: the master lists the application FINISHED, and each worker ran an executor that fetched
    # the shipped bksim package (an executor fetches it when it runs its first task)
    status = json.loads(bksim("audit", "cluster", "status", "--run-dir", str(run_dir), "--json", cwd=tmp_path).stdout)
    assert [(a["name"], a["state"]) for a in status["completedapps"]] == [("bksim-audit", "FINISHED")]
    app = status["completedapps"][0]["id"]
    for i in range(1, WORKERS + 1):
        executors = os.listdir(run_dir / f"worker-{i}" / app)
        assert any(os.path.exists(run_dir / f"worker-{i}" / app / e / "bksim.zip") for e in executors), (i, executors)

    pids = StandaloneCluster.from_run_dir(str(run_dir)).running()
    down = bksim("audit", "cluster", "down", "--run-dir", str(run_dir), cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    assert not any(processes.is_alive(pid) for pid in pids.values()), pids
    after = bksim("audit", "cluster", "status", "--run-dir", str(run_dir), cwd=tmp_path)
    assert after.returncode == 1 and after.stdout.startswith("DOWN"), after.stdout
