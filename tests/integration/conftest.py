"""Fixtures shared by the bookie integration tests: a kazoo client on the session's ZooKeeper, and a list of
bookie processes that are all cleaned up (stopped by pid, directories kept for the test's tmp dir)."""
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
