"""`bksim cluster up|down|status|init` with a real ZooKeeper and real child processes.

Most bookie processes here are stand-ins (a few lines of kazoo) so that these tests check the cluster
command itself: the layout and environment it gives each bookie, that `up` waits for registration, that it
fails fast with the log tail when a bookie (or a broker) dies, and that `down` stops everything by pid. The
last test runs real `bksim bookie run` and `bksim broker run` processes (tests/integration/test_ledger_cli.py
runs a whole cluster with brokers through `cluster up`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from bksim.adapters import processes
from bksim.adapters.local_cluster import registration_doc
from bksim.adapters.zookeeper_server import MAIN_CLASS
from bksim.cli import cluster_cmd
from helpers import free_port, kill_leftovers


@pytest.fixture(autouse=True)
def nothing_left_running(tmp_path):
    """Every process a test here starts names its tmp dir (config, data, zoo.cfg): none may outlive the test.
    Leftovers are killed by pid and fail the test, so a `down` that misses a process cannot go unseen."""
    yield
    left = kill_leftovers(str(tmp_path))
    assert not left, f"processes left running after the test (killed now): {left}"


FAKE_BOOKIE = r"""
# stands in for `python -m bksim.cli.main bookie run` (that marker is how `down` recognises a bookie pid)
import json, os, signal, sys, time
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
mode = sys.argv[1]
if mode == "die":
    print("fake bookie: cannot bind port " + os.environ["BKSIM_BOOKIE_PORT"] + ": boom", flush=True)
    sys.exit(1)
zk = KazooClient(hosts=os.environ["BKSIM_ZOOKEEPER_HOST"] + ":" + os.environ["BKSIM_ZOOKEEPER_PORT"], timeout=2.0)
zk.start(timeout=10)
bookie_id = os.environ["BKSIM_BOOKIE_BOOKIE_ID"]
data = {k: v for k, v in os.environ.items() if k.startswith("BKSIM_")}
parent = "/ledgers/available/readonly" if mode == "readonly" else "/ledgers/available"
deadline = time.monotonic() + 20  # a previous incarnation's node lingers until its session expires
while True:
    try:
        zk.create(parent + "/" + bookie_id, json.dumps(data).encode(), ephemeral=True)
        break
    except NodeExistsError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
