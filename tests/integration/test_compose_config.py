"""The docker-compose deployment, checked without a Docker engine.

- `docker-compose config -q` (Debian's v1 tool, installed by `make compose-tools`, a prerequisite of
  `make test`) accepts docker-compose.yml alone, with the host-networking override, with the audit profile,
  and the file `bksim compose render --host` writes for `make compose-check`.
- What the files say is checked against the code: the services exist, every long-running one has a
  healthcheck that probes its own role, every BKSIM_ variable is a real option of bksim.model.config and
  each service's environment loads as a valid configuration with the ports the check and the published
  ports expect, bookie data lives on named volumes, the audit reads every bookie's volume read-only, and
  the host override puts every service on 127.0.0.1.
- The ZooKeeper-ensemble override (deploy/docker-compose.ensemble.yml, with host networking also
  deploy/docker-compose.ensemble-host.yml): `config -q` accepts it; three servers with one identical peers line,
  ids 1..3, each its own volume, host and ports and a healthcheck of its own; every bookie, broker and the
  audit get a connect string naming exactly the three servers (the audit's shell command expands to it).
- The in-container helper deploy/container.py runs for real against this test session's ZooKeeper and a
  module's bookie and broker: its healthchecks pass on live servers and fail on a dead port, and its
  `zookeeper` mode starts a ZooKeeper from BKSIM_ variables, alone and as three members of an ensemble (whose
  probes each read from their own server).

`make compose-check` runs the same files end to end on a private dockerd (docs/containers.md).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from bksim.cli.compose_cmd import deploy_compose
from bksim.cli import config as cfgload
from bksim.model import config as schema
from helpers import free_port, wait_until

compose = deploy_compose()  # deploy/compose.py
REPO = compose.REPO
CONTAINER_PY = os.path.join(REPO, "deploy", "container.py")
SERVICES = {"zookeeper", "bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"}
ROLES = {"zookeeper": "zookeeper", "bookie-1": "bookie", "bookie-2": "bookie", "bookie-3": "bookie",
         "broker-1": "broker", "broker-2": "broker"}
IN_IMAGE_CONTAINER_PY = "/opt/bksim/deploy/container.py"
HEALTH_TIMEOUT_S = 30.0


def compose_bin() -> str:
    path = shutil.which("docker-compose")
    assert path, "docker-compose is missing: `make compose-tools` (a prerequisite of `make test`) installs it"
    return path


def compose_env() -> dict[str, str]:
    """The environment without variables that would change the interpolation under test."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("BKSIM_", "COMPOSE_", "DOCKER_"))}


def config_q(*files: str, profile: str | None = None) -> subprocess.CompletedProcess:
    argv = [compose_bin(), *(["--profile", profile] if profile else [])]
    for f in files:
        argv += ["-f", f]
    return subprocess.run(argv + ["config", "-q"], capture_output=True, text=True, cwd=REPO, env=compose_env(),
                          timeout=60)


@pytest.fixture(scope="module")
def base():
    return compose.config_dict(compose.compose_files(False), env=compose_env())["services"]


@pytest.fixture(scope="module")
def host():
    return compose.config_dict(compose.compose_files(True), profiles=("audit",), env=compose_env())["services"]


def bksim_env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items() if k.startswith("BKSIM_")}


def loaded(service: dict) -> schema.Config:
    """The configuration the service's process loads: deploy/bksim.toml (the image's BKSIM_CONFIG) + its env."""
    env = bksim_env(service)
    assert env.get("BKSIM_CONFIG") == "/opt/bksim/deploy/bksim.toml"
    env.pop("BKSIM_CONFIG")
    return cfgload.load(os.path.join(REPO, "deploy", "bksim.toml"), env=env)


# -- docker-compose config -q ----------------------------------------------------------------------------------

