"""`bksim cluster up|down|status|init`: a local cluster of real processes (ZooKeeper, N bookies, M brokers).

The processes, their run directory (`cluster.run_dir`: logs/, pids/, bookie-<i>/, zookeeper/, zoo.cfg) and
their readiness are adapters.local_cluster's; this module maps the configuration onto it. Bookie i listens on
cluster.bookie_port_base + i - 1 and registers as <bookie.host>:<port>; broker i listens on
cluster.broker_port_base + i - 1 and registers as /brokers/available/<broker.host>:<port>.

`up` is idempotent: a process whose pid file names a live process of the right kind is left running. It starts
ZooKeeper, then the bookies, then the brokers, and returns once every bookie is registered (writable or
read-only) and every broker is registered and answers gRPC health SERVING, or fails with the tail of the log
of the first process that did not make it within cluster.start_timeout_ms (at once when it exits).
`down` stops in the reverse order: the monitoring Prometheus when `bksim monitor up` started one, brokers (they
close the ledgers they write, which needs the bookies), bookies, ZooKeeper; each SIGTERM by pid, a bounded wait,
then SIGKILL. `down` and `status` use only the pid files.

`up --zookeepers N` (or cluster.zookeepers = N) starts an ensemble of N ZooKeeper servers instead of one
(zookeeper-<n>: client port zookeeper.port + n - 1, quorum and election ports from their bases, data in
zookeeper-<n>/), waits until each has joined the quorum, and gives every bookie and broker the connect string of
all of them; `status` lists each server with what it says it is (leader, follower, not serving); `down` and
`status` find an ensemble by its pid files even when the configuration says fewer servers.

`up --tls` runs every gRPC link over TLS with certificates under <run_dir>/tls (security/certs.py makes the
CA, bookie-<i>, broker-<i> and client certificates when absent, and keeps them across runs); it writes
<run_dir>/tls/client.env, the BKSIM_SECURITY_TLS_* lines with which other `bksim` commands talk to the
cluster (`set -a; . .run/tls/client.env; set +a`). Mutual TLS, bookie authorized roles and the refresh
interval come from security.* as usual. Without --tls, a configuration with security.tls_enabled is used as it
is (its own files).

`up --secure` is `--tls` plus tokens, authorization and ZooKeeper digest ACLs (security/kit.py): under
<run_dir>/secure an HS256 secret, a token for the super-user role and the ZooKeeper credentials, made when absent
and kept across runs; every bookie and broker gets their file names (never a secret) in its environment, and
client.env also names the token and the ZooKeeper credentials, so `bksim` commands act as the super-user.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import sys

from bksim.adapters import processes
from bksim.adapters.local_cluster import (CHILD_MARKER, ClusterError, LocalCluster, child_argv, pid_files,
                                          stop_pid_files, stop_zookeeper_pid_file)
from bksim.adapters.zookeeper_server import MAIN_CLASS as ZOOKEEPER_MAIN_CLASS
from bksim.cli import config as loader
from bksim.model.config import Config
from bksim.model.errors import BksimError

__all__ = ["ClusterError"]

BOOKIE_KILL_GRACE_S = 5.0  # after bookie.shutdown_grace_ms: SIGKILL
BROKER_KILL_GRACE_S = 5.0  # after broker.shutdown_grace_ms: SIGKILL
TIMEOUT_HINT = "cluster.start_timeout_ms"
ZK_CONNECT_TIMEOUT_S = 5.0


def register(subparsers) -> None:
    parser = subparsers.add_parser("cluster", help="run a local cluster: ZooKeeper + bookies + brokers (processes)",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="start ZooKeeper, create the metadata layout, start cluster.bookies bookies "
                                   "and cluster.brokers brokers")
    up.add_argument("--zookeepers", type=int, default=None, metavar="N",
                    help="ZooKeeper servers to start (default cluster.zookeepers): 3 or 5 = an ensemble on "
                         "consecutive client, quorum and election ports")
    up.add_argument("--tls", action="store_true",
                    help="TLS on every gRPC link, with certificates under <run_dir>/tls (made when absent)")
    up.add_argument("--secure", action="store_true",
                    help="--tls plus token authentication, authorization and ZooKeeper digest ACLs, with the secrets "
                         "under <run_dir>/secure (made when absent); client.env makes bksim commands the super-user")
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


def bookie_argv(config_file: str | None) -> list[str]:
    return child_argv("bookie", config_file)


def broker_argv(config_file: str | None) -> list[str]:
    return child_argv("broker", config_file)


def cluster_of(config: Config, config_file: str | None = None, tls: bool = False,
               child_env: dict[str, str] | None = None) -> LocalCluster:
    """The configured cluster's processes (declared, not started): ZooKeeper, bookie-1.., broker-1..; `tls`:
    certificates under <run_dir>/tls (see the module docstring); `child_env`: BKSIM_ variables every bookie and
    broker gets besides."""
    from bksim.adapters.zk_client import security_from_config

    security = security_from_config(config)
    cluster = LocalCluster(config.cluster.run_dir, config_path=config_file, log=_say, zk_security=security,
                           tls_dir=tls_dir(config) if tls else None, child_env=child_env)
    if not tls and config.security.tls_enabled:
        from bksim.security.tls import channel_security

        cluster.tls = channel_security(config.security)  # the readiness checks dial the brokers over TLS
    zk = config.zookeeper
    cluster.zookeeper_server(zk.port, host=zk.host, tick_time_ms=zk.tick_time_ms, heap_mb=zk.heap_mb,
                             data_dir=zk.data_dir or None, secure_port=zk.secure_port, tls=security.tls,
                             client_auth=config.security.tls_client_auth,
                             count=max(config.cluster.zookeepers, _ensemble_pid_files(config.cluster.run_dir)),
                             quorum_port=zk.quorum_port_base, election_port=zk.election_port_base)
    c = config.cluster
    for i in range(c.bookies):
        node = cluster.add_bookie(c.bookie_port_base + i, host=config.bookie.host, argv=bookie_argv(config_file),
                                  env=_http_env("BOOKIE", c.bookie_http_port_base, i))
        node.http_port = c.bookie_http_port_base + i if c.bookie_http_port_base else None
    for i in range(c.brokers):
        node = cluster.add_broker(c.broker_port_base + i, host=config.broker.host, argv=broker_argv(config_file),
                                  env=_http_env("BROKER", c.broker_http_port_base, i))
        node.http_port = c.broker_http_port_base + i if c.broker_http_port_base else None
    return cluster


def _ensemble_pid_files(run_dir: str) -> int:
    """The highest n of a pids/zookeeper-<n>.pid: an ensemble `cluster up --zookeepers` started, which `down` and
    `status` find although the configuration says fewer servers."""
    found = [int(m.group(1)) for path in glob.glob(os.path.join(os.path.abspath(run_dir), "pids", "zookeeper-*.pid"))
             if (m := re.fullmatch(r"zookeeper-(\d+)\.pid", os.path.basename(path)))]
    return max(found, default=0)


def _http_env(kind: str, base: int, i: int) -> dict[str, str]:
    """The HTTP port of the i-th (0-based) bookie or broker: base + i (none when base is 0)."""
    return {f"BKSIM_{kind}_HTTP_PORT": str(base + i)} if base else {}


def tls_dir(config: Config) -> str:
    return os.path.join(os.path.abspath(config.cluster.run_dir), "tls")


def write_client_env(cluster: LocalCluster, kit=None) -> str:
    """<tls_dir>/client.env: the settings with which `bksim` commands talk to this TLS cluster (and, with the
    SecurityKit `kit`, present its super-user token and ZooKeeper credentials: file names only); its path."""
    from bksim.security import certs

    path = os.path.join(cluster.tls_dir, "client.env")
    lines = {"BKSIM_SECURITY_TLS_ENABLED": "true",
             "BKSIM_SECURITY_TLS_CA_FILE": os.path.join(cluster.tls_dir, certs.CA_FILE),
             "BKSIM_SECURITY_TLS_CERT_FILE": certs.cert_path(cluster.tls_dir, certs.CLIENT_NAME),
             "BKSIM_SECURITY_TLS_KEY_FILE": certs.key_path(cluster.tls_dir, certs.CLIENT_NAME)}
    if kit is not None:
        lines.update({"BKSIM_SECURITY_TOKEN_FILE": kit.token_file,
                      "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": kit.zk_credentials_file})
    with open(path, "w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in lines.items()))
    return path


def connect_zookeeper(config: Config):
    from bksim.adapters import registration

    try:
        return registration.connect_config(config, ZK_CONNECT_TIMEOUT_S)
    except registration.RegistrationError as e:
        raise ClusterError(f"{e} (is it running? `bksim cluster up` starts it)") from None


def _say(message: str) -> None:
    print(message, flush=True)


# -- up ------------------------------------------------------------------------------------------------

def cmd_up(args) -> int:
    config = loader.load(getattr(args, "config", None))
    if getattr(args, "zookeepers", None) is not None:
        config = dataclasses.replace(config, cluster=dataclasses.replace(
            config.cluster, zookeepers=args.zookeepers)).validate()
    loader.print_effective(config, "cluster up")
    secure = getattr(args, "secure", False)
    kit = None
    if secure:
        from bksim.security.kit import SUPER_USER_ROLE, SecurityKit

        kit = SecurityKit.keep_or_create(os.path.join(os.path.abspath(config.cluster.run_dir), "secure"))
        # this process's own ZooKeeper clients (metadata layout, readiness) use the children's credentials
        config = dataclasses.replace(config, zookeeper=dataclasses.replace(
            config.zookeeper, digest_credentials_file=kit.zk_credentials_file))
    cluster = cluster_of(config, config_path(args), tls=secure or getattr(args, "tls", False),
                         child_env=kit.child_env() if kit else None)
    for path in (cluster.run_dir, cluster.logs_dir, cluster.pids_dir):
        os.makedirs(path, exist_ok=True)
    if cluster.tls_dir:
        _say(f"{'TLS, tokens (super-user ' + repr(SUPER_USER_ROLE) + '), ZooKeeper ACLs' if kit else 'TLS'}: "
             f"certificates in {cluster.tls_dir}; for other bksim commands: "
             f"set -a; . {os.path.relpath(write_client_env(cluster, kit))}; set +a")
    timeout_s = config.cluster.start_timeout_ms / 1000.0
    zk = config.zookeeper
    cluster.start_zookeeper(zk.port, host=zk.host, timeout_s=timeout_s)
    if len(cluster.zookeepers) > 1:  # this process's own clients (metadata layout): every server of the ensemble
        config = dataclasses.replace(config, zookeeper=dataclasses.replace(config.zookeeper,
                                                                           connect=cluster.child_zk_connect))
    instance_id = init_metadata(config)
    _say(f"metadata ready: /ledgers (INSTANCEID {instance_id})")
    cluster.start(cluster.bookies, timeout_s, timeout_hint=TIMEOUT_HINT)
    cluster.start(cluster.brokers, timeout_s, serving=True, timeout_hint=TIMEOUT_HINT)
    tls_port = f" (TLS {zk.host}:{zk.secure_port})" if zk.secure_port else ""
    servers = len(cluster.zookeepers)
    zookeeper = (f"ZooKeeper {zk.host}:{zk.port}{tls_port}" if servers == 1 else
                 f"a ZooKeeper ensemble of {servers} ({cluster.zk_connect}; leader "
                 f"{getattr(cluster.zookeeper_leader(), 'name', 'not known')})")
    _say(f"cluster up: {zookeeper}, {config.cluster.bookies} bookie(s), "
         f"{config.cluster.brokers} broker(s); run dir {cluster.run_dir}")
    if servers != loader.load(getattr(args, "config", None)).cluster.zookeepers:
        _say(f"for other bksim commands (they read the connect string from the configuration): "
             f"export BKSIM_CLUSTER_ZOOKEEPERS={servers}")
    _say_endpoints(cluster, getattr(args, "config", None))
    return 0


def _say_endpoints(cluster: LocalCluster, explicit_config: str | None) -> None:
    _say("endpoints:")
    _say(f"  {'zookeeper':<10} {cluster.zk_connect}")
    for node in cluster.nodes:
        http = f"   http://{node.host}:{node.http_port}" if node.http_port else ""
        _say(f"  {node.name:<10} {node.node_id}{http}")
    suffix = f" --config {explicit_config}" if explicit_config else ""
    bookies = len(cluster.bookies)
    if cluster.brokers and bookies:
        e = min(3, bookies)
        cmd = bksim_command()
        _say(f"try: {cmd} ledger create --ensemble {e} --write-quorum {e} --ack-quorum {min(2, e)}{suffix}   "
             f"(then `{cmd} ledger write ID --count 1000 --size 1024`, `{cmd} ledger read ID`)")
    elif bookies:
        _say(f"try: {bksim_command()} bookie list{suffix}")


def bksim_command() -> str:
    """How to call `bksim` in a hint that works as printed: `bksim` when the PATH finds this installation's
    script (an activated venv), else that script by path (relative when under the current directory, e.g.
    `.venv/bin/bksim`), else `<python> -m bksim.cli.main`."""
    import shutil

    script = os.path.join(os.path.dirname(sys.executable), "bksim")
    if not os.path.exists(script):
        return f"{sys.executable} -m bksim.cli.main"
    found = shutil.which("bksim")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "bksim"
    relative = os.path.relpath(script)
    return script if relative.startswith("..") else relative


def init_metadata(config: Config) -> str:
    """Create the BookKeeper layout in ZooKeeper if absent; return the cluster's INSTANCEID."""
    from bksim.adapters import registration

    client = connect_zookeeper(config)
    try:
        return registration.ensure_layout(client)
    finally:
        client.stop()
        client.close()