print("fake bookie registered", bookie_id, flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigtimedwait({signal.SIGTERM}, 60)  # until `down` stops it (SIGTERM), at most 60 s
"""


FAKE_BROKER = r"""
# stands in for `python -m bksim.cli.main broker run`
import json, os, signal, sys, time
from kazoo.client import KazooClient
if sys.argv[1] == "die":
    print("fake broker: cannot bind port " + os.environ["BKSIM_BROKER_PORT"] + ": boom", flush=True)
    sys.exit(1)
# "deaf": registers with its own pid like a broker, but serves no gRPC (so health never says SERVING)
zk = KazooClient(hosts=os.environ["BKSIM_ZOOKEEPER_HOST"] + ":" + os.environ["BKSIM_ZOOKEEPER_PORT"], timeout=2.0)
zk.start(timeout=10)
broker_id = os.environ["BKSIM_BROKER_BROKER_ID"]
host, port = broker_id.rsplit(":", 1)
zk.create("/brokers/available/" + broker_id, json.dumps({"broker_id": broker_id, "host": host, "port": int(port),
          "pid": os.getpid()}).encode(), ephemeral=True, makepath=True)
print("fake broker registered", broker_id, flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
signal.sigtimedwait({signal.SIGTERM}, 60)  # until `down` stops it (SIGTERM), at most 60 s
"""


def write_config(tmp_path, bookies: int, brokers: int = 0, extra: str = "") -> str:
    """A cluster configuration on free ports under `tmp_path` (short timeouts); `extra`: more TOML, appended."""
    path = tmp_path / "bksim.toml"
    path.write_text(f"""
[cluster]
run_dir = "{tmp_path / 'run'}"
bookies = {bookies}
bookie_port_base = {free_port(count=max(1, bookies))}
brokers = {brokers}
broker_port_base = {free_port(count=max(1, brokers))}
bookie_http_port_base = {free_port(count=max(1, bookies))}
broker_http_port_base = {free_port(count=max(1, brokers))}
start_timeout_ms = 20000
[zookeeper]
port = {free_port()}
tick_time_ms = 200
session_timeout_ms = 2000
heap_mb = 64
[bookie]
shutdown_grace_ms = 2000
[broker]
shutdown_grace_ms = 2000
""" + extra)
    return str(path)


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("BKSIM_"):
            monkeypatch.delenv(key)


def bksim(config: str, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", "--config", config, *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_up_status_down_with_zero_bookies(tmp_path):
    config = write_config(tmp_path, bookies=3)
    up = bksim(config, "cluster", "up", env_extra={"BKSIM_CLUSTER_BOOKIES": "0"})
    assert up.returncode == 0, up.stdout + up.stderr
    assert "# effective configuration" in up.stderr and "bookies = 0" in up.stderr
    pid_path = tmp_path / "run" / "pids" / "zookeeper.pid"
    pid = processes.read_pid(str(pid_path))
    try:
        assert processes.is_alive(pid, MAIN_CLASS)
        assert (tmp_path / "run" / "zoo.cfg").exists() and (tmp_path / "run" / "logs").is_dir()
        port = int([l for l in (tmp_path / "run" / "zoo.cfg").read_text().splitlines()
                    if l.startswith("clientPort=")][0].split("=")[1])
        zk = KazooClient(hosts=f"127.0.0.1:{port}")
        zk.start(timeout=10)
        try:
            for path in ("/ledgers", "/ledgers/available", "/ledgers/available/readonly", "/ledgers/cookies"):
                assert zk.exists(path) is not None, path
            instance_id = zk.get("/ledgers/INSTANCEID")[0].decode()
            assert len(instance_id) >= 32
        finally:
            zk.stop()
            zk.close()

        status = bksim(config, "cluster", "status", "--json", env_extra={"BKSIM_CLUSTER_BOOKIES": "0"})
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["processes"][0] == {"name": "zookeeper", "pid": pid, "alive": True,
                                          "address": f"127.0.0.1:{port}", "registered": "-"}

        again = bksim(config, "cluster", "up", env_extra={"BKSIM_CLUSTER_BOOKIES": "0"})  # idempotent
        assert again.returncode == 0 and f"already running (pid {pid})" in again.stdout
        init = bksim(config, "cluster", "init")
        assert init.returncode == 0 and instance_id in init.stdout  # INSTANCEID is never replaced
    finally:
        down = bksim(config, "cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"zookeeper: stopped pid {pid}" in down.stdout
    assert not processes.is_alive(pid)
    assert not pid_path.exists()
    status = bksim(config, "cluster", "status")
    assert status.returncode == 3 and "zookeeper" in status.stdout


def test_up_refuses_a_zookeeper_port_someone_else_uses(tmp_path, zookeeper):
    config = write_config(tmp_path, bookies=0)
    result = bksim(config, "cluster", "up", env_extra={"BKSIM_ZOOKEEPER_PORT": str(zookeeper.port)})
    assert result.returncode == 2
    assert "already in use by a process this cluster did not start" in result.stderr


def _args(config: str) -> argparse.Namespace:
    return argparse.Namespace(config=config)


def test_up_starts_bookies_with_their_own_dirs_and_ports_and_waits_for_registration(tmp_path, clean_env, monkeypatch):
    config = write_config(tmp_path, bookies=2)
    monkeypatch.setattr(cluster_cmd, "bookie_argv", lambda cfg: [sys.executable, "-c", FAKE_BOOKIE, "ok"])
    cfg = cluster_cmd.loader.load(config)
    run = tmp_path / "run"
    try:
        assert cluster_cmd.cmd_up(_args(config)) == 0
        pids = [processes.read_pid(str(run / "pids" / f"bookie-{i}.pid")) for i in (1, 2)]
        assert all(processes.is_alive(p) for p in pids)
        zk = KazooClient(hosts=f"127.0.0.1:{cfg.zookeeper.port}")
        zk.start(timeout=10)
        try:
            for i in (1, 2):
                port = cfg.cluster.bookie_port_base + i - 1
                env = json.loads(zk.get(f"/ledgers/available/127.0.0.1:{port}")[0])
                assert env["BKSIM_BOOKIE_PORT"] == str(port)
                assert env["BKSIM_BOOKIE_JOURNAL_DIR"] == str(run / f"bookie-{i}" / "journal")
                assert env["BKSIM_BOOKIE_LEDGER_DIR"] == str(run / f"bookie-{i}" / "ledgers")
                assert env["BKSIM_CLUSTER_RUN_DIR"] == str(run)
        finally:
            zk.stop()
            zk.close()
        assert cluster_cmd.cmd_status(argparse.Namespace(config=config, json=False)) == 0
        node = f"/ledgers/available/127.0.0.1:{cfg.cluster.bookie_port_base + 1}"
        zk.start(timeout=10)
        try:
            old_czxid = zk.exists(node).czxid
            assert processes.kill9(pids[1])
            assert cluster_cmd.cmd_status(argparse.Namespace(config=config, json=False)) == 1  # a dead bookie shows
            assert zk.exists(node) is not None  # the dead incarnation's session has not expired yet
            assert cluster_cmd.cmd_up(_args(config)) == 0  # restarts only the dead one...
            # ...and waits for the NEW incarnation's registration, not the one its predecessor left behind
            assert zk.exists(node).czxid != old_czxid
        finally:
            zk.stop()
            zk.close()
        assert processes.read_pid(str(run / "pids" / "bookie-1.pid")) == pids[0]
        pids.append(processes.read_pid(str(run / "pids" / "bookie-2.pid")))
        assert pids[2] != pids[1] and processes.is_alive(pids[2])
    finally:
        assert cluster_cmd.cmd_down(_args(config)) == 0
    assert not any(processes.is_alive(p) for p in pids)
    assert not list((run / "pids").iterdir())


def test_up_fails_fast_with_the_log_tail_when_a_bookie_exits(tmp_path, clean_env, monkeypatch):
    config = write_config(tmp_path, bookies=1)
    monkeypatch.setattr(cluster_cmd, "bookie_argv", lambda cfg: [sys.executable, "-c", FAKE_BOOKIE, "die"])
    started = time.monotonic()
    try:
        with pytest.raises(cluster_cmd.ClusterError) as e:
            cluster_cmd.cmd_up(_args(config))
        assert "bookie-1" in str(e.value) and "exited before registering" in str(e.value)
        assert "cannot bind port" in str(e.value) and "boom" in str(e.value)  # the log tail
        assert time.monotonic() - started < 15.0  # well before start_timeout_ms (20 s)
    finally:
        assert cluster_cmd.cmd_down(_args(config)) == 0


def test_up_fails_fast_with_the_log_tail_when_a_broker_exits(tmp_path, clean_env, monkeypatch):
    config = write_config(tmp_path, bookies=0, brokers=1)
    monkeypatch.setattr(cluster_cmd, "broker_argv", lambda cfg: [sys.executable, "-c", FAKE_BROKER, "die"])
    started = time.monotonic()
    try:
        with pytest.raises(cluster_cmd.ClusterError) as e:
            cluster_cmd.cmd_up(_args(config))
        assert "broker-1" in str(e.value) and "exited before it was registered and serving" in str(e.value)
        assert "cannot bind port" in str(e.value) and "boom" in str(e.value)  # the log tail
        assert time.monotonic() - started < 15.0  # well before start_timeout_ms (20 s)
    finally:
        assert cluster_cmd.cmd_down(_args(config)) == 0


def test_up_waits_for_a_registered_broker_to_serve(tmp_path, clean_env, monkeypatch, capsys):
    """A broker registered in ZooKeeper that does not answer gRPC health is not ready: `up` fails at
    cluster.start_timeout_ms naming the health check; `down` stops it by pid."""
    config = write_config(tmp_path, bookies=0, brokers=1)
    monkeypatch.setattr(cluster_cmd, "broker_argv", lambda cfg: [sys.executable, "-c", FAKE_BROKER, "deaf"])
    pid_path = tmp_path / "run" / "pids" / "broker-1.pid"
    try:
        monkeypatch.setenv("BKSIM_CLUSTER_BROKERS", "0")
        assert cluster_cmd.cmd_up(_args(config)) == 0  # ZooKeeper first, with the file's start timeout
        monkeypatch.delenv("BKSIM_CLUSTER_BROKERS")
        monkeypatch.setenv("BKSIM_CLUSTER_START_TIMEOUT_MS", "2000")
        with pytest.raises(cluster_cmd.ClusterError) as e:
            cluster_cmd.cmd_up(_args(config))
        assert "broker-1" in str(e.value) and "not ready within 2.0s" in str(e.value)
        assert "health UNAVAILABLE" in str(e.value)  # it was registered: what failed is the health check
        assert "fake broker registered" in str(e.value)  # the log tail
        pid = processes.read_pid(str(pid_path))
        assert processes.is_alive(pid)
    finally:
        assert cluster_cmd.cmd_down(_args(config)) == 0
    assert "broker-1: stopped pid" in capsys.readouterr().out
    assert not processes.is_alive(pid) and not pid_path.exists()


def test_up_accepts_a_read_only_registration(tmp_path, clean_env, monkeypatch):
    config = write_config(tmp_path, bookies=1)
    monkeypatch.setattr(cluster_cmd, "bookie_argv", lambda cfg: [sys.executable, "-c", FAKE_BOOKIE, "readonly"])
    try:
        assert cluster_cmd.cmd_up(_args(config)) == 0
    finally:
        assert cluster_cmd.cmd_down(_args(config)) == 0


def _broker_registration(config: str, broker_id: str) -> dict | None:
    cfg = cluster_cmd.loader.load(config, env={})
    zk = KazooClient(hosts=f"127.0.0.1:{cfg.zookeeper.port}")
    zk.start(timeout=10)
    try:
        return registration_doc(zk, "broker", broker_id)
    finally:
        zk.stop()
        zk.close()


def test_up_with_real_bookies_survives_kill9_and_restart(tmp_path):
    """`bksim bookie run` and `bksim broker run` processes: up registers them, a kill -9'd one is restarted by
    `up`, down stops all (brokers first)."""
    config = write_config(tmp_path, bookies=2, brokers=1)
    run = tmp_path / "run"
    up = bksim(config, "cluster", "up")
    pids = []
    try:
        logs = "".join((run / "logs" / f"{n}.log").read_text() for n in ("bookie-1", "broker-1")
                       if (run / "logs" / f"{n}.log").exists())
        assert up.returncode == 0, up.stdout + up.stderr + logs
        assert up.stdout.count("registered writable") == 2
        assert "broker-1: registered and SERVING" in up.stdout
        cfg = cluster_cmd.loader.load(config, env={})
        broker_id = f"127.0.0.1:{cfg.cluster.broker_port_base}"
        assert f"broker-1   {broker_id}" in up.stdout  # the endpoints
        assert (f"try: {cluster_cmd.bksim_command()} ledger create --ensemble 2 --write-quorum 2 --ack-quorum 2 "
                f"--config {config}") in up.stdout
        pids = [processes.read_pid(str(run / "pids" / f"bookie-{i}.pid")) for i in (1, 2)]
        assert all(processes.is_alive(p, "bksim.cli.main") for p in pids)
        broker_pid = processes.read_pid(str(run / "pids" / "broker-1.pid"))
        pids.append(broker_pid)
        assert processes.is_alive(broker_pid, "bksim.cli.main") and "broker run" in processes.cmdline(broker_pid)
        assert _broker_registration(config, broker_id)["pid"] == broker_pid
        status = json.loads(bksim(config, "cluster", "status", "--json").stdout)
        assert [(r["name"], r["registered"]) for r in status["processes"][1:]] == \
            [("bookie-1", "writable"), ("bookie-2", "writable"), ("broker-1", "yes")]
        assert status["brokers_registered"] == [broker_id]
        c = cfg.cluster  # each process's HTTP port is in the status, and serves /metrics
        assert [r["http_port"] for r in status["processes"][1:]] == \
            [c.bookie_http_port_base, c.bookie_http_port_base + 1, c.broker_http_port_base]
        for port, name in ((c.bookie_http_port_base + 1, "bookie_SERVER_STATUS"),
                           (c.broker_http_port_base, "pulsar_topics_count")):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
                assert f"\n{name} " in r.read().decode()
        assert (run / "bookie-1" / "journal").is_dir() and (run / "bookie-2" / "ledgers").is_dir()

        assert processes.kill9(broker_pid)
        assert bksim(config, "cluster", "status").returncode == 1  # a dead broker shows
        again = bksim(config, "cluster", "up")
        assert again.returncode == 0, again.stdout + again.stderr + (run / "logs" / "broker-1.log").read_text()
        broker_pid = processes.read_pid(str(run / "pids" / "broker-1.pid"))
        pids.append(broker_pid)
        assert pids[-1] != pids[-2] and processes.is_alive(broker_pid, "bksim.cli.main") and "broker run" in processes.cmdline(broker_pid)
        # `up` waited for the new incarnation's registration, not the node its predecessor's session left
        assert _broker_registration(config, broker_id)["pid"] == broker_pid

        assert processes.kill9(pids[0])
        again = bksim(config, "cluster", "up")
        assert again.returncode == 0, again.stdout + again.stderr + (run / "logs" / "bookie-1.log").read_text()
        restarted = processes.read_pid(str(run / "pids" / "bookie-1.pid"))
        assert restarted != pids[0] and processes.is_alive(restarted, "bksim.cli.main")
        assert f"already running (pid {pids[1]})" in again.stdout
        assert f"already running (pid {broker_pid})" in again.stdout
        pids.append(restarted)
    finally:
        down = bksim(config, "cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr
    lines = down.stdout.splitlines()
    stopped = [l.split(":")[0] for l in lines if ": stopped pid" in l]
    assert stopped == ["broker-1", "bookie-1", "bookie-2", "zookeeper"], down.stdout  # brokers first
    assert not any(processes.is_alive(p) for p in pids)


def test_up_secure_serves_only_tls_with_a_token_and_locks_zookeeper_and_a_second_up_keeps_the_secrets(tmp_path):
    config = write_config(tmp_path, bookies=1, brokers=1)
    up = bksim(config, "cluster", "up", "--secure")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        env_file = tmp_path / "run" / "tls" / "client.env"
        assert "set -a; . " in up.stdout and env_file.exists()
        client_env = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        assert set(client_env) >= {"BKSIM_SECURITY_TLS_ENABLED", "BKSIM_SECURITY_TOKEN_FILE",
                                   "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"}
        secrets_dir = tmp_path / "run" / "secure"
        token = (secrets_dir / "super-user.token").read_text().strip()
        zk_password = (secrets_dir / "zk-credentials").read_text().strip().split(":", 1)[1]
        assert token not in up.stdout + up.stderr and zk_password not in up.stdout + up.stderr

        made = bksim(config, "ledger", "create", "-e", "1", "-w", "1", "-a", "1", env_extra=client_env)
        assert made.returncode == 0, made.stdout + made.stderr
        without_token = {k: v for k, v in client_env.items() if k != "BKSIM_SECURITY_TOKEN_FILE"}
        refused = bksim(config, "ledger", "create", "-e", "1", "-w", "1", "-a", "1", env_extra=without_token)
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
        plaintext = bksim(config, "ledger", "create", "-e", "1", "-w", "1", "-a", "1")
        assert plaintext.returncode != 0 and "UNAVAILABLE" in plaintext.stderr, plaintext.stderr

        port = int([l for l in (tmp_path / "run" / "zoo.cfg").read_text().splitlines()
                    if l.startswith("clientPort=")][0].split("=")[1])
        anonymous = KazooClient(hosts=f"127.0.0.1:{port}")
        anonymous.start(timeout=10)
        try:
            with pytest.raises(NoAuthError):
                anonymous.get_children("/ledgers/available")
        finally:
            anonymous.stop()
            anonymous.close()

        again = bksim(config, "cluster", "up", "--secure")  # idempotent: the same secrets, the same cluster
        assert again.returncode == 0, again.stdout + again.stderr
        assert (secrets_dir / "super-user.token").read_text().strip() == token
        status = bksim(config, "cluster", "status", env_extra=client_env)
        assert status.returncode == 0 and "writable" in status.stdout, status.stdout + status.stderr
    finally:
        down = bksim(config, "cluster", "down")
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_status_down_with_an_ensemble(tmp_path):
    config = write_config(tmp_path, bookies=1, brokers=0)
    env = {"BKSIM_ZOOKEEPER_PORT": str(free_port(count=3)),
           "BKSIM_ZOOKEEPER_QUORUM_PORT_BASE": str(free_port(count=3)),
           "BKSIM_ZOOKEEPER_ELECTION_PORT_BASE": str(free_port(count=3))}
    first = int(env["BKSIM_ZOOKEEPER_PORT"])
    up = bksim(config, "cluster", "up", "--zookeepers", "3", env_extra=env)
    pids = [processes.read_pid(str(tmp_path / "run" / "pids" / f"zookeeper-{n}.pid")) for n in (1, 2, 3)]
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        connect = ",".join(f"127.0.0.1:{first + n}" for n in range(3))
        assert f"a ZooKeeper ensemble of 3 ({connect}; leader zookeeper-" in up.stdout
        assert all(processes.is_alive(pid, MAIN_CLASS) for pid in pids)
        for n in (1, 2, 3):
            cfg = (tmp_path / "run" / f"zoo-{n}.cfg").read_text()
            assert f"clientPort={first + n - 1}" in cfg and cfg.count("server.") == 3
            assert (tmp_path / "run" / f"zookeeper-{n}" / "myid").read_text().strip() == str(n)
        bookie_log = (tmp_path / "run" / "logs" / "bookie-1.log").read_text()
        assert f"ZooKeeper {connect}: cluster instance" in bookie_log

        # without --zookeepers, status finds the ensemble by its pid files
        status = bksim(config, "cluster", "status", "--json", env_extra=env)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout)["processes"]
        servers = [r for r in rows if r["name"].startswith("zookeeper")]
        assert [(r["name"], r["pid"], r["alive"]) for r in servers] == [
            (f"zookeeper-{n}", pids[n - 1], True) for n in (1, 2, 3)]
        assert sorted(r["registered"] for r in servers) == ["follower", "follower", "leader"]
        assert next(r for r in rows if r["name"] == "bookie-1")["registered"] == "writable"
    finally:
        down = bksim(config, "cluster", "down", env_extra=env)
    assert down.returncode == 0, down.stdout + down.stderr
    for n, pid in enumerate(pids, 1):
        assert f"zookeeper-{n}: stopped pid {pid}" in down.stdout
        assert not processes.is_alive(pid)
