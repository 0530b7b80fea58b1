"""ChaosCluster: one run's ZooKeeper, bookies and brokers (adapters.local_cluster.LocalCluster) plus what the
chaos runs add to it.

ZooKeeper is one server, or an ensemble of `ClusterSpec.zookeepers` (the ZooKeeper scenarios kill one server,
the leader, or a majority).

The cluster is the launcher's: processes by pid under `run_dir`, free loopback ports picked once at start (a
restarted process comes back on the same port, with the same id and directories, so it is the same bookie or
broker), children with BKSIM_ overrides only and cwd = run_dir (so no deploy/bksim.toml is read unless a config
file is given), kill -9, SIGSTOP/SIGCONT, restart, ZooKeeper restart. Added here: one proxy.TcpProxy per broker and ZooKeeper
server between them (the broker's connect string names its proxies), so a broker can be cut off from ZooKeeper,
and, optionally, per ClusterSpec:
- `bookie_links`: every broker->bookie link goes through its own proxy (`links[(broker, bookie)]`; the broker
  dials it through broker.bookie_address_overrides), so the network scenarios can blackhole, delay or
  one-way-drop one link while the rest of the cluster works.
- `security` (SecurityKit, `bksim chaos run --secure`): TLS on every gRPC link (a certificate per process), token
  authentication and authorization at the brokers, ZooKeeper digest ACLs; `credentials` is what the run's own
  clients present (the client certificate and the super-user's token).
- `small_ledger_disk`: {bookie name: MiB}: that bookie runs in a private mount namespace (`unshare --mount`)
  with a tmpfs of that size on its ledger directory, so the disk-full scenario fills a real file system (through
  /proc/<pid>/root) without touching this machine's disks or mount table; the tmpfs lives as long as the
  process (a restart would find the directory wiped, so this bookie is not restarted).

Invariants: `stop_all()` resumes paused processes and stops everything (brokers, bookies, ZooKeeper, proxies)
even after a failure; every wait has a deadline and fails with the log tail of the process it waited for.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from bksim.adapters.local_cluster import HOST, ClusterError, LocalCluster, Node
from bksim.chaos.credentials import Credentials
from bksim.chaos.proxy import TcpProxy
from bksim.security.kit import SecurityKit

__all__ = ["ChaosCluster", "ClusterError", "ClusterSpec", "Node"]

ZOOKEEPER_READY_TIMEOUT_S = 60.0
REGISTER_TIMEOUT_S = 60.0  # a (re)started bookie or broker registers within this (it may wait for a session)
STOP_GRACE_S = 10.0


@dataclass
class ClusterSpec:
    bookies: int = 3
    brokers: int = 2
    zookeepers: int = 1  # ZooKeeper servers: 1 standalone, 3 an ensemble
    tick_time_ms: int = 200
    session_timeout_ms: int = 2000
    zookeeper_heap_mb: int = 256
    child_env: dict[str, str] = field(default_factory=dict)  # BKSIM_ overrides for every bookie and broker
    config_path: str | None = None
    bookie_links: bool = False  # route every broker->bookie link through its own TcpProxy
    small_ledger_disk: dict[str, int] = field(default_factory=dict)  # bookie name -> tmpfs MiB on its ledger dir
    security: SecurityKit | None = None  # TLS, tokens + authorization, ZooKeeper digest ACLs (`--secure`)


class ChaosCluster(LocalCluster):
    """Use as a context manager: `__enter__` starts and waits for everything; `__exit__` stops it all."""

    def __init__(self, run_dir: str, spec: ClusterSpec, log=print) -> None:
        kit = spec.security
        super().__init__(run_dir, host=HOST, config_path=spec.config_path,
                         child_env={"BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(spec.session_timeout_ms),
                                    **(kit.child_env() if kit else {}), **spec.child_env},
                         inherit_bksim_env=False, cwd=os.path.abspath(run_dir),
                         tls_dir=kit.tls_dir if kit and kit.tls_dir else None)
        self.spec = spec
        # what the run's own clients (workload, checks, actions) present: client certificate and super-user token
        self.credentials = Credentials(self.tls, kit.token() if kit else None)
        self.report = log  # the run's own lines ("# ... did not stop"); the launcher's progress is not printed
        self.proxies: dict[str, list[TcpProxy]] = {}  # broker name -> its proxy to each ZooKeeper server
        self.links: dict[tuple[str, str], TcpProxy] = {}  # (broker name, bookie name) -> proxy of that link

    # -- life cycle ------------------------------------------------------------------------------------------
    def __enter__(self) -> "ChaosCluster":
        try:
            self.start_all()
        except BaseException:
            self.stop_all()
            raise
        return self

    def start_all(self) -> None:
        spec = self.spec
        self.start_zookeeper(tick_time_ms=spec.tick_time_ms, heap_mb=spec.zookeeper_heap_mb, count=spec.zookeepers,
                             timeout_s=ZOOKEEPER_READY_TIMEOUT_S)
        for _ in range(spec.bookies):
            self.add_bookie()
        for i in range(1, spec.brokers + 1):
            name = f"broker-{i}"
            proxies = self.proxies[name] = [TcpProxy(server.port, HOST) for server in self.zookeepers]
            env = {"BKSIM_ZOOKEEPER_CONNECT": ",".join(p.address for p in proxies)}
            if spec.bookie_links:
                for bookie in self.bookies:
                    self.links[(name, bookie.name)] = TcpProxy(bookie.port, HOST)
                env["BKSIM_BROKER_BOOKIE_ADDRESS_OVERRIDES"] = ",".join(
                    f"{b.node_id}={self.links[(name, b.name)].address}" for b in self.bookies)
            self.add_broker(env=env)
        for node in self.bookies:
            self.spawn(node)
        self.wait_ready(self.bookies, REGISTER_TIMEOUT_S)
        for node in self.brokers:
            self.spawn(node)
        self.wait_ready(self.brokers, REGISTER_TIMEOUT_S)

    def stop_all(self, bookie_grace_s: float = STOP_GRACE_S, broker_grace_s: float = STOP_GRACE_S) -> list[str]:
        """Resume what is paused, then stop brokers, bookies, ZooKeeper and the proxies (bounded, by pid)."""
        failures = super().stop_all(bookie_grace_s, broker_grace_s)
        for failure in failures:
            self.report(f"# {failure} did not stop")
        for proxy in [p for proxies in self.proxies.values() for p in proxies] + list(self.links.values()):
            proxy.close()
        self.proxies.clear()
        self.links.clear()
        return failures

    # -- one node --------------------------------------------------------------------------------------------
    def command(self, node: Node) -> list[str]:
        argv = super().command(node)
        size_mb = self.spec.small_ledger_disk.get(node.name)
        if size_mb is None:
            return argv
        if node.incarnations:
            raise ClusterError(f"{node.name} has its ledger directory on a tmpfs that died with it: not restarted")
        # the same pid all the way (unshare and sh exec), so registration and signals see the bookie itself
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mkdir -p "$0" && mount -t tmpfs -o size={int(size_mb)}m bksim-chaos "$0" && exec "$@"',
                node.ledger_dir] + argv

    def restart(self, node: Node, wait: bool = True) -> None:
        """Start `node` again (same port, id and directories) and wait for its registration."""
        self.spawn(node)
        if wait:
            self.wait_registered(node)

    def wait_registered(self, node: Node, timeout_s: float = REGISTER_TIMEOUT_S) -> float:
        """Wait until `node`'s current incarnation (its pid) is registered; returns the seconds waited."""
        return self.wait_ready([node], timeout_s)[node.name]

    def ledger_dir_seen_by(self, node: Node) -> str:
        """The node's ledger directory as its own mount namespace sees it (its tmpfs, if it has one)."""
        path = node.ledger_dir
        return f"/proc/{node.pid}/root{path}" if node.name in self.spec.small_ledger_disk else path

    def bookie_links(self, bookie: Node) -> list[TcpProxy]:
        return [proxy for (_, name), proxy in sorted(self.links.items()) if name == bookie.name]

    def live_broker_addresses(self) -> list[str]:
        return [b.address for b in self.brokers if b.alive() and not b.paused]

    def journal_dirs(self) -> list[str]:
        return [b.journal_dir for b in self.bookies]

    def ledger_dirs(self) -> list[str]:
        return [b.ledger_dir for b in self.bookies]
