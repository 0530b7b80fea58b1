"""One local cluster of real processes: ZooKeeper, bookies and brokers on this machine, by pid.

Used by `bksim cluster up|down|status`, the chaos runs, the benchmarks and the integration tests. Owns:

- the run directory's layout:

      <run_dir>/zoo.cfg                  ZooKeeper's configuration (written at each start)
      <run_dir>/zookeeper/               ZooKeeper's data (unless another data dir is given)
      <run_dir>/zoo-<n>.cfg, zookeeper-<n>/   the same for server n of an ensemble (logs and pids
                                         zookeeper-<n>); its client, quorum and election ports are consecutive
      <run_dir>/bookie-<i>/journal       bookie i's journal directory
      <run_dir>/bookie-<i>/ledgers       bookie i's entry logs and index
      <run_dir>/logs/<name>.log          stdout+stderr of each process (zookeeper, bookie-<i>, broker-<i>)
      <run_dir>/pids/<name>.pid          pid of each process
      <tls_dir>/                         with TLS: ca.pem, <name>.pem, <name>-key.pem (security/certs.py),
                                         made when absent; `bksim cluster up --tls` uses <run_dir>/tls

- the command line (`python -m bksim.cli.main [--config F] bookie|broker run`) and the environment of each
  child: BKSIM_ overrides only (ZooKeeper address, port, id, directories), on top of the caller's environment
  (with or without its own BKSIM_ variables); with a `tls_dir`, every child serves and dials TLS
  (BKSIM_SECURITY_TLS_ENABLED, _CA_FILE, and its own _CERT_FILE / _KEY_FILE: bookie-<i>.pem, broker-<i>.pem), and
  the cluster's own gRPC clients (broker health) present `client.pem`; other security.* settings (mutual TLS,
  authorized roles, refresh) come from the caller's environment or `child_env`;
- a ZooKeeper ensemble (`zookeepers` > 1): every server started, then each waited for (an ensemble server
  serves only once a quorum has elected a leader); one server stopped, killed or started alone (the chaos
  scenarios), the leader found by asking each server (`srvr`); the children's connect string
  (BKSIM_ZOOKEEPER_CONNECT) names every server;
- readiness with deadlines: ZooKeeper serves (a kazoo client reads `/`); a bookie or broker is registered in
  ZooKeeper by *this* incarnation (the node names its pid, or names none and was created after the spawn: a
  kill -9'd predecessor's node lives until its session expires); a broker, when asked, also answers gRPC
  health SERVING. A process that exits meanwhile fails the wait at once, with the tail of its log;
- stopping by pid (SIGTERM to all at once, one bounded wait, SIGKILL to stragglers; brokers before bookies,
  as a stopping broker closes its ledgers on the bookies; ZooKeeper last), kill -9, SIGSTOP/SIGCONT;
- the CPU seconds each process used so far (the benchmarks' figures).

Invariants: only pids this cluster spawned or read from its own pid files (checked against the expected
command line) are signalled, never a process by name; every wait has a deadline; a Ctrl-C between a fork
and the bookkeeping of its pid is held back, so no child is orphaned.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from bksim.adapters import processes
from bksim.adapters.ports import free_port
from bksim.adapters.zookeeper_server import MAIN_CLASS as ZOOKEEPER_MAIN_CLASS
from bksim.adapters.zk_client import CREDENTIALS_ENV, OPEN, ZkSecurity, ZkTls, new_client, read_credentials
from bksim.adapters.zookeeper_server import Peer, ZooKeeperError, ZooKeeperServer
from bksim.model.errors import BksimError
from bksim.security import certs
from bksim.security.tls import ChannelSecurity

HOST = "127.0.0.1"
CHILD_MARKER = "bksim.cli.main"  # every bookie and broker started here runs `python -m bksim.cli.main ...`
ZOOKEEPER_READY_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0  # a (re)started bookie or broker registers within this (it may wait for a session)
STOP_GRACE_S = 15.0  # a bookie drains and checkpoints on SIGTERM; give it time before SIGKILL
KILL_WAIT_S = 5.0
ZOOKEEPER_STOP_TIMEOUT_S = 10.0
HEALTH_DEADLINE_S = 1.0  # one gRPC health check of a starting broker
ZK_CONNECT_TIMEOUT_S = 5.0
POLL_S = 0.05


class ClusterError(BksimError):
    """A cluster process did not start, did not become ready, exited, or could not be stopped."""


def child_argv(kind: str, config_path: str | None = None) -> list[str]:
    """The command line of a bookie ("bookie") or broker ("broker") process."""
    return [sys.executable, "-m", "bksim.cli.main", *(["--config", config_path] if config_path else []), kind, "run"]


@dataclass
class Node:
    """One bookie or broker: fixed name, address, directories and environment; the pid of its incarnation."""
    name: str  # bookie-1, broker-2
    kind: str  # "bookie" | "broker"
    host: str
    port: int
    env: dict[str, str]
    log_path: str
    pid_path: str
    argv: list[str]
    home: str = ""  # a bookie's directory (journal/, ledgers/)
    pid: int | None = None
    paused: bool = False
    incarnations: int = 0  # spawns by this cluster
    spawned_ms: int | None = None  # wall-clock ms of the last spawn (None: adopted from its pid file)
    torn_pending: bool = False  # chaos: its journal tail was torn while it was down (replay must report it)
    http_port: int | None = None  # its HTTP port (/metrics, admin API), when it serves one

    @property
    def node_id(self) -> str:
        """Its id in ZooKeeper and its gRPC address: "host:port"."""
        return f"{self.host}:{self.port}"

    address = node_id

    @property
    def marker(self) -> str:
        return f"{CHILD_MARKER} {self.kind} run"

    @property
    def journal_dir(self) -> str:
        return self.env.get("BKSIM_BOOKIE_JOURNAL_DIR", "")

    @property
    def ledger_dir(self) -> str:
        return self.env.get("BKSIM_BOOKIE_LEDGER_DIR", "")

    def alive(self) -> bool:
        # our own child is not reaped until we wait for it, so its pid cannot be reused: no command-line check,
        # which would fail between fork and exec, when the child still shows this process's command line
        return processes.is_alive(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        return processes.tail(self.log_path, lines)

    def cpu_s(self) -> float:
        return processes.cpu_seconds(self.pid)


class LocalCluster:
    """ZooKeeper, bookies and brokers under `run_dir` (see the module docstring).

    Build it up with `start_zookeeper()`, `add_bookie()` / `add_broker()` and `spawn()`, then `wait_ready()`;
    `stop_all()` (also `__exit__`) stops everything it runs. `inherit_bksim_env=False` gives the children the
    caller's environment without its BKSIM_ variables (so only this cluster's overrides apply); `cwd` is their
    working directory (a directory without deploy/bksim.toml reads no configuration file). `log` receives one
    line per step (started, ready, stopped).
    """

    def __init__(self, run_dir: str, *, host: str = HOST, config_path: str | None = None,
                 child_env: Mapping[str, str] | None = None, inherit_bksim_env: bool = True, cwd: str | None = None,
                 log: Callable[[str], None] = lambda line: None, zk_security: ZkSecurity | None = None,
                 tls_dir: str | None = None) -> None:
        """`zk_security`: how this cluster's own ZooKeeper clients (readiness, `kazoo()`) authenticate; the
        children read theirs from their configuration (file and BKSIM_ environment); None: the digest credentials
        of the file BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE names in the children's environment, if any, so the
        cluster reads what its children create. `tls_dir`: gRPC over TLS
        with the certificates there (made when absent), see the module docstring."""
        self.run_dir = os.path.abspath(run_dir)
        self.tls_dir = os.path.abspath(tls_dir) if tls_dir else None
        self.tls = None  # security.tls.ChannelSecurity of this cluster's own gRPC clients (None: plaintext)
        if self.tls_dir:
            client = certs.ensure(self.tls_dir, {certs.CLIENT_NAME: ((), ("client",))})[certs.CLIENT_NAME]
            self.tls = ChannelSecurity(os.path.join(self.tls_dir, certs.CA_FILE), client.cert_file, client.key_file)
        if zk_security is None:
            named = (dict(child_env or {}).get(CREDENTIALS_ENV)
                     or (os.environ.get(CREDENTIALS_ENV) if inherit_bksim_env else None))
            zk_security = ZkSecurity(*read_credentials(named)) if named else OPEN
        self.zk_security = zk_security
        self.host = host
        self.config_path = config_path
        self.child_env = dict(child_env or {})
        self.inherit_bksim_env = inherit_bksim_env
        self.cwd = cwd
        self.log = log
        self.zookeepers: list[ZooKeeperServer] = []  # one standalone server, or every server of an ensemble
        self.owns_zookeeper = True  # False: a shared ZooKeeper (attach_zookeeper), which stop_all() leaves running
        self.bookies: list[Node] = []
        self.brokers: list[Node] = []
        self.last_pids: dict[str, int] = {}  # name -> pid of its latest incarnation, kept after it stopped (reports)

    # -- layout ------------------------------------------------------------------------------------------
    @property
    def logs_dir(self) -> str:
        return os.path.join(self.run_dir, "logs")

    @property
    def pids_dir(self) -> str:
        return os.path.join(self.run_dir, "pids")

    def log_path(self, name: str) -> str:
        return os.path.join(self.logs_dir, f"{name}.log")

    def pid_path(self, name: str) -> str:
        return os.path.join(self.pids_dir, f"{name}.pid")

    @property
    def nodes(self) -> list[Node]:
        return [*self.bookies, *self.brokers]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no process named {name!r} in this cluster")

    # -- ZooKeeper ---------------------------------------------------------------------------------------
    @property
    def zookeeper(self) -> ZooKeeperServer | None:
        """The standalone server (the first server of an ensemble); None before zookeeper_server()."""
        return self.zookeepers[0] if self.zookeepers else None

    def zookeeper_server(self, port: int | None = None, *, host: str | None = None, tick_time_ms: int = 200,
                         heap_mb: int = 256, data_dir: str | None = None, secure_port: int = 0,
                         tls: ZkTls | None = None, client_auth: bool = False, count: int = 1,
                         quorum_port: int | None = None, election_port: int | None = None,
                         max_session_timeout_ms: int = 0) -> ZooKeeperServer:
        """This cluster's ZooKeeper (not started): `port` None picks a free one; `secure_port` (with the server's
        `tls` files) adds a TLS client port. `count` > 1: an ensemble of that many servers, server n on `port`
        + n - 1 (likewise `secure_port`, `quorum_port`, `election_port`; each None: free ports), its data in
        `data_dir`-<n> (default <run_dir>/zookeeper-<n>). Returns the first server."""
        host = host or self.host
        if self.zookeepers:
            return self.zookeepers[0]
        if count <= 1:
            self.zookeepers = [ZooKeeperServer(
                host, port or free_port(host), os.path.abspath(data_dir or os.path.join(self.run_dir, "zookeeper")),
                tick_time_ms, heap_mb, self.log_path("zookeeper"), pid_path=self.pid_path("zookeeper"),
                cfg_path=os.path.join(self.run_dir, "zoo.cfg"), secure_port=secure_port, tls=tls,
                client_auth=client_auth, security=self.zk_security, max_session_timeout_ms=max_session_timeout_ms)]
            return self.zookeepers[0]

        def ports(first: int | None) -> list[int]:
            return [first + n for n in range(count)] if first else [free_port(host) for _ in range(count)]

        clients, quorum, election = ports(port), ports(quorum_port), ports(election_port)
        peers = tuple(Peer(n + 1, host, quorum[n], election[n]) for n in range(count))
        base_dir = os.path.abspath(data_dir or os.path.join(self.run_dir, "zookeeper"))
        for n in range(count):
            name = f"zookeeper-{n + 1}"
            self.zookeepers.append(ZooKeeperServer(
                host, clients[n], f"{base_dir}-{n + 1}", tick_time_ms, heap_mb, self.log_path(name),
                pid_path=self.pid_path(name), cfg_path=os.path.join(self.run_dir, f"zoo-{n + 1}.cfg"),
                secure_port=secure_port + n if secure_port else 0, tls=tls, client_auth=client_auth,
                security=self.zk_security, server_id=n + 1, peers=peers, max_session_timeout_ms=max_session_timeout_ms))
        return self.zookeepers[0]

    def attach_zookeeper(self, server: ZooKeeperServer) -> None:
        """Run the bookies and brokers on a ZooKeeper started elsewhere (stop_all() leaves it running)."""
        self.zookeepers, self.owns_zookeeper = [server], False

    def start_zookeeper(self, port: int | None = None, *, host: str | None = None, tick_time_ms: int = 200,
                        heap_mb: int = 256, data_dir: str | None = None, count: int = 1,
                        timeout_s: float = ZOOKEEPER_READY_TIMEOUT_S, max_session_timeout_ms: int = 0
                        ) -> ZooKeeperServer:
        """Start ZooKeeper, every server of it (or adopt the live ones their pid files name), and wait until each
        serves. Returns the first server."""
        first = self.zookeeper_server(port, host=host, tick_time_ms=tick_time_ms, heap_mb=heap_mb,
                                      data_dir=data_dir, count=count, max_session_timeout_ms=max_session_timeout_ms)
        for server in self.zookeepers:
            if server.is_running():
                self.log(f"{server.name}: already running (pid {server.pid})")
                continue
            processes.remove_pid(server.pid_path)  # stale
            if _port_answers(server.host, server.port):
                raise ClusterError(f"{server.connect} is already in use by a process this cluster did not start "
                                   f"(no live pid in {server.pid_path}); stop it or set zookeeper.port")
            self._spawn_zookeeper(server)
        self.wait_zookeeper(timeout_s)
        return first

    def _spawn_zookeeper(self, server: ZooKeeperServer) -> None:
        with processes.interrupts_deferred():  # a Ctrl-C between the fork and the pid file orphans nothing
            pid = server.start()
        self.last_pids[server.name] = pid
        self.log(f"{server.name}: started pid {pid} on {server.connect} (log {server.log_path})")

    def wait_zookeeper(self, timeout_s: float = ZOOKEEPER_READY_TIMEOUT_S,
                       servers: Iterable[ZooKeeperServer] | None = None) -> float:
        """Wait until every server (or those given) serves; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        for server in (self.zookeepers if servers is None else list(servers)):
            try:
                waited = server.wait_ready(max(0.1, deadline - time.monotonic()))
            except ZooKeeperError as e:
                raise ClusterError(str(e)) from None
            self.log(f"{server.name}: ready ({waited:.2f}s)")
        return time.monotonic() - started

    def restart_zookeeper(self, down_s: float, timeout_s: float = ZOOKEEPER_READY_TIMEOUT_S) -> None:
        """Stop ZooKeeper, every server of it (SIGTERM by pid), keep it down `down_s`, start it again on the same
        ports and data."""
        for server in self.zookeepers:
            self.stop_zookeeper_server(server)
        time.sleep(down_s)  # the fault itself: ZooKeeper is away this long
        for server in self.zookeepers:
            self._spawn_zookeeper(server)
        self.wait_zookeeper(timeout_s)

    def stop_zookeeper_server(self, server: ZooKeeperServer, kill: bool = False) -> int | None:
        """Stop one server (SIGTERM, or SIGKILL with `kill`), by pid; returns the pid it had (None: not running)."""
        pid = server.pid
        if pid is None:
            return None
        stopped = (processes.kill9(pid, ZOOKEEPER_STOP_TIMEOUT_S, ZOOKEEPER_MAIN_CLASS) if kill
                   else server.stop(ZOOKEEPER_STOP_TIMEOUT_S))
        if not stopped:
            raise ClusterError(f"{server.name} (pid {pid}) did not stop")
        processes.remove_pid(server.pid_path)
        server.pid = None
        return pid

    def start_zookeeper_server(self, server: ZooKeeperServer, timeout_s: float | None = None) -> None:
        """Start one stopped server on its ports and data; with `timeout_s`, wait until it serves (in an ensemble:
        until it has joined a quorum)."""
        self._spawn_zookeeper(server)
        if timeout_s is not None:
            self.wait_zookeeper(timeout_s, [server])

    def zookeeper_leader(self) -> ZooKeeperServer | None:
        """The server that says it leads the ensemble (the standalone server standalone); None when none does."""
        for server in self.zookeepers:
            if server.pid is not None and server.mode() in ("leader", "standalone"):
                return server
        return None

    @property
    def zk_connect(self) -> str:
        """Where this cluster's clients connect (every server): the TLS ports when its security has TLS, else the
        plaintext ones."""
        secure = self.zk_security.tls is not None and self.zookeeper.secure_port
        return ",".join(z.secure_connect if secure else z.connect for z in self.zookeepers)

    @property
    def child_zk_connect(self) -> str:
        """The connect string the bookies and brokers get: every server's TLS port when there is one (they dial
        it with their own certificates), else its plaintext port."""
        return ",".join(z.secure_connect or z.connect for z in self.zookeepers)

    def kazoo(self, timeout_s: float = ZK_CONNECT_TIMEOUT_S):
        """A started kazoo client on this cluster's ZooKeeper (the caller stops it)."""
        quiet = logging.getLogger("bksim.local_cluster.kazoo")
        quiet.setLevel(logging.CRITICAL)
        client = new_client(self.zk_connect, self.zk_security, timeout=timeout_s, logger=quiet)
        try:
            client.start(timeout=2 * timeout_s)
        except Exception as e:
            _close(client)
            raise ClusterError(f"cannot connect to ZooKeeper at {self.zk_connect}: {e} "
                               f"(is it running? `bksim cluster up` starts it)") from None
        return client

    # -- bookies and brokers -----------------------------------------------------------------------------
    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if self.inherit_bksim_env or not k.startswith("BKSIM_")}
        env.update({"BKSIM_CLUSTER_RUN_DIR": self.run_dir, "BKSIM_ZOOKEEPER_HOST": self.zookeeper.host,
                    "BKSIM_ZOOKEEPER_PORT": str(self.zookeeper.port), "PYTHONUNBUFFERED": "1"})
        if len(self.zookeepers) > 1:  # an ensemble: every server (standalone, the port options above say it)
            env.update({"BKSIM_ZOOKEEPER_CONNECT": self.child_zk_connect,
                        "BKSIM_CLUSTER_ZOOKEEPERS": str(len(self.zookeepers))})
        if self.zookeeper.secure_port:
            env["BKSIM_ZOOKEEPER_SECURE_PORT"] = str(self.zookeeper.secure_port)
        if self.tls_dir:
            env.update({"BKSIM_SECURITY_TLS_ENABLED": "true",
                        "BKSIM_SECURITY_TLS_CA_FILE": os.path.join(self.tls_dir, certs.CA_FILE)})
        env.update(self.child_env)
        return env

    def tls_env(self, name: str, host: str, role: str) -> dict[str, str]:
        """With a tls_dir: process `name`'s certificate and key (made, naming `host` and carrying `role`, when
        absent) as BKSIM_SECURITY_TLS_CERT_FILE / _KEY_FILE; else {}."""
        if not self.tls_dir:
            return {}
        issued = certs.ensure(self.tls_dir, {name: ((host,), (role,))})[name]
        return {"BKSIM_SECURITY_TLS_CERT_FILE": issued.cert_file, "BKSIM_SECURITY_TLS_KEY_FILE": issued.key_file}

    def add_bookie(self, port: int | None = None, *, host: str | None = None, argv: list[str] | None = None,
                   env: Mapping[str, str | None] | None = None, name: str | None = None) -> Node:
        """Declare bookie-<i> (or `name`; not started): `port` None picks a free one; its id is host:port; its
        directory <run_dir>/<name>. `env` adds to or overrides its environment (None: unset that variable)."""
        name = name or f"bookie-{len(self.bookies) + 1}"
        host = host or self.host
        port = port or free_port(host)
        home = os.path.join(self.run_dir, name)
        node_env = self.base_env()
        node_env.update({"BKSIM_BOOKIE_HOST": host, "BKSIM_BOOKIE_PORT": str(port),
                         "BKSIM_BOOKIE_BOOKIE_ID": f"{host}:{port}",
                         "BKSIM_BOOKIE_JOURNAL_DIR": os.path.join(home, "journal"),
                         "BKSIM_BOOKIE_LEDGER_DIR": os.path.join(home, "ledgers")})
        node_env.update(self.tls_env(name, host, "bookie"))
        node = Node(name, "bookie", host, port, _overridden(node_env, env), self.log_path(name), self.pid_path(name),
                    argv or child_argv("bookie", self.config_path), home=home)
        self.bookies.append(node)
        return node

    def add_broker(self, port: int | None = None, *, host: str | None = None, argv: list[str] | None = None,
                   env: Mapping[str, str | None] | None = None, name: str | None = None) -> Node:
        """Declare broker-<i> (or `name`; not started): `port` None picks a free one; its id and address are
        host:port. `env` adds to or overrides its environment (None: unset that variable)."""
        name = name or f"broker-{len(self.brokers) + 1}"
        host = host or self.host
        port = port or free_port(host)
        node_env = self.base_env()
        node_env.update({"BKSIM_BROKER_HOST": host, "BKSIM_BROKER_PORT": str(port),
                         "BKSIM_BROKER_BROKER_ID": f"{host}:{port}"})
        node_env.update(self.tls_env(name, host, "broker"))
        node = Node(name, "broker", host, port, _overridden(node_env, env), self.log_path(name), self.pid_path(name),
                    argv or child_argv("broker", self.config_path))
        self.brokers.append(node)
        return node

    def command(self, node: Node) -> list[str]:
        """The argv a spawn of `node` runs (a subclass may wrap it)."""
        return list(node.argv)

    def adopt_running(self, node: Node) -> bool:
        """Take over the live process `node`'s pid file names (True); or remove a stale pid file (False)."""
        pid = processes.read_pid(node.pid_path)
        if processes.is_alive(pid, CHILD_MARKER):
            node.pid, node.spawned_ms = pid, None
            self.log(f"{node.name}: already running (pid {pid}) as {node.node_id}")
            return True
        processes.remove_pid(node.pid_path)
        return False

    def spawn(self, node: Node) -> int:
        """Start `node`'s process (same port, id and directories on every incarnation); does not wait."""
        if node.alive():
            raise ClusterError(f"{node.name} is already running (pid {node.pid})")
        if node.home:
            os.makedirs(node.home, exist_ok=True)
        argv = self.command(node)
        with processes.interrupts_deferred():  # a Ctrl-C between the fork and `node.pid = ...` would orphan it
            node.spawned_ms = int(time.time() * 1000)
            node.pid = processes.spawn(argv, node.env, node.log_path, node.pid_path, cwd=self.cwd)
        self.last_pids[node.name] = node.pid
        node.paused = False
        node.incarnations += 1
        self.log(f"{node.name}: started pid {node.pid} as {node.node_id} (log {node.log_path})")
        return node.pid

    def start(self, nodes: Iterable[Node], timeout_s: float = READY_TIMEOUT_S, serving: bool = False,
              timeout_hint: str = "") -> dict[str, float]:
        """Spawn every node whose pid file names no live process (a live one is adopted), then wait_ready()."""
        nodes = list(nodes)
        for node in nodes:
            if not self.adopt_running(node):
                self.spawn(node)
        return self.wait_ready(nodes, timeout_s, serving=serving, timeout_hint=timeout_hint)

    # -- readiness ---------------------------------------------------------------------------------------
    def registration(self, client, node: Node) -> dict | None:
        """`node`'s registration in ZooKeeper (its data, plus "read_only" and the node's "ctime") or None."""
        return registration_doc(client, node.kind, node.node_id)

    def registered_now(self, doc: dict | None, node: Node) -> bool:
        """True when `doc` is the registration of `node`'s current incarnation."""
        if doc is None:
            return False
        if "pid" in doc:
            return doc["pid"] == node.pid
        # ZooKeeper runs on this machine: its ctime and our wall clock are the same clock, and a successor starts
        # (a Python process: tens of ms) well after the spawn, while its predecessor registered before it
        return node.spawned_ms is None or doc["ctime"] > node.spawned_ms

    def wait_ready(self, nodes: Iterable[Node], timeout_s: float = READY_TIMEOUT_S, serving: bool = False,
                   timeout_hint: str = "") -> dict[str, float]:
        """Wait until every node's current incarnation is registered (and, with `serving`, every broker
        answers health SERVING); the seconds each waited. Fails at once when one exits, and at the deadline,
        with the log tail of that node; ZooKeeper away for a moment counts as "not yet"."""
        from bksim.adapters.broker_client import BrokerCallError, SyncBrokerClient

        started = time.monotonic()
        deadline = started + timeout_s
        pending = list(nodes)
        waited: dict[str, float] = {}
        last: dict[str, str] = {}
        client = None
        try:
            while pending:
                for node in list(pending):
                    doc = None
                    try:
                        if client is None:
                            client = self.kazoo()
                        doc = self.registration(client, node)
                    except Exception:  # noqa: BLE001 - ZooKeeper away for a moment: ask again until the deadline
                        if client is not None:
                            _close(client)
                        client = None
                    if self.registered_now(doc, node):
                        if node.kind == "broker" and serving:
                            with SyncBrokerClient(node.address, deadline_s=HEALTH_DEADLINE_S,
                                                  tls=self.tls) as broker:
                                try:
                                    last[node.name] = broker.health()
                                except BrokerCallError as e:
                                    last[node.name] = str(e)
                            ready = last[node.name] == "SERVING"
                        else:
                            ready = True
                        if ready:
                            waited[node.name] = time.monotonic() - started
                            self.log(f"{node.name}: registered "
                                     f"{'and SERVING' if node.kind == 'broker' and serving else _state(doc)} "
                                     f"({waited[node.name]:.2f}s)")
                            pending.remove(node)
                            continue
                    if not node.alive():
                        what = ("registering in ZooKeeper" if node.kind == "bookie" else
                                f"it was registered{' and serving' if serving else ''}")
                        raise ClusterError(f"{node.name} (pid {node.pid}) exited before {what}; log "
                                           f"{node.log_path}:\n{node.log_tail(40)}")
                if pending and time.monotonic() >= deadline:
                    node = pending[0]
                    hint = f" ({timeout_hint})" if timeout_hint else ""
                    health = last.get(node.name)
                    state = f"health {health}" if health else "not registered"
                    raise ClusterError(f"{node.name} (pid {node.pid}) not ready within {timeout_s:.1f}s{hint}: "
                                       f"{state}; log {node.log_path}:\n{node.log_tail(40)}")
                if pending:
                    time.sleep(POLL_S)
        finally:
            if client is not None:
                _close(client)
        return waited

    def wait_registration(self, node: Node, wanted: Callable[[dict | None], bool], timeout_s: float) -> float | None:
        """Wait until `wanted(registration doc or None)` holds for `node`; the seconds waited, or None at the
        deadline (ZooKeeper hiccups count as "not yet")."""
        started = time.monotonic()
        deadline = started + timeout_s
        client = self.kazoo()
        try:
            while True:
                try:
                    if wanted(self.registration(client, node)):
                        return time.monotonic() - started
                except Exception:  # noqa: BLE001 - ZooKeeper away for a moment: ask again until the deadline
                    pass
                if time.monotonic() >= deadline:
                    return None
                time.sleep(POLL_S)
        finally:
            _close(client)

    # -- faults and stopping -----------------------------------------------------------------------------
    def kill9(self, node: Node) -> None:
        """SIGKILL `node` by pid; it is down on purpose afterwards (check_processes() does not report it)."""
        node.paused = False  # a stopped process dies of SIGKILL too; it just is no longer paused
        if not processes.kill9(node.pid, 10.0):
            raise ClusterError(f"{node.name} (pid {node.pid}) survived SIGKILL for 10 s")
        processes.remove_pid(node.pid_path)
        node.pid = None

    def pause(self, node: Node) -> None:
        if not node.alive():
            raise ClusterError(f"cannot pause {node.name}: not running")
        os.kill(node.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, node: Node) -> None:
        if node.pid is not None and processes.is_alive(node.pid):
            os.kill(node.pid, signal.SIGCONT)
        node.paused = False

    def stop(self, node: Node, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop one node (SIGTERM, bounded wait, SIGKILL); True when it is gone."""
        if node.paused:
            self.resume(node)
        failures = stop_pids([(node.name, node.pid, node.pid_path)], None, grace_s, self.log)
        if failures:
            return False
        node.pid = None
        return True

    def stop_all(self, bookie_grace_s: float = STOP_GRACE_S, broker_grace_s: float = STOP_GRACE_S) -> list[str]:
        """Resume what is paused, then stop the brokers, the bookies and ZooKeeper (each group at once,
        bounded, by pid), even after a failure. Returns what would not stop."""
        failures = []
        for group, grace_s in ((self.brokers, broker_grace_s), (self.bookies, bookie_grace_s)):
            for node in group:
                if node.paused:
                    self.resume(node)
            running = [n for n in group if n.pid is not None]
            failures += stop_pids([(n.name, n.pid, n.pid_path) for n in running], None, grace_s, self.log)
            for node in running:
                if not node.alive():
                    node.pid = None
        if self.owns_zookeeper:
            for server in self.zookeepers:
                pid = server.pid
                if pid is None:
                    continue
                if server.stop(ZOOKEEPER_STOP_TIMEOUT_S):
                    self.log(f"{server.name}: stopped pid {pid}")
                else:
                    failures.append(f"{server.name} pid {pid}")
        return failures

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    # -- observation -------------------------------------------------------------------------------------
    def check_processes(self) -> list[str]:
        """Processes that should run and do not (a crash nobody caused on purpose)."""
        return [f"{n.name} (pid {n.pid}) exited:\n{n.log_tail(20)}" for n in self.nodes
                if n.pid is not None and not n.alive()]

    def logs(self, lines: int = 15) -> str:
        return "\n".join(f"--- {n.name} (pid {n.pid}) ---\n{n.log_tail(lines)}" for n in self.nodes)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by ZooKeeper and every running bookie and broker, by name."""
        out = {n.name: n.cpu_s() for n in self.nodes if n.pid is not None}
        for server in self.zookeepers:
            if server.pid is not None:
                out[server.name] = processes.cpu_seconds(server.pid)
        return out


def registration_doc(client, kind: str, node_id: str) -> dict | None:
    """The registration of bookie or broker `node_id` in ZooKeeper: its data (a dict; {} when not JSON), plus
    "read_only" (a bookie under available/readonly) and "ctime" (the node's creation, ms); None when absent."""
    from kazoo.exceptions import NoNodeError

    from bksim.adapters import registration
    from bksim.metadata.paths import broker_path

    paths = ([(registration.registration_path(node_id, False), False),
              (registration.registration_path(node_id, True), True)]
             if kind == "bookie" else [(broker_path(node_id), False)])
    for path, read_only in paths:
        try:
            data, stat = client.get(path)
        except NoNodeError:
            continue
        try:
            doc = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError):
            doc = None
        doc = dict(doc) if isinstance(doc, dict) else {}
        doc.update(read_only=read_only, ctime=stat.ctime)
        return doc
    return None


