"""`bksim cluster up|down|status|init`: a local cluster of real processes (ZooKeeper, N bookies, M brokers).

Owns the run directory layout:

    <run_dir>/zoo.cfg                  written by ZooKeeperServer.start()
    <run_dir>/zookeeper/               ZooKeeper data (unless zookeeper.data_dir is set)
    <run_dir>/bookie-<i>/journal       bookie i's journal directory
    <run_dir>/bookie-<i>/ledgers       bookie i's entry logs and index
    <run_dir>/logs/<name>.log          stdout+stderr of each process (zookeeper, bookie-<i>, broker-<i>)
    <run_dir>/pids/<name>.pid          pid of each process (`down` and `status` use only these)

`up` is idempotent: a process whose pid file names a live process of the right kind is left running.
Bookie i listens on cluster.bookie_port_base + i - 1 and registers as <bookie.host>:<port>; broker i listens
on cluster.broker_port_base + i - 1 and registers as /brokers/available/<broker.host>:<port>. `up` starts
ZooKeeper, then the bookies, then the brokers, and returns once every bookie is registered (writable or
read-only) and every broker is registered and answers gRPC health SERVING, or fails with the tail of the log
of the first process that did not make it within cluster.start_timeout_ms (at once when it exits).
`down` stops in the reverse order: brokers (they close the ledgers they write, which needs the bookies),
bookies, ZooKeeper; each SIGTERM by pid, a bounded wait, then SIGKILL.
"""
from __future__ import annotations

import glob
import json
import os
import re
import socket
import sys
import time
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError

from bksim.adapters import processes
from bksim.adapters.zookeeper_server import MAIN_CLASS as ZOOKEEPER_MAIN_CLASS
from bksim.adapters.zookeeper_server import ZooKeeperError, ZooKeeperServer
from bksim.cli import config as loader
from bksim.model.config import Config
from bksim.model.errors import BksimError

BOOKIE_CMDLINE_MARK = "bksim.cli.main"  # every bookie started here runs `python -m bksim.cli.main ...`
BROKER_CMDLINE_MARK = "bksim.cli.main"  # and so does every broker
ZK_CONNECT_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.1
BOOKIE_KILL_GRACE_S = 5.0  # after bookie.shutdown_grace_ms: SIGKILL
BROKER_KILL_GRACE_S = 5.0  # after broker.shutdown_grace_ms: SIGKILL
HEALTH_DEADLINE_S = 1.0  # one gRPC health check of a starting broker
ZOOKEEPER_STOP_TIMEOUT_S = 10.0


class ClusterError(BksimError):
    """A cluster process did not start, did not become ready, or could not be stopped."""


@dataclass(frozen=True, slots=True)
class RunLayout:
    """Paths under the run directory (absolute)."""
    run_dir: str

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.run_dir, "logs")

    @property
    def pids_dir(self) -> str:
        return os.path.join(self.run_dir, "pids")

    def log(self, name: str) -> str:
        return os.path.join(self.logs_dir, f"{name}.log")

    def pid(self, name: str) -> str:
        return os.path.join(self.pids_dir, f"{name}.pid")

    def bookie_dir(self, index: int) -> str:
        return os.path.join(self.run_dir, f"bookie-{index}")


@dataclass(frozen=True, slots=True)
class BookieSlot:
    index: int  # 1-based
    port: int
    bookie_id: str

    @property
    def name(self) -> str:
        return f"bookie-{self.index}"


@dataclass(frozen=True, slots=True)
class BrokerSlot:
    index: int  # 1-based
    port: int
    broker_id: str  # <broker.host>:<port>, also its gRPC address

    @property
    def name(self) -> str:
        return f"broker-{self.index}"


def register(subparsers) -> None:
    parser = subparsers.add_parser("cluster", help="run a local cluster: ZooKeeper + bookies + brokers (processes)",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="start ZooKeeper, create the metadata layout, start cluster.bookies bookies "
                                   "and cluster.brokers brokers")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop the brokers, the bookies, then ZooKeeper (SIGTERM, bounded wait, "
                                       "SIGKILL)")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="processes (pid alive?) and ZooKeeper registrations")
    status.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    status.set_defaults(func=cmd_status)
    init = sub.add_parser("init", help="create /ledgers, available, readonly, cookies and INSTANCEID if absent")
    init.set_defaults(func=cmd_init)


# -- shared pieces -------------------------------------------------------------------------------------

