"""The local-cluster launcher (adapters/local_cluster.py) on the session's ZooKeeper, with stand-in bookies (a
few lines of kazoo that register like a bookie) so that these tests check the launcher itself: which
registration counts as the current incarnation's, readiness, the faults by pid, CPU seconds, stopping.
`bksim cluster`, chaos and the benchmarks run real bookies and brokers through it (test_cluster_cmd.py,
tests/chaos, tests/perf)."""
from __future__ import annotations

import sys

import pytest

from bksim.adapters import processes
from bksim.adapters.local_cluster import ClusterError, LocalCluster
from bksim.model.errors import BksimError
from helpers import wait_until

FAKE_BOOKIE = r"""
# stands in for `python -m bksim.cli.main bookie run`: registers naming its pid, then waits for SIGTERM
import json, os, signal, sys
from kazoo.client import KazooClient
if sys.argv[1] == "die":
    print("fake bookie: boom", flush=True)
    sys.exit(1)
zk = KazooClient(hosts=os.environ["BKSIM_ZOOKEEPER_HOST"] + ":" + os.environ["BKSIM_ZOOKEEPER_PORT"], timeout=2.0)
zk.start(timeout=10)
zk.create("/ledgers/available/" + os.environ["BKSIM_BOOKIE_BOOKIE_ID"], json.dumps({"pid": os.getpid()}).encode(),
          ephemeral=True, makepath=True)
print("fake bookie registered", flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigtimedwait({signal.SIGTERM}, 60)
"""


@pytest.fixture
def cluster(zookeeper, tmp_path):
    # no autorecovery: on the session's ZooKeeper an auditor counts every other module's stopped bookie as lost
    c = LocalCluster(str(tmp_path), inherit_bksim_env=False, cwd=str(tmp_path),
                     child_env={"BKSIM_AUTORECOVERY_ENABLED": "false"})
    c.attach_zookeeper(zookeeper)
    try:
        yield c
    finally:
        assert c.stop_all() == []
        assert processes.is_alive(zookeeper.pid)  # a shared ZooKeeper is not this cluster's to stop


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_only_a_registration_of_the_current_incarnation_counts(cluster):
    node = cluster.add_bookie()
    node.pid, node.spawned_ms = 4242, 1_000_000
    assert cluster.registered_now({"pid": 4242, "ctime": 0}, node)
    assert not cluster.registered_now({"pid": 4241, "ctime": 2_000_000}, node)  # a predecessor's node
    assert not cluster.registered_now({"ctime": 900_000}, node)  # no pid, created before the spawn
    assert not cluster.registered_now({"ctime": 999_990}, node)  # ... even just before it
    assert not cluster.registered_now({"ctime": 1_000_000}, node)
    assert cluster.registered_now({"ctime": 1_000_001}, node)
    assert not cluster.registered_now(None, node)
    node.spawned_ms = None  # adopted from its pid file: any node without a pid counts
    assert cluster.registered_now({"ctime": 0}, node)
    node.pid = None


def test_ready_pause_resume_kill9_and_cpu_by_pid(cluster):
    node = cluster.add_bookie(argv=[sys.executable, "-c", FAKE_BOOKIE, "ok"])
    assert node.env["BKSIM_ZOOKEEPER_PORT"] == str(cluster.zookeeper.port)
    assert node.env["BKSIM_BOOKIE_JOURNAL_DIR"] == f"{cluster.run_dir}/bookie-1/journal"
    cluster.spawn(node)
    waited = cluster.wait_ready([node], 30.0)
    assert set(waited) == {"bookie-1"} and waited["bookie-1"] >= 0
    assert processes.read_pid(node.pid_path) == node.pid
    assert cluster.cpu_s()["bookie-1"] >= 0.0
    with pytest.raises(ClusterError, match="already running"):
        cluster.spawn(node)
    cluster.pause(node)
    wait_until(lambda: _state(node.pid) == "T", 5.0, message="the paused bookie stopped (state T)")
    cluster.resume(node)
    wait_until(lambda: _state(node.pid) != "T", 5.0, message="the resumed bookie runs again")
    pid = node.pid
    cluster.kill9(node)
    assert node.pid is None and not processes.is_alive(pid) and cluster.last_pids["bookie-1"] == pid
    assert cluster.check_processes() == []  # down on purpose: not reported


def test_a_node_that_exits_fails_the_wait_at_once_with_its_log_tail(cluster):
    node = cluster.add_bookie(argv=[sys.executable, "-c", FAKE_BOOKIE, "die"])
    cluster.spawn(node)
    with pytest.raises(ClusterError, match="bookie-1 .* exited before registering") as e:
        cluster.wait_ready([node], 30.0)
    assert "fake bookie: boom" in str(e.value)
    assert isinstance(e.value, BksimError)
    assert "bookie-1" in cluster.check_processes()[0]
    node.pid = None
