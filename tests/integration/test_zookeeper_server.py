"""The project's ZooKeeper: started from Debian's jars, ready when kazoo reads `/`, stopped by pid."""
from __future__ import annotations

import os
import sys
import time

from bksim.adapters import processes
from bksim.adapters.zookeeper_server import MAIN_CLASS, ZooKeeperServer
from helpers import free_port, wait_until


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


def test_start_writes_config_and_pid_file_and_stop_removes_it(tmp_path):
    server = ZooKeeperServer("127.0.0.1", free_port(), str(tmp_path / "zookeeper"), 200, 64, str(tmp_path / "zk.log"))
    pid = server.start()
    try:
        cfg = (tmp_path / "zoo.cfg").read_text()
        assert f"clientPort={server.port}" in cfg and "clientPortAddress=127.0.0.1" in cfg
        assert "admin.enableServer=false" in cfg and f"dataDir={tmp_path / 'zookeeper'}" in cfg
        assert processes.read_pid(server.pid_path) == pid
        assert server.wait_ready(30.0) >= 0
        assert server.is_running()
        assert MAIN_CLASS in processes.cmdline(pid)
    finally:
        assert server.stop(10.0)
    assert not processes.is_alive(pid)
    assert not os.path.exists(server.pid_path)
