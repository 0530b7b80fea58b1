"""The audit on a real cluster's journals: the end-to-end run is clean, every planted violation is
found, every planted benign case is benign, and Spark local[2] and --local give the same report.

One cluster run per module (corpus.run_cluster: write, kill -9 a bookie and a broker, recover); each test audits
its own copy of the journals, damaged by the corpus.plant_* functions. Findings are compared with the pristine
copy's (the baseline), so what a crash legitimately leaves (a torn tail on the killed bookie, an entry a dying
broker never sent to its third bookie) is not mistaken for something planted.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from audit import corpus as c
from audit.conftest import audit
from bksim.audit.report import strip_timing

CLI_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def cluster_run(zookeeper, tmp_path_factory):
    return c.run_cluster(zookeeper, str(tmp_path_factory.mktemp("audit-cluster")))


@pytest.fixture(scope="module")
def baseline(cluster_run, tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    corpus = c.Corpus(cluster_run, str(root / "journals"))
    report, status = audit([corpus.root], cluster_run.snapshot, root / "out")
    assert (status, report["violations"]) == (0, []), report["violations"]
    return report


def cli(*args: str, cwd: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=CLI_TIMEOUT_S)
    return done.returncode, done.stdout, done.stderr


def key(f: dict) -> tuple:
    return f["rule"], f.get("ledger"), f.get("first_entry"), f.get("bookie"), f.get("file")


def test_end_to_end_after_kill9_of_a_bookie_and_a_broker_and_recovery_the_audit_is_clean(cluster_run, tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = cli("audit", "--journals", cluster_run.base, "--entrylogs", *cluster_run.ledger_dirs(),
                               "--metadata", cluster_run.snapshot, "--out", str(out), "--local", cwd=str(tmp_path))
    assert code == 0, f"{stdout}\n{stderr}"
    assert stdout.startswith("audit: CLEAN (0 violations)") and "parsed" in stderr  # summary, progress
    with open(out / "report.json") as f:
        report = json.load(f)
    assert report["verdict"] == "clean" and report["violations"] == []
    assert {r["rule"] for r in report["reported"]} <= {"under_replicated"}  # a dying broker's unsent third copy
    assert report["totals"]["bookies"] == 4 and report["totals"]["entrylog_files"] >= 4
    by_id = {lg["ledger"]: lg for lg in report["ledgers"]}
    for name, ledger_id in cluster_run.ledgers.items():
        md, lg = cluster_run.metadata[ledger_id], by_id[ledger_id]
        assert (lg["state"], lg["confirmed_end"]) == ("CLOSED", md["last_entry_id"]), name
        assert sum(lg["histogram"].values()) == md["last_entry_id"] + 1
        assert min(int(k) for k in lg["histogram"]) >= md["ack_quorum"], (name, lg["histogram"])
        assert max(cluster_run.acked[ledger_id]) <= md["last_entry_id"]
    assert report["totals"]["records_by_type"]["FENCE"] >= 3  # ledger C's recovery fenced its three bookies
    assert all(b["lastmark"] is not None and b["evidence"] == "complete" for b in report["inputs"]["bookies"])
    archived = [b for b in report["inputs"]["bookies"] if len(b["journal_dirs"]) == 2]
    assert archived, "journals were archived (journal-archive/ next to journal/)"
    html = (out / "report.html").read_text()
    assert "CLEAN" in html and "<svg" in html


def test_the_audit_reads_the_metadata_from_zookeeper(cluster_run, zookeeper, tmp_path):
    # the session's ZooKeeper holds other modules' ledgers too: only ours must be clean here
    out = tmp_path / "out"
    code, stdout, stderr = cli("audit", "--journals", cluster_run.base, "--zookeeper", zookeeper.connect,
                               "--out", str(out), "--local", "--quiet", "--json", cwd=str(tmp_path))
    assert code in (0, 1), stderr
    assert json.loads(stdout)["exit_status"] == code and stderr == ""
    with open(out / "report.json") as f:
        report = json.load(f)
    assert report["inputs"]["metadata"]["source"] == f"zookeeper {zookeeper.connect}"
    by_id = {lg["ledger"]: lg for lg in report["ledgers"]}
    for ledger_id in cluster_run.ledgers.values():
        assert by_id[ledger_id]["violations"] == 0 and by_id[ledger_id]["state"] == "CLOSED"
    with open(cluster_run.snapshot_all) as f:
        exported = json.load(f)
    assert exported["passwords"] == "omitted"
    assert all("password" not in e.get("metadata", {}) for e in exported["ledgers"])
    assert {e["ledger_id"] for e in exported["ledgers"]} >= set(cluster_run.ledgers.values())


def plant(name: str, corpus: c.Corpus, run: c.ClusterRun) -> c.Planted:
    a, b, cc = run.ledgers["A"], run.ledgers["B"], run.ledgers["C"]
    a_bookies = sorted(run.metadata[a]["segments"][0][1])
    if name == "flipped-byte":
        return c.plant_flipped_byte(corpus, a, a_bookies[0])
    if name == "torn-tail":
        return c.plant_torn_tail(corpus, a_bookies[0], a, run.metadata[a]["last_entry_id"])
    if name == "garbage-mid-file":
        return c.plant_garbage(corpus, a_bookies[1])
    if name == "removed-copy-below-qa":
        return c.plant_removed_copy(corpus, b, 20)
    if name == "divergent-copy":
        return c.plant_divergent_copy(corpus, a, 50)
    if name == "add-after-fence":
        return c.plant_add_after_fence(corpus, cc, run.metadata[cc]["last_entry_id"])
    if name == "entry-past-last":
        return c.plant_entry_past_end(corpus, a, run.metadata[a]["last_entry_id"], a_bookies[2])
    raise AssertionError(name)


VIOLATIONS = ("flipped-byte", "garbage-mid-file", "removed-copy-below-qa", "divergent-copy", "add-after-fence")
BENIGN = ("torn-tail", "entry-past-last")


def check_planted(planted: c.Planted, report: dict, baseline: dict) -> None:
    base_violations = Counter(key(f) for f in baseline["violations"])
    new = Counter(key(f) for f in report["violations"]) - base_violations
    if planted.rule in ("torn_tail", "above_last_entry"):
        assert not new, f"benign damage reported as a violation: {list(new)}"
        if planted.rule == "torn_tail":
            torn = [f for f in report["benign"] if f["rule"] == "torn_tail" and f["file"] == planted.path]
            assert len(torn) == 1 and torn[0]["bookie"] == planted.bookie, report["benign"]
        else:
            assert report["benign_counts"]["above_last_entry"] == baseline["benign_counts"].get("above_last_entry", 0) + 1
        return
    assert list(new) and all(rule == planted.rule for rule, *_ in new), f"expected only {planted.rule}: {list(new)}"
    assert sum(new.values()) == 1, list(new)
    (rule, ledger, first, bookie, path), = new
    if planted.ledger is not None:
        assert (ledger, first) == (planted.ledger, planted.entry)
    if planted.bookie:
        assert bookie == planted.bookie
    if planted.path:
        assert path == planted.path


@pytest.mark.parametrize("name", VIOLATIONS + BENIGN)
def test_a_planted_fault_is_found_and_classified(name, cluster_run, baseline, tmp_path):
    corpus = c.Corpus(cluster_run, str(tmp_path / "journals"))
    planted = plant(name, corpus, cluster_run)
    report, status = audit([corpus.root], cluster_run.snapshot, tmp_path / "out")
    check_planted(planted, report, baseline)
    assert status == (0 if name in BENIGN else 1)


def test_spark_local2_and_local_give_the_same_report(cluster_run, baseline, spark, tmp_path):
    corpus = c.Corpus(cluster_run, str(tmp_path / "journals"))
    # in an order where no damage hides a record a later plant looks for (the helpers do not resync)
    planted = [plant(name, corpus, cluster_run) for name in
               ("removed-copy-below-qa", "divergent-copy", "flipped-byte", "garbage-mid-file", "entry-past-last",
                "add-after-fence")]
    appended = {p.bookie for p in planted if p.rule in ("write_after_fence", "above_last_entry")}
    torn = sorted(set(corpus.bookie_roots) - appended)[0]  # a torn tail must stay the last thing in its journal
    a = cluster_run.ledgers["A"]
    planted.append(c.plant_torn_tail(corpus, torn, a, cluster_run.metadata[a]["last_entry_id"]))
    entrylogs = cluster_run.ledger_dirs()
    local, local_status = audit([corpus.root], cluster_run.snapshot, tmp_path / "local", entrylogs=entrylogs)
    on_spark, spark_status = audit([corpus.root], cluster_run.snapshot, tmp_path / "spark", entrylogs=entrylogs,
                                   spark=spark, parquet=True)
    assert local_status == spark_status == 1
    assert json.dumps(strip_timing(local), sort_keys=True) == json.dumps(strip_timing(on_spark), sort_keys=True)
    assert (local["run"]["mode"], on_spark["run"]["mode"]) == ("local", "spark")
    rules = {f["rule"] for f in local["violations"]}
    # the entry logs still hold the cut copy (it was checkpointed), so the removed copy is not below Qa here
    assert rules >= {p.rule for p in planted if p.rule not in ("torn_tail", "above_last_entry", "below_ack_quorum")}
    assert any(f["rule"] == "torn_tail" for f in local["benign"])
    parquet = on_spark["run"]["outputs"]["records_parquet"]
    records = spark.read.parquet(parquet)
    assert records.count() == local["totals"]["records"] + local["totals"]["entrylog_entries"]
    assert records.filter("type = 'FENCE'").count() == local["totals"]["records_by_type"]["FENCE"]