# -- down ----------------------------------------------------------------------------------------------

def cmd_down(args) -> int:
    from bksim.cli.monitor_cmd import stop_monitor

    config = loader.load(getattr(args, "config", None))
    cluster = cluster_of(config)
    # the monitoring Prometheus (`bksim monitor up`) first, so it records no scrape failures of a stopping cluster
    failures = [] if stop_monitor(config, _say) else ["prometheus"]
    # brokers first: a stopping broker closes its ledgers on the bookies; a broker's SIGTERM may take two
    # grace periods (closing its ledgers, then draining the gRPC server)
    failures += stop_pid_files(pid_files(cluster.run_dir, "broker"),
                               2 * config.broker.shutdown_grace_ms / 1000.0 + BROKER_KILL_GRACE_S, _say)
    failures += stop_pid_files(pid_files(cluster.run_dir, "bookie"),
                               config.bookie.shutdown_grace_ms / 1000.0 + BOOKIE_KILL_GRACE_S, _say)
    for server in cluster.zookeepers:
        failures += stop_zookeeper_pid_file(server, _say)
    if failures:
        raise ClusterError(f"could not stop: {', '.join(failures)}")
    _say("cluster down")
    return 0


# -- status --------------------------------------------------------------------------------------------

def cmd_status(args) -> int:
    """Exit status: 0 all processes with pid files are alive, 1 some bookie or broker is not, 3 ZooKeeper is
    not running."""
    config = loader.load(getattr(args, "config", None))
    cluster = cluster_of(config)
    rows = []
    for server in cluster.zookeepers:
        pid = processes.read_pid(server.pid_path)
        alive = processes.is_alive(pid, ZOOKEEPER_MAIN_CLASS)
        rows.append({"name": server.name, "pid": pid, "alive": alive, "address": server.connect,
                     "registered": (server.mode() or "not serving") if alive and server.peers else "-"})
    zk_alive = any(r["alive"] for r in rows)
    if len(cluster.zookeepers) > 1:
        config = dataclasses.replace(config, zookeeper=dataclasses.replace(config.zookeeper,
                                                                           connect=cluster.child_zk_connect))

    registered = {"writable": [], "readonly": []}
    brokers_registered: list[str] = []
    zk_error = None
    if zk_alive:
        from bksim.adapters import registration
        from bksim.adapters.registration import registered_brokers
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

    for name, bookie_id in _rows_of(cluster, config, "bookie"):
        pid = processes.read_pid(cluster.pid_path(name))
        state = ("writable" if bookie_id in registered["writable"] else
                 "read-only" if bookie_id in registered["readonly"] else "no")
        rows.append({"name": name, "pid": pid, "alive": processes.is_alive(pid, CHILD_MARKER),
                     "address": bookie_id, "registered": state, "http_port": _http_port_of(config, name)})

    ours = {r["address"] for r in rows if r["name"].startswith("bookie-")}
    others = sorted(set(registered["writable"]) - ours) + sorted(set(registered["readonly"]) - ours)

    for name, broker_id in _rows_of(cluster, config, "broker"):
        pid = processes.read_pid(cluster.pid_path(name))
        rows.append({"name": name, "pid": pid, "alive": processes.is_alive(pid, CHILD_MARKER),
                     "address": broker_id, "registered": "yes" if broker_id in brokers_registered else "no",
                     "http_port": _http_port_of(config, name)})
    our_brokers = {r["address"] for r in rows if r["name"].startswith("broker-")}
    brokers_elsewhere = sorted(set(brokers_registered) - our_brokers)
    others += brokers_elsewhere
    if getattr(args, "json", False):
        print(json.dumps({"run_dir": cluster.run_dir, "processes": rows, "registered": registered,
                          "registered_elsewhere": others, "brokers_registered": brokers_registered,
                          "zookeeper_error": zk_error}, indent=2))
    else:
        print(f"run dir: {cluster.run_dir}")
        print(f"{'NAME':<12} {'PID':>8} {'ALIVE':<6} {'ADDRESS':<22} {'HTTP':<6} REGISTERED")
        for r in rows:
            print(f"{r['name']:<12} {r['pid'] if r['pid'] else '-':>8} {'yes' if r['alive'] else 'no':<6} "
                  f"{r['address']:<22} {r.get('http_port') or '-':<6} {r['registered']}")
        if others:
            print(f"also registered (not started by this cluster): {', '.join(others)}")
        if zk_error:
            print(f"zookeeper: {zk_error}")
    if not zk_alive:
        return 3
    return 0 if all(r["alive"] for r in rows if r["pid"]) else 1