# -- a run directory's pid files (for `bksim cluster down|status`) -----------------------------------------
def pid_files(run_dir: str, kind: str) -> list[str]:
    """Every `<kind>-<i>.pid` file under `<run_dir>/pids`, by i (not only 1..count: the count may change)."""
    def index(path: str) -> int:
        m = re.search(rf"{kind}-(\d+)\.pid$", path)
        return int(m.group(1)) if m else 0
    return sorted(glob.glob(os.path.join(run_dir, "pids", f"{kind}-*.pid")), key=index)


def stop_pids(targets: list[tuple[str, int | None, str | None]], marker: str | None, wait_s: float,
              log: Callable[[str], None] = lambda line: None) -> list[str]:
    """SIGTERM every live (name, pid, pid file) at once, wait up to `wait_s` in all, SIGKILL stragglers; pid
    files of stopped (or already dead) processes are removed. With `marker`, only a process whose command line
    contains it is signalled. Returns what would not stop."""
    running: list[tuple[str, int, str | None]] = []
    for name, pid, pid_path in targets:
        if pid is not None and processes.terminate(pid, marker):
            running.append((name, pid, pid_path))
        else:
            if pid_path:
                processes.remove_pid(pid_path)
            log(f"{name}: pid {pid} not running (stale pid file removed)")
    deadline = time.monotonic() + wait_s
    failures = []
    for name, pid, pid_path in running:
        if processes.wait_exit(pid, max(0.0, deadline - time.monotonic())):
            log(f"{name}: stopped pid {pid}")
        elif processes.kill9(pid, KILL_WAIT_S, marker):
            log(f"{name}: pid {pid} did not stop on SIGTERM in time; killed (SIGKILL)")
        else:
            failures.append(f"{name} pid {pid}")
            continue
        if pid_path:
            processes.remove_pid(pid_path)
    return failures


