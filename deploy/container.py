"""In-container helper for docker-compose.yml: start ZooKeeper from the bksim configuration, and the
healthchecks of every role.

    python /opt/bksim/deploy/container.py zookeeper        # write zoo.cfg (+ myid) from [zookeeper], exec the JVM
    python /opt/bksim/deploy/container.py health ROLE      # ROLE: zookeeper | bookie | broker; exit 0 = healthy

Every address, port and directory comes from the same configuration as `bksim cluster up`: the TOML file
($BKSIM_CONFIG) with BKSIM_<SECTION>_<OPTION> environment overrides, so a service's healthcheck probes
exactly what its process serves (no second copy of a port in docker-compose.yml).

ZooKeeper alone or in an ensemble: with zookeeper.peers set ("HOST:QUORUM_PORT:ELECTION_PORT,...", server 1
first) the server is member `zookeeper.server_id` of that ensemble; server_id 0 takes the trailing number of the
host name plus one (a Kubernetes StatefulSet's pod zk-0 is server 1, zk-2 server 3), and a host name without
one is an error that says so. zoo.cfg gets the server.N lines and the data dir `myid`.

Healthy means ready for the services that depend on it:
- zookeeper: a kazoo client connected to this server alone (zookeeper.host:port, not the cluster's connect
  string) reads "/": in an ensemble that means this server is in a quorum and serves;
- bookie: its gRPC health service answers SERVING and its registration node (writable or read-only)
  exists in ZooKeeper, so brokers can place ledgers on it;
- broker: its gRPC health service answers SERVING and /brokers/available/<id> exists.
Every probe is bounded by PROBE_TIMEOUT_S; the healthcheck's own `timeout` in docker-compose.yml is larger.
"""
from __future__ import annotations

import os
import re
import socket
import sys

PROBE_TIMEOUT_S = 3.0
DEFAULT_DATA_DIR = "/var/lib/bksim/zookeeper/data"


def _config():
    from bksim.cli import config as cfgload

    return cfgload.load()


def _zk(config, hosts: str | None = None):
    """A started kazoo client on `hosts` (default: the cluster's connect string) with the configured digest
    credentials (a secured stack's ACLs) and TLS port."""
    from bksim.adapters import registration

    return registration.connect_config(config, PROBE_TIMEOUT_S, hosts)


def own_server(config) -> str:
    """"host:port" of the ZooKeeper server this configuration starts (its TLS port when it has one)."""
    z = config.zookeeper
    return f"{z.host}:{z.secure_port or z.port}"


def _close(client) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: BLE001 - a probe's connection; the answer is already decided
        pass


def _grpc_serving(host: str, port: int, security=None) -> str:
    """The gRPC health status name of the server at host:port ("SERVING", "NOT_SERVING", ...); over TLS with the
    process's own files when `security` (the [security] section) has tls_enabled."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from bksim.security.tls import channel_security

    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    tls = channel_security(security)
    with (grpc.secure_channel(address, tls.credentials(), tls.options()) if tls else
          grpc.insecure_channel(address)) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                          timeout=PROBE_TIMEOUT_S)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def health(role: str) -> str:
    """'' when healthy, else what is missing."""
    config = _config()
    if role == "bookie":
        from bksim.cli.bookie_cmd import resolve

        b = resolve(config).bookie
        status = _grpc_serving(b.host, b.port, config.security)
        if status != "SERVING":
            return f"bookie {b.bookie_id}: gRPC health {status}"
    elif role == "broker":
        from bksim.cli.broker_cmd import resolve

        r = resolve(config).broker
        status = _grpc_serving(r.host, r.port, config.security)
        if status != "SERVING":
            return f"broker {r.broker_id}: gRPC health {status}"
    elif role != "zookeeper":
        raise SystemExit(f"container.py health: unknown role {role!r} (zookeeper, bookie, broker)")
    client = _zk(config, own_server(config) if role == "zookeeper" else None)
    try:
        client.get("/")
        if role == "bookie":
            from bksim.adapters import registration

            if (registration.read_registration(client, b.bookie_id, read_only=False) is None
                    and registration.read_registration(client, b.bookie_id, read_only=True) is None):
                return f"bookie {b.bookie_id}: not registered in ZooKeeper yet"
        elif role == "broker":
            from bksim.metadata.paths import broker_path

            if client.exists(broker_path(r.broker_id)) is None:
                return f"broker {r.broker_id}: {broker_path(r.broker_id)} does not exist yet"
    finally:
        _close(client)
    return ""


def server_id_from_hostname(hostname: str) -> int:
    """ZooKeeper's myid from a host name ending in a number: that number plus one ("zk-0" -> 1, the ordinal of
    a StatefulSet's pod); raises SystemExit saying what to set when there is none."""
    match = re.search(r"(\d+)$", hostname.split(".")[0])
    if match is None:
        raise SystemExit(f"container.py zookeeper: zookeeper.peers is set but zookeeper.server_id is 0 and the host "
                         f"name {hostname!r} does not end in a number: set BKSIM_ZOOKEEPER_SERVER_ID (1-based)")
    return int(match.group(1)) + 1


def ensemble(z, hostname: str) -> tuple[int, tuple]:
    """(server id, peers) of the ZooKeeper server [zookeeper] describes; (0, ()) standalone."""
    from bksim.adapters.zookeeper_server import Peer
    from bksim.model.config import parse_peers

    if not z.peers:
        return 0, ()
    peers = tuple(Peer(i, host, quorum, election) for i, (host, quorum, election)
                  in enumerate(parse_peers(z.peers), start=1))
    server_id = z.server_id or server_id_from_hostname(hostname)
    if not 1 <= server_id <= len(peers):
        raise SystemExit(f"container.py zookeeper: server id {server_id} (from the host name {hostname!r}) is not "
                         f"one of the {len(peers)} servers of zookeeper.peers")
    return server_id, peers


def run_zookeeper() -> None:
    """Write zoo.cfg for [zookeeper] (host, port, tick, heap, data_dir; with peers the ensemble and myid) and
    exec the JVM in this process (so it is the container's main process and gets `docker stop`'s SIGTERM)."""
    from bksim.adapters.zookeeper_server import ZooKeeperServer

    z = _config().zookeeper
    data_dir = z.data_dir or DEFAULT_DATA_DIR
    server_id, peers = ensemble(z, socket.gethostname())
    server = ZooKeeperServer(z.host, z.port, data_dir, z.tick_time_ms, z.heap_mb, log_path="/dev/stdout",
                             server_id=server_id, peers=peers)
    os.makedirs(server.data_dir, exist_ok=True)
    server.write_config()
    argv = server.command()
    member = f" server {server_id} of {len(peers)}" if peers else ""
    print(f"zookeeper{member}: {server.cfg_path}: clientPortAddress={z.host} clientPort={z.port} "
          f"dataDir={server.data_dir}", file=sys.stderr, flush=True)
    os.execv(argv[0], argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["zookeeper"] and len(argv) == 1:
        run_zookeeper()
        return 0  # not reached: exec
    if argv[:1] == ["health"] and len(argv) == 2:
        try:
            problem = health(argv[1])
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 - any failure to probe is "not healthy", said in one line
            problem = f"{argv[1]}: {type(e).__name__}: {e}"
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    print(__doc__.strip().splitlines()[0], "\nusage: container.py zookeeper | health zookeeper|bookie|broker",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