@pytest.mark.parametrize("files,profile", [
    ((compose.COMPOSE_FILE,), None),
    ((compose.COMPOSE_FILE,), "audit"),
    ((compose.COMPOSE_FILE, compose.HOST_OVERRIDE), None),
    ((compose.COMPOSE_FILE, compose.HOST_OVERRIDE), "audit"),
    ((compose.COMPOSE_FILE, compose.ENSEMBLE_OVERRIDE), "audit"),
    ((compose.COMPOSE_FILE, compose.ENSEMBLE_OVERRIDE, compose.HOST_OVERRIDE, compose.ENSEMBLE_HOST_OVERRIDE), "audit"),
], ids=["base", "base+audit", "host", "host+audit", "ensemble+audit", "ensemble+host+audit"])
def test_compose_config_is_valid(files, profile):
    done = config_q(*files, profile=profile)
    assert done.returncode == 0, f"docker-compose config -q rejected {files}:\n{done.stderr}"


def test_config_q_rejects_a_broken_file(tmp_path):
    """The validation above can fail: a service with an unknown key is refused."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  zookeeper:\n    image: x\n    helthcheck: {}\n")
    done = config_q(str(broken))
    assert done.returncode != 0 and "helthcheck" in done.stderr


def test_rendered_host_file_is_valid_and_has_no_ports(tmp_path):
    out = tmp_path / "host.yml"
    rendered = compose.render(True, str(out))["services"]
    assert set(rendered) == SERVICES | {"audit"}
    assert all("ports" not in s for s in rendered.values()), "v1 refuses ports on host networking"
    done = subprocess.run([compose_bin(), "-p", "bksim", "-f", str(out), "config", "-q"], capture_output=True,
                          text=True, cwd=REPO, env=compose_env(), timeout=60)
    assert done.returncode == 0, done.stderr


# -- what the files say ----------------------------------------------------------------------------------------

def test_services_exist_and_audit_is_only_in_its_profile(base, host):
    assert set(base) == SERVICES | {"audit"}
    assert set(host) == SERVICES | {"audit"}
    assert base["audit"].get("profiles") == ["audit"] and host["audit"].get("profiles") == ["audit"]
    assert all(not base[s].get("profiles") for s in SERVICES)


def test_every_service_has_a_healthcheck_probing_its_role(base):
    assert os.path.isfile(CONTAINER_PY)
    for name in SERVICES:
        check = base[name].get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        assert check["test"] == ["CMD", "python", IN_IMAGE_CONTAINER_PY, "health", ROLES[name]], name
        for key in ("interval", "timeout", "retries"):
            assert key in check, f"{name}: healthcheck without {key} (waits must be bounded)"


def test_every_bksim_variable_is_a_real_option(base, host):
    options = {(s, n) for s, n, _, _ in schema.describe()}
    for label, services in (("base", base), ("host", host)):
        for name, service in services.items():
            for key in bksim_env(service):
                if key == cfgload.CONFIG_ENV:
                    continue
                section, _, option = key[len(cfgload.ENV_PREFIX):].lower().partition("_")
                assert (section, option) in options, f"{label} {name}: {key} is not an option of bksim.model.config"


def test_each_service_loads_a_valid_configuration_with_the_expected_ports(base, host):
    for services in (base, host):
        zk = loaded(services["zookeeper"]).zookeeper
        assert zk.port == compose.HOST_PORTS["zookeeper"]
        for b in ("bookie-1", "bookie-2", "bookie-3"):
            config = loaded(services[b])
            assert config.zookeeper.port == zk.port
            assert config.bookie.port == compose.HOST_PORTS[b]
        for r in ("broker-1", "broker-2"):
            config = loaded(services[r])
            assert config.zookeeper.port == zk.port
            assert config.broker.port == compose.HOST_PORTS[r]
    # the bridge case: each process binds and registers under its service name, ZooKeeper under "zookeeper"
    for name in SERVICES:
        config = loaded(base[name])
        assert config.zookeeper.host == "zookeeper", name
        if name.startswith("bookie"):
            assert config.bookie.host == name
        if name.startswith("broker"):
            assert config.broker.host == name


def test_published_ports_are_the_ports_the_processes_listen_on(base):
    published = {name: [_port(p) for p in s.get("ports", [])] for name, s in base.items()}
    for name in ("zookeeper", "broker-1", "broker-2"):
        port = compose.HOST_PORTS[name]
        assert published[name] == [(port, port, "127.0.0.1")], f"{name} publishes {published[name]}"
    assert not any(published[b] for b in ("bookie-1", "bookie-2", "bookie-3")), "bookies are reached by brokers only"


def _port(spec) -> tuple[int, int, str | None]:
    """(published, target, host ip) of a port in long syntax or v1's "ip:published:target/proto" string."""
    if isinstance(spec, dict):
        return int(spec["published"]), int(spec["target"]), spec.get("host_ip")
    parts = spec.split("/")[0].split(":")
    return int(parts[-2]), int(parts[-1]), parts[-3] if len(parts) == 3 else None