def stop_pid_files(paths: list[str], wait_s: float, log: Callable[[str], None] = lambda line: None) -> list[str]:
    """stop_pids() for the processes pid files name (only bksim children are signalled)."""
    return stop_pids([(os.path.basename(p)[: -len(".pid")], processes.read_pid(p), p) for p in paths],
                     CHILD_MARKER, wait_s, log)


def stop_zookeeper_pid_file(server: ZooKeeperServer, log: Callable[[str], None] = lambda line: None) -> list[str]:
    """Stop the ZooKeeper server a pid file names (removing a stale file); returns what would not stop."""
    name = server.name
    pid = processes.read_pid(server.pid_path)
    if pid is None:
        log(f"{name}: no pid file")
    elif not processes.is_alive(pid, ZOOKEEPER_MAIN_CLASS):
        processes.remove_pid(server.pid_path)
        log(f"{name}: pid {pid} not running (stale pid file removed)")
    elif server.stop(ZOOKEEPER_STOP_TIMEOUT_S):
        log(f"{name}: stopped pid {pid}")
    else:
        return [f"{name} pid {pid}"]
    return []


def _overridden(env: dict[str, str], overrides: Mapping[str, str | None] | None) -> dict[str, str]:
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _state(doc: dict) -> str:
    return "read-only" if doc.get("read_only") else "writable"


def _port_answers(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _close(client) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: BLE001 - closing a client whose server is gone
        pass
