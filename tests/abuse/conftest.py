"""The abuse suite's fixture: `target` (abuse.harness.Target), one real bookie and one real broker over the
session's ZooKeeper, started once for the directory; at the end, the peak RSS (VmHWM) of each is printed."""
from __future__ import annotations

import pytest

from abuse.harness import BOOKIE_ENV, BROKER_ENV, WELL_BEHAVED_DEADLINE_S, Target
from helpers import wait_until
from integration.bookie_harness import BookieProcess
from integration.broker_harness import BrokerCluster, BrokerConn


@pytest.fixture(scope="package")
def target(zookeeper, tmp_path_factory):
    cluster = BrokerCluster(zookeeper, tmp_path_factory.mktemp("abuse-cluster"))
    try:
        bookie = BookieProcess(zookeeper, cluster.base_dir, name="bookie-abuse", env=BOOKIE_ENV)
        cluster.bookies.append(bookie)
        bookie.spawn()
        bookie.wait_registered(cluster.zk)
        # only this bookie: a bookie another module killed keeps its registration until its session expires
        wait_until(lambda: cluster.registered_writable() == {bookie.bookie_id}, 20.0,
                   message=f"the writable bookies to be exactly {bookie.bookie_id}")
        broker, = cluster.start_brokers(1, env=BROKER_ENV)
        conn = BrokerConn(broker.address, deadline_s=WELL_BEHAVED_DEADLINE_S)
        t = Target(cluster, bookie, broker, conn)
        yield t
        conn.close()
        for name, rows in t.peaks.items():
            worst = max(rows, key=lambda r: r[1])
            print(f"[abuse] peak RSS of the {name}: {worst[1] / 1024:.0f} MiB (VmHWM, after '{worst[0]}')")
    finally:
        cluster.cleanup()
