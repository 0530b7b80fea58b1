"""Fixtures shared by the integration tests: a kazoo client on the session's ZooKeeper, a list of
bookie processes that are all cleaned up (stopped by pid, directories kept for the test's tmp dir), and a
module's bookies and brokers (`broker_cluster`, see broker_harness.py)."""
from __future__ import annotations

import pytest

from integration.bookie_harness import BookieProcess, kazoo_client


@pytest.fixture
def zk(zookeeper):
    client = kazoo_client(zookeeper)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def bookies():
    started: list[BookieProcess] = []
    yield started
    for b in started:
        b.cleanup()


@pytest.fixture(scope="module")
def broker_cluster(zookeeper, tmp_path_factory):
    """Bookies and brokers shared by one module (integration.broker_harness.BrokerCluster); every process it
    started is stopped by pid at the end of the module."""
    from integration.broker_harness import BrokerCluster

    cluster = BrokerCluster(zookeeper, tmp_path_factory.mktemp("broker-cluster"))
    try:
        yield cluster
    finally:
        cluster.cleanup()