def config_path(args) -> str | None:
    """The TOML file the configuration comes from (absolute), as cli.config.load resolves it."""
    path = getattr(args, "config", None) or os.environ.get(loader.CONFIG_ENV) or (
        loader.DEFAULT_FILE if os.path.exists(loader.DEFAULT_FILE) else None)
    return os.path.abspath(path) if path else None


def layout_of(config: Config) -> RunLayout:
    return RunLayout(os.path.abspath(config.cluster.run_dir))


def zookeeper_of(config: Config, layout: RunLayout) -> ZooKeeperServer:
    zk = config.zookeeper
    data_dir = os.path.abspath(zk.data_dir) if zk.data_dir else os.path.join(layout.run_dir, "zookeeper")
    return ZooKeeperServer(zk.host, zk.port, data_dir, zk.tick_time_ms, zk.heap_mb, layout.log("zookeeper"),
                           pid_path=layout.pid("zookeeper"), cfg_path=os.path.join(layout.run_dir, "zoo.cfg"))


def bookie_slots(config: Config) -> list[BookieSlot]:
    base, host = config.cluster.bookie_port_base, config.bookie.host
    return [BookieSlot(i, base + i - 1, f"{host}:{base + i - 1}") for i in range(1, config.cluster.bookies + 1)]


def broker_slots(config: Config) -> list[BrokerSlot]:
    base, host = config.cluster.broker_port_base, config.broker.host
    return [BrokerSlot(i, base + i - 1, f"{host}:{base + i - 1}") for i in range(1, config.cluster.brokers + 1)]


def connect_zookeeper(config: Config):
    from bksim.adapters import registration

    connect = f"{config.zookeeper.host}:{config.zookeeper.port}"
    try:
        return registration.connect(connect, config.zookeeper.session_timeout_ms, ZK_CONNECT_TIMEOUT_S)
    except registration.RegistrationError as e:
        raise ClusterError(f"{e} (is it running? `bksim cluster up` starts it)") from None


