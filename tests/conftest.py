"""Fixtures shared by all tests.

- `zookeeper` (session): one real ZooKeeper server (Debian's jars, started by the local-cluster launcher,
  adapters.local_cluster) on a free loopback port, tickTime 200 ms (so a process a test starts may ask for a
  session that expires in about a second), sessions granted up to 10 s (what bksim asks for by default: a client
  that did not ask for a short session survives a stall of the whole machine of a few seconds), data under
  pytest's tmp dir; stopped by pid at the end of the session. Yields the `ZooKeeperServer`; use `.connect` ("127.0.0.1:port"), `.host`, `.port`.
- `zk_client` (function): a started kazoo client on that server, stopped afterwards.
- `zk_root` (function): a unique absolute path ("/t-<hex>") a test may use as its own namespace.
- (autouse, module) the modules of tests/sim and tests/fuzz run with the heap earlier tests left frozen (below).

`helpers.py` (wait_until, free_port) is importable as `from helpers import wait_until` because pyproject
puts tests/ on pytest's pythonpath.
"""
from __future__ import annotations

import gc
import logging
import os
import uuid

import pytest

from helpers import free_port


def _worker_port_range() -> None:
    """Under pytest-xdist each worker hands out ports from its own slice of bksim's range (BKSIM_PORT_RANGE, which
    the processes a test starts inherit), so two workers never pick the same port between a check and a bind."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or "BKSIM_PORT_RANGE" in os.environ:
        return
    from bksim.adapters.ports import PORT_RANGE_ENV, port_range

    floor, ceiling = port_range()
    width = (ceiling - floor) // int(count)
    low = floor + int(worker[2:]) * width
    os.environ[PORT_RANGE_ENV] = f"{low}-{low + width}"


_worker_port_range()

ZK_TICK_TIME_MS = 200
ZK_MAX_SESSION_TIMEOUT_MS = 10_000  # zookeeper.session_timeout_ms's default; without it 20 ticks (4 s) at most
ZK_HEAP_MB = 128
ZK_READY_TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    from bksim.adapters.local_cluster import LocalCluster

    cluster = LocalCluster(str(tmp_path_factory.mktemp("zookeeper")))
    try:
        yield cluster.start_zookeeper(free_port(), tick_time_ms=ZK_TICK_TIME_MS, heap_mb=ZK_HEAP_MB,
                                      timeout_s=ZK_READY_TIMEOUT_S, max_session_timeout_ms=ZK_MAX_SESSION_TIMEOUT_MS)
    finally:
        assert not cluster.stop_all(), f"ZooKeeper pid {cluster.zookeeper.pid} did not stop"


@pytest.fixture
def zk_client(zookeeper):
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zookeeper.connect, timeout=5.0, logger=logging.getLogger("tests.kazoo"))
    client.start(timeout=10.0)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def zk_root() -> str:
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The simulator's sweeps and the fuzz tests run product code in this process and allocate heavily. Every full
# collection of Python's garbage collector walks every object alive in the process, those earlier tests of the
# session left behind included: the 500-seed ledger sweep took 80 s inside `make test` and 23 s alone. Their
# modules run with the heap they found frozen (out of the collector's reach; what a module allocates is collected
# as usual), so their time is their own.
IN_PROCESS_HEAVY = ("sim", "fuzz")


@pytest.fixture(autouse=True, scope="module")
def _earlier_heap_frozen(request):
    kind = os.path.basename(os.path.dirname(str(request.path)))
    if kind not in IN_PROCESS_HEAVY:
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
