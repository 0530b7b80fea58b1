"""ChaosCluster: one run's ZooKeeper, bookies and brokers as child processes, and the faults done to them.

Owns: the run's process layout under `run_dir` (zookeeper/, bookie-<i>/{journal,ledgers}, logs/<name>.log),
the free loopback ports picked once at start (a restarted process comes back on the same port, with the same
id and directories, so it is the same bookie or broker), the environment each child gets (BKSIM_ overrides
only, cwd = run_dir so no deploy/bksim.toml is read unless a config file is given), and the faults: kill -9,
SIGSTOP/SIGCONT, restart, ZooKeeper restart, and (through proxy.TcpProxy, one per broker) cutting a broker
off from ZooKeeper.

Optional, per ClusterSpec:
- `bookie_links`: every broker->bookie link goes through its own proxy (`links[(broker, bookie)]`; the broker
  dials it through broker.bookie_address_overrides), so the network scenarios can blackhole, delay or
  one-way-drop one link while the rest of the cluster works.
- `small_ledger_disk`: {bookie name: MiB}: that bookie runs in a private mount namespace (`unshare --mount`)
  with a tmpfs of that size on its ledger directory, so the disk-full scenario fills a real file system (through
  /proc/<pid>/root) without touching this machine's disks or mount table; the tmpfs lives as long as the
  process (a restart would find the directory wiped, so this bookie is not restarted).

Invariants: every process is signalled by the pid this cluster spawned, never by name; `stop_all()` resumes
paused processes and stops everything (brokers, bookies, ZooKeeper, proxies) even after a failure; every
wait has a deadline and fails with the log tail of the process it waited for.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from kazoo.client import KazooClient

from bksim.adapters import processes
from bksim.adapters.ports import free_port
from bksim.adapters.zookeeper_server import ZooKeeperServer
from bksim.chaos.proxy import TcpProxy

HOST = "127.0.0.1"
ZOOKEEPER_READY_TIMEOUT_S = 60.0
REGISTER_TIMEOUT_S = 60.0  # a (re)started bookie or broker registers within this (it may wait for a session)
STOP_GRACE_S = 10.0
POLL_S = 0.05
BOOKIE_MARKER = "bksim.cli.main bookie run"
BROKER_MARKER = "bksim.cli.main broker run"


class ClusterError(RuntimeError):
    """A process of the chaos cluster could not be started, did not become ready, or exited."""


@dataclass
class Node:
    """One bookie or broker: fixed name, port, id and directories; the pid of its current incarnation."""
    name: str  # bookie-1, broker-2
    kind: str  # "bookie" | "broker"
    port: int
    env: dict[str, str]
    log_path: str
    pid: int | None = None
    paused: bool = False
    home: str = ""
    incarnations: int = 0
    torn_pending: bool = False  # its journal tail was torn while it was down: replay must report it

    @property
    def node_id(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def address(self) -> str:
        return self.node_id

    @property
    def marker(self) -> str:
        return BOOKIE_MARKER if self.kind == "bookie" else BROKER_MARKER

    def alive(self) -> bool:
        # our own child (not reaped until we wait for it, so the pid cannot be reused): no command-line check,
        # which would fail between fork and exec, when the child still shows this process's command line
        return processes.is_alive(self.pid)


@dataclass
class ClusterSpec:
    bookies: int = 3
    brokers: int = 2
    tick_time_ms: int = 200
    session_timeout_ms: int = 2000
    zookeeper_heap_mb: int = 256
    child_env: dict[str, str] = field(default_factory=dict)  # BKSIM_ overrides for every bookie and broker
    config_path: str | None = None
    bookie_links: bool = False  # route every broker->bookie link through its own TcpProxy
    small_ledger_disk: dict[str, int] = field(default_factory=dict)  # bookie name -> tmpfs MiB on its ledger dir


class ChaosCluster:
    """Use as a context manager: `__enter__` starts and waits for everything; `__exit__` stops it all."""

    def __init__(self, run_dir: str, spec: ClusterSpec, log=print) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.spec = spec
        self.log = log
        self.zookeeper: ZooKeeperServer | None = None
        self.bookies: list[Node] = []
        self.brokers: list[Node] = []
        self.proxies: dict[str, TcpProxy] = {}  # broker name -> its proxy to ZooKeeper
        self.links: dict[tuple[str, str], TcpProxy] = {}  # (broker name, bookie name) -> proxy of that link
        self._argv = [sys.executable, "-m", "bksim.cli.main"] + (
            ["--config", spec.config_path] if spec.config_path else [])

    # -- life cycle ------------------------------------------------------------------------------------------
    def __enter__(self) -> "ChaosCluster":
        try:
            self.start()
        except BaseException:
            self.stop_all()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def start(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "logs"), exist_ok=True)
        spec = self.spec
        self.zookeeper = ZooKeeperServer(HOST, free_port(), os.path.join(self.run_dir, "zookeeper"),
                                         spec.tick_time_ms, spec.zookeeper_heap_mb,
                                         os.path.join(self.run_dir, "logs", "zookeeper.log"))
        self.zookeeper.start()
        self.zookeeper.wait_ready(ZOOKEEPER_READY_TIMEOUT_S)
        base = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
        base.update({"BKSIM_CLUSTER_RUN_DIR": self.run_dir, "BKSIM_ZOOKEEPER_HOST": HOST,
                     "BKSIM_ZOOKEEPER_PORT": str(self.zookeeper.port),
                     "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(spec.session_timeout_ms),
                     "PYTHONUNBUFFERED": "1"})
        base.update(spec.child_env)
        for i in range(1, spec.bookies + 1):
            port = free_port()
            home = os.path.join(self.run_dir, f"bookie-{i}")
            env = dict(base, BKSIM_BOOKIE_HOST=HOST, BKSIM_BOOKIE_PORT=str(port),
                       BKSIM_BOOKIE_BOOKIE_ID=f"{HOST}:{port}",
                       BKSIM_BOOKIE_JOURNAL_DIR=os.path.join(home, "journal"),
                       BKSIM_BOOKIE_LEDGER_DIR=os.path.join(home, "ledgers"))
            self.bookies.append(Node(f"bookie-{i}", "bookie", port, env,
                                     os.path.join(self.run_dir, "logs", f"bookie-{i}.log"), home=home))
        for i in range(1, spec.brokers + 1):
            port = free_port()
            name = f"broker-{i}"
            proxy = TcpProxy(self.zookeeper.port, HOST)
            self.proxies[name] = proxy
            env = dict(base, BKSIM_BROKER_HOST=HOST, BKSIM_BROKER_PORT=str(port),
                       BKSIM_BROKER_BROKER_ID=f"{HOST}:{port}", BKSIM_ZOOKEEPER_PORT=str(proxy.port))
            if spec.bookie_links:
                for bookie in self.bookies:
                    self.links[(name, bookie.name)] = TcpProxy(bookie.port, HOST)
                env["BKSIM_BROKER_BOOKIE_ADDRESS_OVERRIDES"] = ",".join(
                    f"{b.node_id}={self.links[(name, b.name)].address}" for b in self.bookies)
            self.brokers.append(Node(name, "broker", port, env, os.path.join(self.run_dir, "logs", f"{name}.log")))
        for node in self.bookies:
            self.spawn(node)
        for node in self.bookies:
            self.wait_registered(node)
        for node in self.brokers:
            self.spawn(node)
        for node in self.brokers:
            self.wait_registered(node)

    def stop_all(self) -> None:
        """Resume what is paused, then stop brokers, bookies, ZooKeeper and the proxies (bounded, by pid)."""
        for node in self.brokers + self.bookies:
            if node.paused:
                self.resume(node)
        for node in self.brokers + self.bookies:
            if node.pid is not None and not processes.stop(node.pid, STOP_GRACE_S):
                self.log(f"# {node.name} (pid {node.pid}) did not stop")
            node.pid = None
        self.stop_zookeeper_only()
        for proxy in list(self.proxies.values()) + list(self.links.values()):
            proxy.close()
        self.proxies.clear()
        self.links.clear()

    def stop_zookeeper_only(self) -> None:
        if self.zookeeper is not None and self.zookeeper.pid is not None:
            if not self.zookeeper.stop(STOP_GRACE_S):
                self.log(f"# zookeeper (pid {self.zookeeper.pid}) did not stop")

    # -- one node --------------------------------------------------------------------------------------------
    def node(self, name: str) -> Node:
        for node in self.bookies + self.brokers:
            if node.name == name:
                return node
        raise KeyError(f"no process named {name!r} in this cluster")

    def spawn(self, node: Node) -> int:
        if node.alive():
            raise ClusterError(f"{node.name} is already running (pid {node.pid})")
        argv = self._argv + [node.kind, "run"]
        size_mb = self.spec.small_ledger_disk.get(node.name)
        if size_mb is not None:
            if node.incarnations:
                raise ClusterError(f"{node.name} has its ledger directory on a tmpfs that died with it: not restarted")
            # the same pid all the way (unshare and sh exec), so registration and signals see the bookie itself
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f'mkdir -p "$0" && mount -t tmpfs -o size={int(size_mb)}m bksim-chaos "$0" && exec "$@"',
                    node.env["BKSIM_BOOKIE_LEDGER_DIR"]] + argv
        node.pid = processes.spawn(argv, node.env, node.log_path, cwd=self.run_dir)
        node.paused = False
        node.incarnations += 1
        return node.pid

    def kill9(self, node: Node) -> None:
        if node.paused:  # a stopped process dies of SIGKILL too; it just is no longer paused
            node.paused = False
        if not processes.kill9(node.pid, 10.0):
            raise ClusterError(f"{node.name} (pid {node.pid}) survived SIGKILL for 10 s")
        node.pid = None  # down on purpose: check_processes() does not report it

    def pause(self, node: Node) -> None:
        if not node.alive():
            raise ClusterError(f"cannot pause {node.name}: not running")
        os.kill(node.pid, signal.SIGSTOP)
        node.paused = True

    def resume(self, node: Node) -> None:
        if node.pid is not None and processes.is_alive(node.pid):
            os.kill(node.pid, signal.SIGCONT)
        node.paused = False

    def restart(self, node: Node, wait: bool = True) -> None:
        """Start `node` again (same port, id and directories) and wait for its registration."""
        self.spawn(node)
        if wait:
            self.wait_registered(node)

    def restart_zookeeper(self, down_s: float) -> None:
        """Stop ZooKeeper (SIGTERM by pid), keep it down `down_s`, start it on the same port and data."""
        assert self.zookeeper is not None
        if not self.zookeeper.stop(STOP_GRACE_S):
            raise ClusterError(f"zookeeper (pid {self.zookeeper.pid}) did not stop")
        time.sleep(down_s)  # the fault itself: ZooKeeper is away this long
        self.zookeeper.start()
        self.zookeeper.wait_ready(ZOOKEEPER_READY_TIMEOUT_S)

    # -- readiness -------------------------------------------------------------------------------------------
    def kazoo(self) -> KazooClient:
        quiet = logging.getLogger("bksim.chaos.kazoo")
        quiet.setLevel(logging.CRITICAL)
        client = KazooClient(hosts=self.zookeeper.connect, timeout=5.0, logger=quiet)
        client.start(timeout=10.0)
        return client

    def registration(self, client: KazooClient, node: Node) -> dict | None:
        paths = ([f"/ledgers/available/{node.node_id}", f"/ledgers/available/readonly/{node.node_id}"]
                 if node.kind == "bookie" else [f"/brokers/available/{node.node_id}"])
        for path in paths:
            try:
                data, _ = client.get(path)
            except Exception:  # NoNodeError, or a connection hiccup: not registered (yet)
                continue
            try:
                doc = json.loads(data.decode())
            except ValueError:
                continue
            doc["read_only"] = "/readonly/" in path
            return doc
        return None

    def wait_registered(self, node: Node, timeout_s: float = REGISTER_TIMEOUT_S) -> float:
        """Wait until `node`'s current incarnation (its pid) is registered; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        client = None
        try:
            while True:
                if not node.alive():
                    raise ClusterError(f"{node.name} (pid {node.pid}) exited before registering; log "
                                       f"{node.log_path}:\n{processes.tail(node.log_path, 30)}")
                try:
                    if client is None:
                        client = self.kazoo()
                    doc = self.registration(client, node)
                    if doc is not None and doc.get("pid") == node.pid:
                        return time.monotonic() - started
                except Exception:  # ZooKeeper away for a moment: try again until the deadline
                    if client is not None:
                        _close(client)
                    client = None
                if time.monotonic() >= deadline:
                    raise ClusterError(f"{node.name} (pid {node.pid}) not registered within {timeout_s:.0f} s; log "
                                       f"{node.log_path}:\n{processes.tail(node.log_path, 30)}")
                time.sleep(POLL_S)
        finally:
            if client is not None:
                _close(client)

    def ledger_dir_seen_by(self, node: Node) -> str:
        """The node's ledger directory as its own mount namespace sees it (its tmpfs, if it has one)."""
        path = node.env["BKSIM_BOOKIE_LEDGER_DIR"]
        return f"/proc/{node.pid}/root{path}" if node.name in self.spec.small_ledger_disk else path

    def bookie_links(self, bookie: Node) -> list[TcpProxy]:
        return [proxy for (_, name), proxy in sorted(self.links.items()) if name == bookie.name]

    def wait_registration(self, node: Node, wanted, timeout_s: float) -> float | None:
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

    def live_broker_addresses(self) -> list[str]:
        return [b.address for b in self.brokers if b.alive() and not b.paused]

    def journal_dirs(self) -> list[str]:
        return [os.path.join(b.home, "journal") for b in self.bookies]

    def ledger_dirs(self) -> list[str]:
        return [os.path.join(b.home, "ledgers") for b in self.bookies]

    def check_processes(self) -> list[str]:
        """Processes that should run and do not (a crash the scenario did not cause)."""
        return [f"{n.name} (pid {n.pid}) exited:\n{processes.tail(n.log_path, 20)}"
                for n in self.bookies + self.brokers if n.pid is not None and not n.alive()]


def _close(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except Exception:
        pass