def _port_answers(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _say(message: str) -> None:
    print(message, flush=True)


# -- up ------------------------------------------------------------------------------------------------

def cmd_up(args) -> int:
    config = loader.load(getattr(args, "config", None))
    loader.print_effective(config, "cluster up")
    layout = layout_of(config)
    for path in (layout.run_dir, layout.logs_dir, layout.pids_dir):
        os.makedirs(path, exist_ok=True)
    timeout_s = config.cluster.start_timeout_ms / 1000.0

    start_zookeeper(config, layout, timeout_s)
    instance_id = init_metadata(config)
    _say(f"metadata ready: /ledgers (INSTANCEID {instance_id})")
    start_bookies(config, layout, config_path(args), timeout_s)
    start_brokers(config, layout, config_path(args), timeout_s)
    _say(f"cluster up: ZooKeeper {config.zookeeper.host}:{config.zookeeper.port}, "
         f"{config.cluster.bookies} bookie(s), {config.cluster.brokers} broker(s); run dir {layout.run_dir}")
    _say_endpoints(config, getattr(args, "config", None))
    return 0


def _say_endpoints(config: Config, explicit_config: str | None) -> None:
    _say("endpoints:")
    _say(f"  {'zookeeper':<10} {config.zookeeper.host}:{config.zookeeper.port}")
    for slot in bookie_slots(config):
        _say(f"  {slot.name:<10} {slot.bookie_id}")
    for slot in broker_slots(config):
        _say(f"  {slot.name:<10} {slot.broker_id}")
    suffix = f" --config {explicit_config}" if explicit_config else ""
    bookies = config.cluster.bookies
    if config.cluster.brokers and bookies:
        e = min(3, bookies)
        _say(f"try: bksim ledger create --ensemble {e} --write-quorum {e} --ack-quorum {min(2, e)}{suffix}   "
             f"(then `bksim ledger write ID --count 1000 --size 1024`, `bksim ledger read ID`)")
    elif bookies:
        _say(f"try: bksim bookie list{suffix}")


def start_zookeeper(config: Config, layout: RunLayout, timeout_s: float) -> ZooKeeperServer:
    server = zookeeper_of(config, layout)
    if server.is_running():
        _say(f"zookeeper: already running (pid {server.pid})")
    else:
        processes.remove_pid(server.pid_path)  # stale
        if _port_answers(server.host, server.port):
            raise ClusterError(f"{server.connect} is already in use by a process this cluster did not start "
                               f"(no live pid in {server.pid_path}); stop it or set zookeeper.port")
        pid = server.start()
        _say(f"zookeeper: started pid {pid} on {server.connect} (log {server.log_path})")
    try:
        waited = server.wait_ready(timeout_s)
    except ZooKeeperError as e:
        raise ClusterError(str(e)) from None
    _say(f"zookeeper: ready ({waited:.2f}s)")
    return server


def init_metadata(config: Config) -> str:
    """Create the BookKeeper layout in ZooKeeper if absent; return the cluster's INSTANCEID."""
    from bksim.adapters import registration

    client = connect_zookeeper(config)
    try:
        return registration.ensure_layout(client)
    finally:
        client.stop()
        client.close()


def bookie_env(config: Config, layout: RunLayout, slot: BookieSlot) -> dict[str, str]:
    env = dict(os.environ)
    bookie_dir = layout.bookie_dir(slot.index)
    env.update({
        "BKSIM_CLUSTER_RUN_DIR": layout.run_dir,
        "BKSIM_ZOOKEEPER_HOST": config.zookeeper.host,
        "BKSIM_ZOOKEEPER_PORT": str(config.zookeeper.port),
        "BKSIM_BOOKIE_PORT": str(slot.port),
        "BKSIM_BOOKIE_BOOKIE_ID": slot.bookie_id,
        "BKSIM_BOOKIE_JOURNAL_DIR": os.path.join(bookie_dir, "journal"),
        "BKSIM_BOOKIE_LEDGER_DIR": os.path.join(bookie_dir, "ledgers"),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def bookie_argv(config_file: str | None) -> list[str]:
    argv = [sys.executable, "-m", "bksim.cli.main"]
    if config_file:
        argv += ["--config", config_file]
    return argv + ["bookie", "run"]


def start_bookies(config: Config, layout: RunLayout, config_file: str | None, timeout_s: float) -> None:
    slots = bookie_slots(config)
    if not slots:
        return
    pids: dict[str, int] = {}
    spawned_ms: dict[str, int] = {}  # wall-clock ms at spawn, for bookies started now
    for slot in slots:
        pid_path = layout.pid(slot.name)
        pid = processes.read_pid(pid_path)
        if processes.is_alive(pid, BOOKIE_CMDLINE_MARK):
            _say(f"{slot.name}: already running (pid {pid}) as {slot.bookie_id}")
        else:
            processes.remove_pid(pid_path)
            os.makedirs(layout.bookie_dir(slot.index), exist_ok=True)
            spawned_ms[slot.name] = int(time.time() * 1000)
            pid = processes.spawn(bookie_argv(config_file), bookie_env(config, layout, slot), layout.log(slot.name),
                                  pid_path)
            _say(f"{slot.name}: started pid {pid} as {slot.bookie_id} (log {layout.log(slot.name)})")
        pids[slot.name] = pid
    wait_registered(config, layout, slots, pids, spawned_ms, timeout_s)


def wait_registered(config: Config, layout: RunLayout, slots: list[BookieSlot], pids: dict[str, int],
                    spawned_ms: dict[str, int], timeout_s: float) -> None:
    """Wait until every bookie is registered (writable or read-only); fail fast when one exits.

    For a bookie started now, a registration node left by its previous incarnation (kill -9: the old
    session lives until it expires) does not count: the node must name this pid or be created after spawn.
    """
    from bksim.adapters import registration

    client = connect_zookeeper(config)
    started = time.monotonic()
    deadline = started + timeout_s
    pending = list(slots)
    try:
        while pending:
            for slot in list(pending):
                state = registration_state(client, slot.bookie_id, pids[slot.name], spawned_ms.get(slot.name))
                if state is not None:
                    _say(f"{slot.name}: registered {state} ({time.monotonic() - started:.2f}s)")
                    pending.remove(slot)
                elif not processes.is_alive(pids[slot.name]):
                    raise ClusterError(f"{slot.name} (pid {pids[slot.name]}) exited before registering in "
                                       f"ZooKeeper; log {layout.log(slot.name)}:\n"
                                       f"{processes.tail(layout.log(slot.name))}")
            if not pending:
                break
            if time.monotonic() >= deadline:
                slot = pending[0]
                raise ClusterError(f"{slot.name} (pid {pids[slot.name]}) not registered at "
                                   f"{registration.registration_path(slot.bookie_id, False)} within "
                                   f"{timeout_s:.1f}s (cluster.start_timeout_ms); log {layout.log(slot.name)}:\n"
                                   f"{processes.tail(layout.log(slot.name))}")
            time.sleep(POLL_INTERVAL_S)
    finally:
        client.stop()
        client.close()


def broker_env(config: Config, layout: RunLayout, slot: BrokerSlot) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "BKSIM_CLUSTER_RUN_DIR": layout.run_dir,
        "BKSIM_ZOOKEEPER_HOST": config.zookeeper.host,
        "BKSIM_ZOOKEEPER_PORT": str(config.zookeeper.port),
        "BKSIM_BROKER_HOST": config.broker.host,
        "BKSIM_BROKER_PORT": str(slot.port),
        "BKSIM_BROKER_BROKER_ID": slot.broker_id,
        "PYTHONUNBUFFERED": "1",
    })
    return env


def broker_argv(config_file: str | None) -> list[str]:
    argv = [sys.executable, "-m", "bksim.cli.main"]
    if config_file:
        argv += ["--config", config_file]
    return argv + ["broker", "run"]


def start_brokers(config: Config, layout: RunLayout, config_file: str | None, timeout_s: float) -> None:
    """Start every broker slot not already running; wait until each is registered and SERVING."""
    slots = broker_slots(config)
    if not slots:
        return
    pids: dict[str, int] = {}
    started_now: set[str] = set()
    for slot in slots:
        pid_path = layout.pid(slot.name)
        pid = processes.read_pid(pid_path)
        if processes.is_alive(pid, BROKER_CMDLINE_MARK):
            _say(f"{slot.name}: already running (pid {pid}) as {slot.broker_id}")
        else:
            processes.remove_pid(pid_path)
            pid = processes.spawn(broker_argv(config_file), broker_env(config, layout, slot), layout.log(slot.name),
                                  pid_path)
            started_now.add(slot.name)
            _say(f"{slot.name}: started pid {pid} as {slot.broker_id} (log {layout.log(slot.name)})")
        pids[slot.name] = pid
    wait_brokers_ready(config, layout, slots, pids, started_now, timeout_s)


def wait_brokers_ready(config: Config, layout: RunLayout, slots: list[BrokerSlot], pids: dict[str, int],
                       started_now: set[str], timeout_s: float) -> None:
    """Wait until every broker is registered at /brokers/available/<id> and answers health SERVING; fail
    fast when one exits. For a broker started now only a registration naming its pid counts (a kill -9'd
    predecessor's node lives until its session expires)."""
    from bksim.adapters.broker_client import BrokerCallError, SyncBrokerClient
    from bksim.metadata.paths import broker_path

    client = connect_zookeeper(config)
    started = time.monotonic()
    deadline = started + timeout_s
    pending = list(slots)
    last_health: dict[str, str] = {}
    try:
        while pending:
            for slot in list(pending):
                pid = pids[slot.name]
                if broker_registration(client, slot.broker_id, pid if slot.name in started_now else None):
                    with SyncBrokerClient(slot.broker_id, deadline_s=HEALTH_DEADLINE_S) as broker:
                        try:
                            last_health[slot.name] = broker.health()
                        except BrokerCallError as e:
                            last_health[slot.name] = str(e)
                    if last_health[slot.name] == "SERVING":
                        _say(f"{slot.name}: registered and SERVING ({time.monotonic() - started:.2f}s)")
                        pending.remove(slot)
                        continue
                if not processes.is_alive(pid):
                    raise ClusterError(f"{slot.name} (pid {pid}) exited before it was registered and serving; "
                                       f"log {layout.log(slot.name)}:\n{processes.tail(layout.log(slot.name))}")
            if not pending:
                break
            if time.monotonic() >= deadline:
                slot = pending[0]
                health = last_health.get(slot.name)
                state = f"health {health}" if health else f"not registered at {broker_path(slot.broker_id)}"
                raise ClusterError(f"{slot.name} (pid {pids[slot.name]}) not ready within {timeout_s:.1f}s "
                                   f"(cluster.start_timeout_ms): {state}; log {layout.log(slot.name)}:\n"
                                   f"{processes.tail(layout.log(slot.name))}")
            time.sleep(POLL_INTERVAL_S)
    finally:
        client.stop()
        client.close()


def broker_registration(client, broker_id: str, pid: int | None = None) -> dict | None:
    """The registration data of a broker (None when not registered; with `pid`, only a node naming it)."""
    from bksim.metadata.paths import broker_path

    try:
        data, _ = client.get(broker_path(broker_id))
    except NoNodeError:
        return None
    try:
        row = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        row = None
    if not isinstance(row, dict):
        return None if pid is not None else {"broker_id": broker_id}
    if pid is not None and row.get("pid") != pid:
        return None
    return row


CTIME_SLACK_MS = 50  # ZooKeeper runs on this machine: its ctime and our wall clock are the same clock


def registration_state(client, bookie_id: str, pid: int | None = None, spawned_ms: int | None = None) -> str | None:
    """"writable", "read-only" or None (not registered).

    With `spawned_ms`, only a node that names `pid` in its data, or was created after the spawn, counts.
    """
    from bksim.adapters import registration

    for read_only, state in ((False, "writable"), (True, "read-only")):
        path = registration.registration_path(bookie_id, read_only)
        try:
            data, stat = client.get(path)
        except NoNodeError:
            continue
        if spawned_ms is None:
            return state
        try:
            named_pid = json.loads(data.decode()).get("pid")
        except (UnicodeDecodeError, ValueError, AttributeError):
            named_pid = None
        if named_pid == pid or (named_pid is None and stat.ctime >= spawned_ms - CTIME_SLACK_MS):
            return state
    return None


# -- down ----------------------------------------------------------------------------------------------

def pid_files(layout: RunLayout, kind: str) -> list[str]:
    """Every `<kind>-<i>.pid` file in the run dir, by i (not only 1..count: the count may have changed)."""
    def index(path: str) -> int:
        m = re.search(rf"{kind}-(\d+)\.pid$", path)
        return int(m.group(1)) if m else 0
    return sorted(glob.glob(os.path.join(layout.pids_dir, f"{kind}-*.pid")), key=index)


def bookie_pid_files(layout: RunLayout) -> list[str]:
    return pid_files(layout, "bookie")


def broker_pid_files(layout: RunLayout) -> list[str]:
    return pid_files(layout, "broker")


def cmd_down(args) -> int:
    config = loader.load(getattr(args, "config", None))
    layout = layout_of(config)
    failures = stop_brokers(config, layout)  # first: a stopping broker closes its ledgers on the bookies
    failures += stop_bookies(config, layout)
    server = zookeeper_of(config, layout)
    pid = processes.read_pid(server.pid_path)
    if pid is None:
        _say("zookeeper: no pid file")
    elif not processes.is_alive(pid, ZOOKEEPER_MAIN_CLASS):
        processes.remove_pid(server.pid_path)
        _say(f"zookeeper: pid {pid} not running (stale pid file removed)")
    elif server.stop(ZOOKEEPER_STOP_TIMEOUT_S):
        _say(f"zookeeper: stopped pid {pid}")
    else:
        failures.append(f"zookeeper pid {pid}")
    if failures:
        raise ClusterError(f"could not stop: {', '.join(failures)}")
    _say("cluster down")
    return 0


def stop_bookies(config: Config, layout: RunLayout) -> list[str]:
    """SIGTERM every live bookie at once, wait (bounded) for each, SIGKILL stragglers. Returns failures."""
    return stop_all(bookie_pid_files(layout), BOOKIE_CMDLINE_MARK,
                    config.bookie.shutdown_grace_ms / 1000.0 + BOOKIE_KILL_GRACE_S)


def stop_brokers(config: Config, layout: RunLayout) -> list[str]:
    """The same for brokers. A broker's SIGTERM may take two grace periods (closing its ledgers, then
    draining the gRPC server), hence the wait."""
    return stop_all(broker_pid_files(layout), BROKER_CMDLINE_MARK,
                    2 * config.broker.shutdown_grace_ms / 1000.0 + BROKER_KILL_GRACE_S)


def stop_all(paths: list[str], mark: str, wait_s: float) -> list[str]:
    """SIGTERM every live process named by `paths` at once, wait up to `wait_s` in all, SIGKILL stragglers;
    pid files of stopped (or already dead) processes are removed. Returns failures."""
    running: list[tuple[str, str, int]] = []
    for pid_path in paths:
        name = os.path.basename(pid_path)[: -len(".pid")]
        pid = processes.read_pid(pid_path)
        if processes.terminate(pid, mark):
            running.append((name, pid_path, pid))
        else:
            processes.remove_pid(pid_path)
            _say(f"{name}: pid {pid} not running (stale pid file removed)")
    deadline = time.monotonic() + wait_s
    failures = []
    for name, pid_path, pid in running:
        if processes.wait_exit(pid, max(0.0, deadline - time.monotonic())):
            _say(f"{name}: stopped pid {pid}")
        elif processes.kill9(pid, 5.0, mark):
            _say(f"{name}: pid {pid} did not stop on SIGTERM in time; killed (SIGKILL)")
        else:
            failures.append(f"{name} pid {pid}")
            continue
        processes.remove_pid(pid_path)
    return failures


# -- status --------------------------------------------------------------------------------------------

def cmd_status(args) -> int:
    """Exit status: 0 all processes with pid files are alive, 1 some bookie or broker is not, 3 ZooKeeper is
    not running."""
    config = loader.load(getattr(args, "config", None))
    layout = layout_of(config)
    server = zookeeper_of(config, layout)
    zk_pid = processes.read_pid(server.pid_path)
    zk_alive = processes.is_alive(zk_pid, ZOOKEEPER_MAIN_CLASS)
    rows = [{"name": "zookeeper", "pid": zk_pid, "alive": zk_alive, "address": server.connect, "registered": "-"}]

    registered = {"writable": [], "readonly": []}
    brokers_registered: list[str] = []
    zk_error = None
    if zk_alive:
        from bksim.adapters import registration
        from bksim.cli.ledger_cmd import registered_brokers
        try:
            client = connect_zookeeper(config)
            try:
                registered = registration.list_bookies(client)
                brokers_registered = [row["broker_id"] for row in registered_brokers(client)]
            finally:
                client.stop()
                client.close()
        except BksimError as e:
            zk_error = str(e)

    slots = {s.name: s for s in bookie_slots(config)}
    names = [os.path.basename(p)[: -len(".pid")] for p in bookie_pid_files(layout)]
    for name in sorted(set(names) | set(slots), key=lambda n: int(n.split("-")[1])):
        pid = processes.read_pid(layout.pid(name))
        index = int(name.split("-")[1])
        bookie_id = f"{config.bookie.host}:{config.cluster.bookie_port_base + index - 1}"
        state = ("writable" if bookie_id in registered["writable"] else
                 "read-only" if bookie_id in registered["readonly"] else "no")
        rows.append({"name": name, "pid": pid, "alive": processes.is_alive(pid, BOOKIE_CMDLINE_MARK),
                     "address": bookie_id, "registered": state})

    ours = {r["address"] for r in rows[1:]}
    others = sorted(set(registered["writable"]) - ours) + sorted(set(registered["readonly"]) - ours)

    broker_names = {s.name for s in broker_slots(config)}
    broker_names |= {os.path.basename(p)[: -len(".pid")] for p in broker_pid_files(layout)}
    for name in sorted(broker_names, key=lambda n: int(n.split("-")[1])):
        pid = processes.read_pid(layout.pid(name))
        index = int(name.split("-")[1])
        broker_id = f"{config.broker.host}:{config.cluster.broker_port_base + index - 1}"
        rows.append({"name": name, "pid": pid, "alive": processes.is_alive(pid, BROKER_CMDLINE_MARK),
                     "address": broker_id, "registered": "yes" if broker_id in brokers_registered else "no"})
    our_brokers = {r["address"] for r in rows if r["name"].startswith("broker-")}
    brokers_elsewhere = sorted(set(brokers_registered) - our_brokers)
    others += brokers_elsewhere
    if getattr(args, "json", False):
        print(json.dumps({"run_dir": layout.run_dir, "processes": rows, "registered": registered,
                          "registered_elsewhere": others, "brokers_registered": brokers_registered,
                          "zookeeper_error": zk_error}, indent=2))
    else:
        print(f"run dir: {layout.run_dir}")
        print(f"{'NAME':<12} {'PID':>8} {'ALIVE':<6} {'ADDRESS':<22} REGISTERED")
        for r in rows:
            print(f"{r['name']:<12} {r['pid'] if r['pid'] else '-':>8} {'yes' if r['alive'] else 'no':<6} "
                  f"{r['address']:<22} {r['registered']}")
        if others:
            print(f"also registered (not started by this cluster): {', '.join(others)}")
        if zk_error:
            print(f"zookeeper: {zk_error}")
    if not zk_alive:
        return 3
    return 0 if all(r["alive"] for r in rows if r["pid"]) else 1


# -- init ----------------------------------------------------------------------------------------------

def cmd_init(args) -> int:
    config = loader.load(getattr(args, "config", None))
    instance_id = init_metadata(config)
    _say(f"metadata ready: /ledgers, /ledgers/available, /ledgers/available/readonly, /ledgers/cookies; "
         f"INSTANCEID {instance_id}")
    return 0