def test_bookie_data_is_on_named_volumes(base):
    declared = compose.config_dict(compose.compose_files(False), env=compose_env()).get("volumes", {})
    for b in ("bookie-1", "bookie-2", "bookie-3"):
        config = loaded(base[b]).bookie
        mounts = _mounts(base[b])
        assert any(src == f"{b}-data" and config.journal_dir.startswith(target + "/") and
                   config.ledger_dir.startswith(target + "/") for src, target, _ in mounts), \
            f"{b}: journal {config.journal_dir} / ledgers {config.ledger_dir} not on volume {b}-data: {mounts}"
        assert f"{b}-data" in declared, f"volume {b}-data is not a named volume"
    zk = loaded(base["zookeeper"]).zookeeper
    assert any(src == "zookeeper-data" and zk.data_dir.startswith(target + "/")
               for src, target, _ in _mounts(base["zookeeper"]))


def _mounts(service: dict) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of a service's volumes, short or long syntax."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
        else:
            parts = v.split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def test_audit_reads_every_bookie_volume_read_only(host):
    audit = host["audit"]
    mounts = _mounts(audit)
    command = " ".join(audit["command"])
    assert command.startswith("sh -c exec bksim audit ")
    for b in ("bookie-1", "bookie-2", "bookie-3"):
        journal = loaded(host[b]).bookie.journal_dir
        assert any(src == f"{b}-data" and ro and journal.startswith(target + "/") for src, target, ro in mounts), \
            f"audit does not mount {b}-data read-only where {journal} is: {mounts}"
        assert journal in command, f"audit command does not read {journal}"
    assert "--zookeeper" in command and "--out /var/lib/bksim/audit" in command
    assert audit["build"]["target"] == "audit" and audit["image"] != host["bookie-1"]["image"]


def test_host_override_puts_every_service_on_loopback(host):
    for name, service in host.items():
        assert service.get("network_mode") == "host", name
        assert service["build"].get("network") == "host", f"{name}: the build must not need a bridge either"
        hosts = {k: v for k, v in bksim_env(service).items() if k.endswith("_HOST")}
        assert hosts and set(hosts.values()) == {"127.0.0.1"}, f"{name}: {hosts}"


def test_one_image_for_every_role_with_the_base_as_build_argument(base):
    images = {base[s]["image"] for s in SERVICES}
    assert images == {"bksim:local"}
    for s in SERVICES:
        build = base[s]["build"]
        assert build["dockerfile"] == "deploy/Dockerfile" and build["target"] == "runtime"
        assert build["args"]["BASE"] == compose.BASE_IMAGE_DEFAULT
    with open(os.path.join(REPO, "deploy", "Dockerfile")) as f:
        text = f.read()
    assert "ARG BASE=" in text and "FROM ${BASE} AS runtime" in text and "FROM runtime AS audit" in text


# -- deploy/container.py against live servers --------------------------------------------------------------------

def container_py(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, CONTAINER_PY, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=HEALTH_TIMEOUT_S)


@pytest.fixture(scope="module")
def live(broker_cluster):
    broker_cluster.settle(1)
    # the default payload bound (the harness lowers it; the probes do not depend on it, and the [topic]
    # section requires topic.message_bytes_max <= broker.payload_bytes_max)
    default = schema.BrokerConfig().payload_bytes_max
    (broker,) = broker_cluster.start_brokers(1, env={"BKSIM_BROKER_PAYLOAD_BYTES_MAX": str(default)})
    return broker_cluster.live_bookies()[0], broker


