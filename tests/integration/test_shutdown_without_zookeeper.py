"""A bookie and a broker told to stop (SIGTERM) after their ZooKeeper died stop within their bounds.

Every shutdown step is bounded (drain, checkpoint, deregistration, closing the session): with ZooKeeper gone,
deregistering cannot succeed, and the ephemeral registration dies with the session anyway, so the process
must give up on it and exit instead of waiting for a server that will not come back. A private ZooKeeper,
so killing it touches no other test.
"""
from __future__ import annotations

import time

import pytest

from bksim.adapters import processes
from bksim.adapters.local_cluster import LocalCluster
from helpers import wait_until

SESSION_TIMEOUT_MS = 4_000
SHUTDOWN_GRACE_MS = 2_000
# drain + checkpoint + deregistration and session close (each bounded by the session timeout), with room to spare
EXIT_WITHIN_S = (SHUTDOWN_GRACE_MS + 3 * SESSION_TIMEOUT_MS) / 1000 + 10


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(str(tmp_path), inherit_bksim_env=False, cwd=str(tmp_path))
    try:
        yield c
    finally:
        c.stop_all()


def test_bookie_and_broker_exit_on_sigterm_after_zookeeper_died(cluster):
    cluster.start_zookeeper()
    env = {"BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
           "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": str(SHUTDOWN_GRACE_MS),
           "BKSIM_BROKER_SHUTDOWN_GRACE_MS": str(SHUTDOWN_GRACE_MS)}
    bookie = cluster.add_bookie(env=env)
    broker = cluster.add_broker(env=env)
    cluster.start([bookie, broker], serving=True)
    bookie_pid, broker_pid = bookie.pid, broker.pid

    assert processes.kill9(cluster.zookeeper.pid, 10.0)
    # both notice the lost connection before they are told to stop
    wait_until(lambda: "ZooKeeper connection state: SUSPENDED" in bookie.log_tail(50), 30,
               message="the bookie never noticed that ZooKeeper is gone")
    started = time.monotonic()
    processes.terminate(bookie_pid)
    processes.terminate(broker_pid)
    try:
        wait_until(lambda: not processes.is_alive(bookie_pid) and not processes.is_alive(broker_pid), EXIT_WITHIN_S)
    except AssertionError:
        raise AssertionError(f"still running {EXIT_WITHIN_S:.0f} s after SIGTERM (bookie alive: "
                             f"{processes.is_alive(bookie_pid)}, broker alive: {processes.is_alive(broker_pid)})\n"
                             f"{cluster.logs(20)}") from None
    assert time.monotonic() - started < EXIT_WITHIN_S
    assert "deregister gave up" in bookie.log_tail(20) and "bye" in bookie.log_tail(20), bookie.log_tail(20)
    assert "bye" in broker.log_tail(20), broker.log_tail(20)
