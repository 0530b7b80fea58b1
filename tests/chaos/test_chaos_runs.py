"""Chaos on real processes: short scenario runs through `bksim chaos run` (each a fresh cluster, faults,
heal, checks, audit; one of them with --secure), and the checks themselves shown to catch what they look for on
a real cluster.

Every process is started by the runner or by ChaosCluster and stopped by its pid (the cluster's context
manager, also on failure); every wait is bounded (subprocess timeout, the runner's own deadlines).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from bksim.adapters.broker_client import BrokerClient
from bksim.chaos import check
from bksim.chaos.cluster import ChaosCluster, ClusterSpec
from bksim.chaos.runner import CHILD_ENV
from bksim.chaos.workload import (LEDGER_PASSWORD, NAMESPACE, TENANT, TOPIC, LedgerRecord, ledger_payload,
                                  topic_payload)
from bksim.client import Client

RUN_TIMEOUT_S = 150.0
DURATION_S = "8"


def run_chaos(tmp_path, repo_root, scenario: str, seed: int, *more: str) -> tuple[int, dict, str]:
    base = tmp_path / "chaos"
    argv = [sys.executable, "-m", "bksim.cli.main", "chaos", "run", scenario, "--seed", str(seed),
            "--duration", DURATION_S, "--dir", str(base), "--json", *more]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=repo_root, env=env)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.returncode, report, done.stderr


# make test runs bookie-kill, bookie-lost and zookeeper-quorum-loss (and the secured run below); the rest are marked
# chaos_run: `make test-chaos` runs every scenario (about 4 minutes), campaigns run them many times (docs/chaos.md)
_MORE = pytest.mark.chaos_run


@pytest.mark.parametrize("scenario, seed, fault_words", [
    ("bookie-kill", 7, ["kill -9 bookie"]),
    pytest.param("broker-kill", 7, ["kill -9 broker"], marks=_MORE),
    pytest.param("broker-zk-partition", 7, ["cut broker"], marks=_MORE),
    ("zookeeper-quorum-loss", 7, ["kill -9 zookeeper-"]),
    pytest.param("bookie-link-blackhole", 7, ["blackhole"], marks=_MORE),
    pytest.param("entrylog-flip", 7, ["stop bookie", "flipped byte"], marks=_MORE),
    ("bookie-lost", 7, ["kill -9 bookie", "lost for good"]),
    pytest.param("disk-damage-repair", 7, ["kill -9 bookie", "wiped"], marks=_MORE),
    pytest.param("gc-under-faults", 11, ["kill -9 bookie", "during compaction"], marks=_MORE),
])
def test_a_short_scenario_passes_every_check(tmp_path, repo_root, scenario, seed, fault_words):
    status, report, stderr = run_chaos(tmp_path, repo_root, scenario, seed)
    text = json.dumps({k: report.get(k) for k in ("violations", "problems", "ledger_ends")}, indent=1)
    assert status == 0 and report["verdict"] == "PASS", f"{text}\n{stderr[-2000:]}"
    faults = [e["what"] for e in report["timeline"] if e["kind"] == "fault"]
    assert faults and all(any(w in f for w in fault_words) for f in faults), faults
    assert len(report["faults"]) == sum(1 for s in report["plan"] if s["fault"])
    if scenario == "bookie-kill":  # Qw - Qa + 1 = 2 bookies at once in the second fault
        assert report["faults"][1]["victims"].count("bookie-") == 2
    led, top = report["ledgers"], report["topic"]
    assert led["acknowledged"] > 100 and top["acknowledged"] > 100
    assert (led["lost"], led["reordered"], led["divergent"], led["not_closed"]) == (0, 0, 0, 0)
    assert (top["lost"], top["duplicates"], top["reordered"], top["divergent"]) == (0, 0, 0, 0)
    assert report["audit"]["verdict"] == "clean" and report["audit"]["exit_status"] == 0
    if scenario == "entrylog-flip":  # the damaged copy was served and every broker read the acknowledged bytes
        assert [f["problems"] for f in report["entrylog_flips"]] == [[]]
        assert any("failed over" in e["what"] for e in report["timeline"] if e["kind"] == "check")
    if scenario in ("bookie-lost", "disk-damage-repair"):  # autorecovery restored every copy, and said when
        rereplication = report["rereplication"]
        assert [r["cause"] for r in rereplication] == (["loss", "loss"] if scenario == "bookie-lost" else ["damage"])
        assert all(r["rereplication_s"] is not None and r["rereplication_s"] >= 0 for r in rereplication)
        text = open(os.path.join(report["run_dir"], "report.txt")).read()
        assert text.count("rereplication: ") == len(rereplication), text
        assert any("every entry on its Qw bookies with identical bytes" in e["what"] for e in report["timeline"])
    if scenario == "gc-under-faults":  # bookies killed while compacting, their copies verified, ledgers deleted
        checks = [e["what"] for e in report["timeline"] if e["kind"] == "check"]
        assert any("start-up: " in c for c in checks) and any("identical bytes" in c for c in checks), checks
        assert sum(w.get("deleted", 0) for w in report["ledger_writers"]) > 0
    if scenario == "zookeeper-quorum-loss":  # two of three servers killed: service stopped, then one owner again
        kills = [e["what"] for e in report["timeline"] if e["kind"] == "fault"]
        assert len(kills) == 2 and report["faults"][0]["victims"].count("zookeeper-") == 2, kills
        notes = [e["what"] for e in report["timeline"] if e["kind"] in ("note", "check")]
        assert any("no quorum:" in n and "stopped serving" in n for n in notes), notes
        assert any(n.startswith("one broker serves the topic") for n in notes), notes
    assert all(n > 0 for n in report["recovery"]["tail_acks"].values())
    run_dir = report["run_dir"]
    assert os.path.exists(os.path.join(run_dir, "report.txt")) and os.path.exists(os.path.join(run_dir, "report.json"))
    assert not any(name.startswith("bookie-") for name in os.listdir(run_dir))  # a passing run's data is removed


def test_a_secured_run_passes_the_same_checks(tmp_path, repo_root):
    """--secure: TLS on every link, tokens + authorization, ZooKeeper digest ACLs; the refusals are probed at the
    start, then the same faults, checks and audit as the plain run."""
    status, report, stderr = run_chaos(tmp_path, repo_root, "bookie-kill", 7, "--secure")
    text = json.dumps({k: report.get(k) for k in ("violations", "problems", "failed_checks")}, indent=1)
    assert status == 0 and report["verdict"] == "PASS" and report["secure"] is True, f"{text}\n{stderr[-2000:]}"
    checks = [e["what"] for e in report["timeline"] if e["kind"] == "check"]
    assert any(c.startswith("secured: a call without a token is UNAUTHENTICATED") for c in checks), checks
    assert [e for e in report["timeline"] if e["kind"] == "fault"]
    led, top = report["ledgers"], report["topic"]
    assert led["acknowledged"] > 100 and top["acknowledged"] > 100
    assert (led["lost"], led["reordered"], led["divergent"], led["not_closed"]) == (0, 0, 0, 0)
    assert (top["lost"], top["duplicates"], top["reordered"], top["divergent"]) == (0, 0, 0, 0)
    assert report["audit"]["verdict"] == "clean" and report["audit"]["exit_status"] == 0
    assert report["audit"]["totals"]["ledgers_by_state"].get("CLOSED", 0) > 0  # it read the metadata behind the ACLs
    security = os.path.join(report["run_dir"], "security")
    assert sorted(os.listdir(security)) == ["super-user.token", "tls", "token-secret.key", "zk-credentials"]
    assert "(secure)" in open(os.path.join(report["run_dir"], "report.txt")).read().splitlines()[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ChaosCluster(str(tmp_path_factory.mktemp("chaos-cluster")), ClusterSpec(child_env=dict(CHILD_ENV))) as c:
        yield c


def test_the_ledger_check_finds_truncated_wrong_and_misplaced_entries(cluster):
    address = cluster.brokers[0].address

    async def write(shift: int) -> int:
        async with BrokerClient(address) as client:
            info = await client.create_ledger(3, 3, 2, password=LEDGER_PASSWORD)
            payloads = [ledger_payload(info.ledger_id, i + shift) for i in range(20)]
            await client.append(info.ledger_id, [payloads], password=LEDGER_PASSWORD)
            if shift:  # the other one stays OPEN: the check must recover it
                await client.close_ledger(info.ledger_id, password=LEDGER_PASSWORD)
            return info.ledger_id

    honest_id = asyncio.run(write(0))
    shifted_id = asyncio.run(write(1))
    honest = LedgerRecord(honest_id, "w", (3, 3, 2), address, acked={i: i for i in range(20)})
    truncated = LedgerRecord(honest_id, "w", (3, 3, 2), address, acked={i: i for i in range(20)} | {25: 25, 4: 5})
    shifted = LedgerRecord(shifted_id, "w", (3, 3, 2), address, acked={})
    addresses = [b.address for b in cluster.brokers]

    clean = asyncio.run(check.check_ledgers([honest], addresses))
    assert (clean["lost"], clean["reordered"], clean["divergent"], clean["not_closed"]) == (0, 0, 0, 0)
    assert clean["recovered_at_end"] == 1 and clean["acknowledged"] == 20  # it was OPEN; now CLOSED

    bad = asyncio.run(check.check_ledgers([truncated, shifted], addresses))
    assert bad["lost"] == 2  # entry 25 above the last entry; entry 4 holds index 4, not the acked 5
    assert bad["reordered"] == 20  # every entry of the shifted ledger names the next index
    assert any("truncated after ack" in f for f in bad["findings"])


def test_the_topic_check_finds_lost_and_misplaced_messages(cluster):
    addresses = [b.address for b in cluster.brokers]
    with Client(addresses, operation_timeout_ms=30_000) as client:
        client.create_tenant(TENANT)
        client.create_namespace(NAMESPACE, retention_ms=-1, dedup=True)
        client.create_topic(TOPIC)
        producer = client.create_producer(TOPIC, producer_name="probe")
        receipts = {}
        for seq in range(10):
            mid = producer.send(topic_payload(seq))
            receipts[seq] = (mid.ledger, mid.entry, mid.batch_index)
        producer.close()
    clean = check.check_topic(addresses, receipts, set(), 10, reader_suffix="-1")
    assert (clean["lost"], clean["duplicates"], clean["reordered"], clean["divergent"]) == (0, 0, 0, 0)
    assert clean["acknowledged"] == 10
    wrong = dict(receipts)
    wrong[999] = receipts[3]  # a receipt for a message never stored, naming the position of seq 3
    bad = check.check_topic(addresses, wrong, set(), 10, reader_suffix="-2", missing_idle_s=2.0)
    assert bad["lost"] == 1 and bad["divergent"] == 1
    assert any("999" in f for f in bad["findings"])