def test_healthchecks_pass_on_live_servers(live, zookeeper):
    bookie, broker = live
    for role, env in (("bookie", bookie.environment()), ("broker", broker.environment()),
                      ("zookeeper", broker.environment())):
        done = container_py("health", role, env=env)
        assert done.returncode == 0, f"health {role}: {done.stderr}"


def test_healthchecks_fail_where_nothing_serves(live):
    bookie, broker = live
    dead = str(free_port())
    for role, env, key in (("bookie", bookie.environment(), "BKSIM_BOOKIE_PORT"),
                           ("broker", broker.environment(), "BKSIM_BROKER_PORT"),
                           ("zookeeper", broker.environment(), "BKSIM_ZOOKEEPER_PORT")):
        done = container_py("health", role, env=dict(env, **{key: dead}))
        assert done.returncode == 1, f"health {role} on dead port {dead} passed"
        assert done.stderr.strip(), "a failing healthcheck says why"


def test_bookie_health_requires_its_registration(live):
    """A serving gRPC port is not enough: the bookie id must be registered (else brokers cannot place on it)."""
    bookie, _broker = live
    done = container_py("health", "bookie", env=dict(bookie.environment(), BKSIM_BOOKIE_BOOKIE_ID="not-registered:1"))
    assert done.returncode == 1 and "not registered" in done.stderr, done.stderr


