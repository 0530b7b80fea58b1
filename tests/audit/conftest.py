"""Fixtures of the audit tests.

- `spark` (session): one local[2] SparkSession for every Spark test (built by the audit's own build_session:
  UI off, quiet logs, local dirs under pytest's tmp dir), stopped at the end of the session.
- `run_audit(journals, snapshot, out, entrylogs=(), spark=None)`: the audit through its API (the CLI's path
  minus argument parsing): --local without `spark`, else the Spark driver on that session. Returns
  (report, exit status).
"""
from __future__ import annotations

import pytest

from bksim.audit import job
from bksim.audit.inputs import ENTRYLOGS, JOURNALS, make_plan, parse_dir_arg
from bksim.audit.local import LocalFiles, run_local
from bksim.audit.snapshot import load_snapshot, read_snapshot_file


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from bksim.audit.spark import build_session

    session = build_session("local[2]", str(tmp_path_factory.mktemp("spark")), "1g")
    try:
        yield session
    finally:
        session.stop()


def audit(journals, snapshot, out, entrylogs=(), spark=None, parquet=False, findings_max=None):
    """(report, exit status). `snapshot`: a file path or a snapshot document."""
    snap = read_snapshot_file(snapshot) if isinstance(snapshot, str) else load_snapshot(snapshot)
    dirs = [parse_dir_arg(str(d), JOURNALS) for d in journals] + [parse_dir_arg(str(d), ENTRYLOGS) for d in entrylogs]
    options = job.AuditOptions(out_dir=str(out), parquet=parquet,
                               **({"findings_max": findings_max} if findings_max is not None else {}))
    if spark is None:
        plan = make_plan(dirs, LocalFiles(), snap.instance_id)
        files, ledgers, run = run_local(plan, snap, options, lambda message: None)
    else:
        from bksim.audit.spark import SparkFiles, run_spark

        plan = make_plan(dirs, SparkFiles(spark), snap.instance_id)
        files, ledgers, run = run_spark(spark, plan, snap, options, lambda message: None)
    return job.finish(plan, snap, files, ledgers, run, options)


@pytest.fixture
def run_audit():
    return audit
