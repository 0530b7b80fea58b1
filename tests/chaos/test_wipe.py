"""The wiped-bookie fault end to end on a real cluster (ZooKeeper, 3 bookies, 1 broker; ChaosCluster): entries on
a 3/3/2 and a 2/2/2 ledger, kill -9 of a bookie of both ensembles, wipe_bookie, the restart refuses (the cookie
check), `bksim bookie format --delete-cookie --force`, the restart registers a new bookie with the same id, the
ledgers close, everything stops, `bksim audit --local` (as the chaos runner runs it) and judge_audit: no problem,
and exactly the entries whose ensemble included the wiped bookie lost a copy (2/2/2 below Qa, 3/3/2
under-replicated).

Every process is started by ChaosCluster or here and stopped by its pid; every wait has a deadline.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from bksim.adapters import processes
from bksim.adapters.broker_client import BrokerClient
from bksim.chaos.cluster import ChaosCluster, ClusterSpec
from bksim.chaos.runner import CHILD_ENV, run_audit
from bksim.chaos.wipe import judge_audit, wipe_bookie
from bksim.chaos.workload import LEDGER_PASSWORD, ledger_payload
from helpers import wait_until

ENTRIES = {(3, 3, 2): 60, (2, 2, 2): 40}
EXIT_TIMEOUT_S = 30.0
EXPIRY_TIMEOUT_S = 20.0  # the killed bookie's registration goes when its 2 s session expires
CLI_TIMEOUT_S = 60.0


def test_a_wiped_bookie_refuses_to_start_and_after_format_the_audit_counts_its_lost_copies(tmp_path):
    # autorecovery off: it would replace the wiped bookie in the 2/2/2 ledger once the ledger closes, and the
    # audit is to count the copies the wipe lost
    env = dict(CHILD_ENV, BKSIM_AUTORECOVERY_ENABLED="false")
    with ChaosCluster(str(tmp_path / "run"), ClusterSpec(brokers=1, child_env=env)) as cluster:
        address = cluster.brokers[0].address

        async def create_and_write() -> dict[tuple, tuple[int, tuple[str, ...]]]:
            out = {}
            async with BrokerClient(address) as client:
                for shape, n in ENTRIES.items():
                    info = await client.create_ledger(*shape, password=LEDGER_PASSWORD)
                    payloads = [ledger_payload(info.ledger_id, i) for i in range(n)]
                    results = await client.append(info.ledger_id, [payloads[:n // 2], payloads[n // 2:]],
                                                  password=LEDGER_PASSWORD)
                    assert results == [(0, n // 2), (n // 2, n - n // 2)], results  # every entry acknowledged
                    out[shape] = (info.ledger_id, info.segments[0].ensemble)
            return out

        ledgers = asyncio.run(create_and_write())
        victim = next(b for b in cluster.bookies if b.node_id in ledgers[(2, 2, 2)][1])
        assert victim.node_id in ledgers[(3, 3, 2)][1]

        cluster.kill9(victim)
        wiped = wipe_bookie(victim.home)
        assert wiped.startswith(f"wiped {victim.home}: removed journal/ ") and "(0 bytes)" not in wiped
        assert os.listdir(os.path.join(victim.home, "journal")) == []

        pid = cluster.spawn(victim)
        status = processes.wait_status(pid, EXIT_TIMEOUT_S)
        victim.pid = None
        log = processes.tail(victim.log_path, 20)
        assert status == 2, log
        assert f"has no cookie but ZooKeeper has one for bookie {victim.node_id}" in log and "wiped" in log

        client = cluster.kazoo()
        try:
            wait_until(lambda: cluster.registration(client, victim) is None, EXPIRY_TIMEOUT_S,
                       message=f"the killed {victim.name}'s registration to expire")
        finally:
            client.stop()
            client.close()
        formatted = subprocess.run([sys.executable, "-m", "bksim.cli.main", "bookie", "format", "--delete-cookie",
                                    "--force"], env=victim.env, cwd=cluster.run_dir, capture_output=True, text=True,
                                   timeout=CLI_TIMEOUT_S)
        assert formatted.returncode == 0, formatted
        assert f"ZooKeeper: deleted /ledgers/cookies/{victim.node_id} (incarnation 1)" in formatted.stdout
        assert "wrote COOKIE (incarnation 2)" in formatted.stdout

        cluster.restart(victim)  # registers: a new bookie with the same id
        assert "new bookie (incarnation 2)" in processes.tail(victim.log_path, 60)

        async def close_all() -> None:
            async with BrokerClient(address) as client:
                for ledger_id, _ in ledgers.values():
                    info = await client.close_ledger(ledger_id, password=LEDGER_PASSWORD)
                    assert info.state == "CLOSED"
        asyncio.run(close_all())

        for node in cluster.brokers + cluster.bookies:  # quiescent journals, as the runner audits them
            assert processes.stop(node.pid, 15.0), node.name
            node.pid = None
        out_dir = str(tmp_path / "audit")
        summary = run_audit(cluster, out_dir)
        with open(os.path.join(out_dir, "report.json")) as f:
            report = json.load(f)

    assert summary["exit_status"] == 1 and summary["verdict"] == "violations", summary  # 2/2/2 is below Qa
    problems, figures = judge_audit(report, victim.node_id)
    assert problems == [], json.dumps(report["violations"] + report["reported"], indent=1)
    lost_222, lost_332 = ENTRIES[(2, 2, 2)], ENTRIES[(3, 3, 2)]
    assert (figures["entries_lost_replica"], figures["below_qa"], figures["under_replicated"], figures["gap"]) == \
        (lost_222 + lost_332, lost_222, lost_332, 0), figures
    assert figures["incarnation"] == 2 and figures["write_set_entries"] == lost_222 + lost_332
    assert figures["violations"] == 1  # one below_ack_quorum range: the whole 2/2/2 ledger
    bookie = next(b for b in report["inputs"]["bookies"] if b["bookie"] == victim.node_id)
    assert bookie["evidence"] == "complete" and bookie["journal_ids"][0] == 1
