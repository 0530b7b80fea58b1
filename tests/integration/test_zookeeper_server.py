"""The project's ZooKeeper: started from Debian's jars, ready when kazoo reads `/`, stopped by pid."""
from __future__ import annotations

import os
import socket
import sys
import time

import pytest
from kazoo.client import KazooClient

from bksim.adapters import processes
from bksim.adapters.zookeeper_server import MAIN_CLASS, ZooKeeperError, ZooKeeperServer
from bksim.model.config import Config
from helpers import free_port, wait_until

READY_TIMEOUT_S = 30.0


def four_letter_word(host: str, port: int, word: bytes, timeout_s: float = 5.0) -> bytes:
    """ZooKeeper's four-letter-word admin command: the whole answer (the server closes after it)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(word)
        answer = b""
        while len(answer) < 65536:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def test_shared_server_serves_and_expires_sessions_quickly(zookeeper, zk_client, zk_root, tmp_path):
    zk_client.create(f"{zk_root}/a", b"x", makepath=True)
    assert zk_client.get(f"{zk_root}/a")[0] == b"x"
    # A process that holds an ephemeral node is SIGKILLed: the server must expire its session within a
    # couple of seconds (tickTime 200 ms), which is what bookie-failure tests rely on.
    script = ("import signal, sys\n"
              "from kazoo.client import KazooClient\n"
              "c = KazooClient(hosts=sys.argv[1], timeout=0.6); c.start(timeout=10)\n"
              "c.create(sys.argv[2], b'', ephemeral=True, makepath=True)\n"
              "signal.sigtimedwait({signal.SIGTERM}, 60)\n")  # until killed (SIGKILL below), at most 60 s
    pid = processes.spawn([sys.executable, "-c", script, zookeeper.connect, f"{zk_root}/eph"], None,
                          str(tmp_path / "holder.log"))
    try:
        wait_until(lambda: zk_client.exists(f"{zk_root}/eph"), 20.0, message="ephemeral node to appear")
        assert processes.kill9(pid, 5.0)
        killed = time.monotonic()
        wait_until(lambda: zk_client.exists(f"{zk_root}/eph") is None, 3.0, message="session to expire")
        assert time.monotonic() - killed < 3.0
    finally:
        processes.kill9(pid, 5.0)


def test_shared_server_grants_the_session_bksim_asks_for_by_default_not_20_ticks(zookeeper):
    from conftest import ZK_MAX_SESSION_TIMEOUT_MS, ZK_TICK_TIME_MS

    asked_s = Config().zookeeper.session_timeout_ms / 1000
    assert asked_s * 1000 > 20 * ZK_TICK_TIME_MS  # what the server would clamp it to by default
    client = KazooClient(hosts=zookeeper.connect, timeout=asked_s)
    client.start(timeout=10.0)
    try:
        # the timeout the server negotiated: a client that stalls for a few seconds keeps its session
        assert client._session_timeout == asked_s * 1000 <= ZK_MAX_SESSION_TIMEOUT_MS
    finally:
        client.stop()
        client.close()


def test_start_writes_config_and_pid_file_and_stop_removes_it(tmp_path):
    server = ZooKeeperServer("127.0.0.1", free_port(), str(tmp_path / "zookeeper"), 200, 64, str(tmp_path / "zk.log"))
    pid = server.start()
    try:
        cfg = (tmp_path / "zoo.cfg").read_text()
        assert f"clientPort={server.port}" in cfg and "clientPortAddress=127.0.0.1" in cfg
        assert "admin.enableServer=false" in cfg and f"dataDir={tmp_path / 'zookeeper'}" in cfg
        assert "maxSessionTimeout" not in cfg  # ZooKeeper's own default (20 ticks) unless asked
        assert processes.read_pid(server.pid_path) == pid
        waited = server.wait_ready(READY_TIMEOUT_S)
        assert 0 <= waited < READY_TIMEOUT_S
        # ready means serving: the server answers ruok, and a client writes and reads back a node
        assert four_letter_word(server.host, server.port, b"ruok") == b"imok"
        client = KazooClient(hosts=server.connect, timeout=5.0)
        client.start(timeout=10.0)
        try:
            client.create("/ready-probe", b"served", makepath=True)
            assert client.get("/ready-probe")[0] == b"served"
        finally:
            client.stop()
            client.close()
        assert server.is_running()
        assert MAIN_CLASS in processes.cmdline(pid)
    finally:
        assert server.stop(10.0)
    assert not processes.is_alive(pid)
    assert not os.path.exists(server.pid_path)


def test_wait_ready_on_a_port_nobody_serves_fails_with_a_clear_error_by_its_deadline(tmp_path):
    server = ZooKeeperServer("127.0.0.1", free_port(), str(tmp_path / "zookeeper"), 200, 64, str(tmp_path / "zk.log"))
    assert server.pid is None and not server.is_running()  # never started: nothing listens on the port
    started = time.monotonic()
    with pytest.raises(ZooKeeperError) as e:
        server.wait_ready(1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 5.0, elapsed
    assert f"ZooKeeper at {server.connect} not ready after 1.0s" in str(e.value)