def _http_port_of(config: Config, name: str) -> int | None:
    """The HTTP port (/metrics, admin API) of bookie-<i> / broker-<i>, as cluster_of gives it; None without."""
    kind, i = name.split("-")
    base = config.cluster.bookie_http_port_base if kind == "bookie" else config.cluster.broker_http_port_base
    return base + int(i) - 1 if base else None


def _rows_of(cluster: LocalCluster, config: Config, kind: str) -> list[tuple[str, str]]:
    """(name, id) of every configured `kind` and every one a pid file names (the count may have changed)."""
    host = config.bookie.host if kind == "bookie" else config.broker.host
    base = config.cluster.bookie_port_base if kind == "bookie" else config.cluster.broker_port_base
    names = {n.name for n in (cluster.bookies if kind == "bookie" else cluster.brokers)}
    names |= {os.path.basename(p)[: -len(".pid")] for p in pid_files(cluster.run_dir, kind)}
    indexes = sorted(int(n.split("-")[1]) for n in names)
    return [(f"{kind}-{i}", f"{host}:{base + i - 1}") for i in indexes]


# -- init ----------------------------------------------------------------------------------------------

def cmd_init(args) -> int:
    config = loader.load(getattr(args, "config", None))
    instance_id = init_metadata(config)
    _say(f"metadata ready: /ledgers, /ledgers/available, /ledgers/available/readonly, /ledgers/cookies; "
         f"INSTANCEID {instance_id}")
    return 0