def test_zookeeper_mode_starts_a_server_from_bksim_variables(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update(BKSIM_ZOOKEEPER_HOST="127.0.0.1", BKSIM_ZOOKEEPER_PORT=str(port), BKSIM_ZOOKEEPER_HEAP_MB="64",
               BKSIM_ZOOKEEPER_DATA_DIR=str(tmp_path / "zk" / "data"))
    with open(tmp_path / "zk.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, CONTAINER_PY, "zookeeper"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_until(lambda: container_py("health", "zookeeper", env=env).returncode == 0, HEALTH_TIMEOUT_S,
                   interval_s=0.2, message=f"ZooKeeper from container.py on port {port}")
        cfg = (tmp_path / "zk" / "zoo.cfg").read_text()
        assert f"clientPort={port}" in cfg and "clientPortAddress=127.0.0.1" in cfg
        assert proc.poll() is None
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"QuorumPeerMain" in f.read(), "the JVM replaced the helper (exec), so it gets docker stop's signal"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def test_zookeeper_mode_starts_an_ensemble_member_and_probes_only_its_own_server(tmp_path):
    """Three `container.py zookeeper` processes with zookeeper.peers form an ensemble (myid and server.N lines from
    the variables, as the ensemble override and the Kubernetes StatefulSet give them); `health zookeeper` reads
    from its own server, so a stopped member is unhealthy although the connect string still reaches a quorum."""
    ports = [free_port() for _ in range(9)]
    client, quorum, election = ports[0:3], ports[3:6], ports[6:9]
    peers = ",".join(f"127.0.0.1:{q}:{e}" for q, e in zip(quorum, election))
    connect = ",".join(f"127.0.0.1:{p}" for p in client)
    base = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    envs = [dict(base, BKSIM_ZOOKEEPER_HOST="127.0.0.1", BKSIM_ZOOKEEPER_PORT=str(client[i]),
                 BKSIM_ZOOKEEPER_CONNECT=connect, BKSIM_ZOOKEEPER_PEERS=peers, BKSIM_ZOOKEEPER_SERVER_ID=str(i + 1),
                 BKSIM_ZOOKEEPER_HEAP_MB="64", BKSIM_ZOOKEEPER_TICK_TIME_MS="200",
                 BKSIM_ZOOKEEPER_DATA_DIR=str(tmp_path / f"zk-{i + 1}" / "data")) for i in range(3)]
    procs = []
    try:
        for i, env in enumerate(envs):
            with open(tmp_path / f"zk-{i + 1}.log", "wb") as log:
                procs.append(subprocess.Popen([sys.executable, CONTAINER_PY, "zookeeper"], env=env, stdout=log,
                                              stderr=subprocess.STDOUT, cwd=REPO))
        for i, env in enumerate(envs):
            wait_until(lambda: container_py("health", "zookeeper", env=env).returncode == 0, HEALTH_TIMEOUT_S,
                       interval_s=0.2, message=f"ensemble member {i + 1} on port {client[i]} serves")
        lines = []
        for i in range(3):
            assert (tmp_path / f"zk-{i + 1}" / "data" / "myid").read_text().strip() == str(i + 1)
            cfg = (tmp_path / f"zk-{i + 1}" / "zoo.cfg").read_text()
            lines.append([line for line in cfg.splitlines() if line.startswith("server.")])
        assert lines[0] == [f"server.{i + 1}=127.0.0.1:{quorum[i]}:{election[i]}" for i in range(3)]
        assert lines[1] == lines[0] and lines[2] == lines[0]
        _stop(procs[2])
        done = container_py("health", "zookeeper", env=envs[2])
        assert done.returncode == 1, "server 3 is stopped: its probe must not pass through servers 1 and 2"
        assert container_py("health", "zookeeper", env=envs[0]).returncode == 0, "servers 1 and 2 are a quorum"
    finally:
        for proc in procs:
            if proc.poll() is None:
                _stop(proc)


def test_zookeeper_server_id_comes_from_the_host_name_or_is_refused():
    module = _container_module()
    assert module.server_id_from_hostname("zk-0") == 1
    assert module.server_id_from_hostname("zk-2.zk-hs.bksim.svc.cluster.local") == 3
    with pytest.raises(SystemExit, match="BKSIM_ZOOKEEPER_SERVER_ID"):
        module.server_id_from_hostname("zookeeper")
    config = cfgload.load(os.path.join(REPO, "deploy", "bksim.toml"),
                          env={"BKSIM_ZOOKEEPER_PEERS": "zk-0.zk-hs:2888:3888,zk-1.zk-hs:2888:3888"})
    server_id, peers = module.ensemble(config.zookeeper, "zk-1")
    assert server_id == 2 and [p.host for p in peers] == ["zk-0.zk-hs", "zk-1.zk-hs"]
    with pytest.raises(SystemExit, match="not one of the 2 servers"):
        module.ensemble(config.zookeeper, "zk-5")


def _container_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bksim_deploy_container", CONTAINER_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the ZooKeeper-ensemble override -----------------------------------------------------------------------------

ZOOKEEPERS = ("zookeeper", "zookeeper-2", "zookeeper-3")


@pytest.fixture(scope="module")
def ensembles():
    """{"bridge": services, "host": services} of the ensemble override, with the audit profile."""
    return {label: compose.config_dict(compose.compose_files(host, zookeepers=3), profiles=("audit",),
                                       env=compose_env())["services"]
            for label, host in (("bridge", False), ("host", True))}


def ensemble_problems(services: dict) -> list[str]:
    """What is wrong with an ensemble deployment's services (empty: nothing): the three servers' configurations
    and every other process's connect string."""
    from bksim.adapters.zk_client import client_hosts

    problems = []
    servers = {}
    for name in ZOOKEEPERS:
        z = loaded(services[name]).zookeeper
        servers[name] = z
        if (services[name].get("healthcheck") or {}).get("test") != ["CMD", "python", IN_IMAGE_CONTAINER_PY,
                                                                       "health", "zookeeper"]:
            problems.append(f"{name}: no zookeeper healthcheck")
    peer_lines = {name: z.peers for name, z in servers.items()}
    if len(set(peer_lines.values())) != 1:
        problems.append(f"the servers' peers differ: {peer_lines}")
    peers = schema.parse_peers(servers["zookeeper"].peers) if servers["zookeeper"].peers else []
    if len(peers) != len(ZOOKEEPERS):
        problems.append(f"peers names {len(peers)} servers, not {len(ZOOKEEPERS)}")
    if len({(h, p) for h, q, e in peers for p in (q, e)}) != 2 * len(peers):
        problems.append(f"two peers share a quorum or election address: {peers}")
    if sorted(z.server_id for z in servers.values()) != list(range(1, len(ZOOKEEPERS) + 1)):
        problems.append(f"server ids {[z.server_id for z in servers.values()]}, not 1..{len(ZOOKEEPERS)}")
    expected = sorted(f"{z.host}:{z.port}" for z in servers.values())
    for name, z in servers.items():
        own = schema.parse_peers(z.peers) if z.peers else []
        if 1 <= z.server_id <= len(own) and own[z.server_id - 1][0] != z.host:
            problems.append(f"{name}: server {z.server_id}'s peer host {own[z.server_id - 1][0]} is not its "
                            f"own host {z.host}")
    if len(set(expected)) != len(ZOOKEEPERS):
        problems.append(f"two servers listen on one address: {expected}")
    volumes = [src for name in ZOOKEEPERS for src, target, _ in _mounts(services[name])
               if servers[name].data_dir.startswith(target + "/")]
    if len(set(volumes)) != len(ZOOKEEPERS):
        problems.append(f"the servers' data dirs are not on a volume each: {volumes}")
    for name, service in services.items():
        hosts = sorted(f"{h}:{p}" for h, p in schema.parse_connect(client_hosts(loaded(service))))
        if hosts != expected:
            problems.append(f"{name}: connect string names {hosts}, not the servers {expected}")
    return problems


def test_ensemble_servers_share_one_peers_line_and_every_process_gets_all_three(ensembles):
    for label, services in ensembles.items():
        assert set(services) == SERVICES | {"audit", "zookeeper-2", "zookeeper-3"}, label
        assert ensemble_problems(services) == [], label
    bridge, host = ensembles["bridge"], ensembles["host"]
    assert loaded(bridge["bookie-1"]).zookeeper.connect == "zookeeper:2181,zookeeper-2:2181,zookeeper-3:2181"
    assert {loaded(host[z]).zookeeper.port for z in ZOOKEEPERS} == {2181, 2182, 2183}
    assert all(host[z].get("network_mode") == "host" for z in ZOOKEEPERS)
    ports = compose.host_ports(3)
    assert {z: loaded(host[z]).zookeeper.port for z in ZOOKEEPERS} == {z: ports[z] for z in ZOOKEEPERS}
    peer_ports = {p for _, q, e in schema.parse_peers(loaded(host["zookeeper"]).zookeeper.peers) for p in (q, e)}
    assert peer_ports == set(compose.ENSEMBLE_PEER_PORTS), "check_ports_free must check the ports the servers use"


def test_ensemble_check_can_fail():
    """The checks above find a service left on one server, and a server with a peers line of its own."""
    import copy

    services = compose.config_dict(compose.compose_files(False, zookeepers=3), env=compose_env())["services"]
    assert ensemble_problems(services) == []
    one = copy.deepcopy(services)
    one["broker-2"]["environment"].pop("BKSIM_ZOOKEEPER_CONNECT")
    assert any(p.startswith("broker-2: connect string names ['zookeeper:2181']") for p in ensemble_problems(one))
    other = copy.deepcopy(services)
    other["zookeeper-3"]["environment"]["BKSIM_ZOOKEEPER_PEERS"] = "zookeeper:2888:3888,zookeeper-2:2888:3888," \
                                                                  "zookeeper-4:2888:3888"
    found = ensemble_problems(other)
    assert any("peers differ" in p for p in found) and any("zookeeper-3: server 3's peer host" in p for p in found)


def test_ensemble_audit_reads_the_metadata_from_every_server(ensembles):
    """The audit's shell command expands --zookeeper to zookeeper.connect (and to host:port without one)."""
    for services in (ensembles["bridge"], ensembles["host"], compose.config_dict(
            compose.compose_files(False), profiles=("audit",), env=compose_env())["services"]):
        audit = services["audit"]
        argv = list(audit["command"])
        assert argv[:2] == ["sh", "-c"] and argv[2].startswith("exec bksim audit ")
        script = argv[2].replace("$$", "$").replace("exec bksim audit ", "echo ", 1)
        env = dict(bksim_env(audit), PATH=os.environ["PATH"])
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=10).stdout.split()
        config = loaded(audit).zookeeper
        want = config.connect or f"{config.host}:{config.port}"
        assert out[out.index("--zookeeper") + 1] == want
