"""The secured docker-compose deployment (deploy/docker-compose.secure.yml), checked without a Docker engine.

- `docker-compose config -q` accepts the override on the bridge file and with the host override (audit profile
  included), with the secrets `bksim compose secrets` makes (`compose.make_secrets`).
- Every bookie and broker loads a valid configuration with TLS, token authentication and authorization on, its
  own certificate, and every file it names is one make_secrets made (mounted read-only at /etc/bksim/secrets);
  ZooKeeper's healthcheck and the audit get the digest credentials.
- deploy/container.py's healthchecks with that environment pass on a live bookie and broker that serve TLS only
  and register behind digest ACLs, and fail when the probe goes plaintext or lacks the credentials.

`make compose-check` with `COMPOSE_CHECK_ARGS=--secure` runs the same files end to end (docs/containers.md).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bksim.adapters.local_cluster import LocalCluster
from bksim.cli import config as cfgload
from bksim.cli.compose_cmd import deploy_compose

compose = deploy_compose()
REPO = compose.REPO
CONTAINER_PY = os.path.join(REPO, "deploy", "container.py")
MOUNT = "/etc/bksim/secrets"
SERVERS = ("bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2")
START_TIMEOUT_S = 60.0
HEALTH_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("compose-secrets"))
    made = compose.make_secrets(out)
    assert "super-user.token" in made and "tls/broker-2.pem" in made
    assert compose.make_secrets(out) == made  # a second run keeps what is there
    return out


def compose_env(secrets_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BKSIM_", "COMPOSE_", "DOCKER_"))}
    env[compose.SECRETS_DIR_ENV] = secrets_dir
    return env


@pytest.fixture(scope="module")
def stacks(secrets_dir) -> dict[str, dict]:
    env = compose_env(secrets_dir)
    return {"bridge": compose.config_dict(compose.compose_files(False, True), env=env)["services"],
            "host": compose.config_dict(compose.compose_files(True, True), profiles=("audit",), env=env)["services"]}


def bksim_env(service: dict) -> dict[str, str]:
    return {k: str(v) for k, v in service.get("environment", {}).items() if k.startswith("BKSIM_")}


@pytest.mark.parametrize("host", [False, True])
def test_config_q_accepts_the_secure_override(secrets_dir, host):
    argv = compose.compose_argv(compose.compose_files(host, True))
    argv[1:1] = ["--profile", "audit"]
    done = subprocess.run(argv + ["config", "-q"], capture_output=True, text=True, cwd=REPO,
                          env=compose_env(secrets_dir), timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_server_loads_tls_and_tokens_with_its_own_certificate(stacks, secrets_dir):
    for label, services in stacks.items():
        for name in SERVERS:
            env = bksim_env(services[name])
            env.pop(cfgload.CONFIG_ENV)
            sec = cfgload.load(os.path.join(REPO, "deploy", "bksim.toml"), env=env).security
            assert sec.tls_enabled and sec.auth_enabled and sec.authorization_enabled, (label, name)
            assert sec.super_user_roles == "bksim-admin"
            assert sec.tls_cert_file == f"{MOUNT}/tls/{name}.pem" and sec.tls_key_file == f"{MOUNT}/tls/{name}-key.pem"
            named = [sec.tls_ca_file, sec.tls_cert_file, sec.tls_key_file, sec.token_secret_key_file, sec.token_file,
                     env["BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"]]
            for path in named:
                assert path.startswith(MOUNT + "/"), (label, name, path)
                assert os.path.isfile(secrets_dir + path[len(MOUNT):]), f"make_secrets did not make {path}"


def test_every_service_mounts_the_secrets_read_only_and_names_only_files(stacks, secrets_dir):
    services = stacks["host"]
    for name in (*SERVERS, "zookeeper", "audit"):
        mounts = [v for v in services[name].get("volumes", [])
                  if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == MOUNT]
        assert len(mounts) == 1, (name, services[name].get("volumes"))
        v = mounts[0]
        source, read_only = ((v["source"], bool(v.get("read_only"))) if isinstance(v, dict)
                             else (v.split(":")[0], v.endswith(":ro")))
        assert source == secrets_dir and read_only, (name, v)
        assert bksim_env(services[name])["BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"] == f"{MOUNT}/zk-credentials"
    with open(os.path.join(secrets_dir, "super-user.token")) as f:
        token = f.read().strip()
    for services in stacks.values():  # the environment names files; no secret is in the rendered configuration
        assert token not in repr(services)


@pytest.fixture(scope="module")
def live(secrets_dir, tmp_path_factory):
    """A bookie and a broker with the override's environment (mount path -> the secrets dir) on 127.0.0.1."""
    host = compose.config_dict(compose.compose_files(True, True), env=compose_env(secrets_dir))["services"]
    run_dir = str(tmp_path_factory.mktemp("compose-secure-live"))
    shared = {k: v.replace(MOUNT, secrets_dir) for k, v in bksim_env(host["broker-1"]).items()
              if k.startswith(("BKSIM_SECURITY_", "BKSIM_ZOOKEEPER_DIGEST"))}
    for key in ("BKSIM_SECURITY_TLS_CERT_FILE", "BKSIM_SECURITY_TLS_KEY_FILE"):
        shared.pop(key)  # each process its own: tls_dir/<name>.pem, made by make_secrets
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir, tls_dir=os.path.join(secrets_dir, "tls"),
                           child_env={**shared, "BKSIM_AUTORECOVERY_ENABLED": "false",
                                      "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
                                      "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000"})
    try:
        cluster.start_zookeeper(heap_mb=128, timeout_s=START_TIMEOUT_S)
        bookie, broker = cluster.add_bookie(), cluster.add_broker()
        cluster.start([bookie, broker], timeout_s=START_TIMEOUT_S, serving=True)
        yield bookie, broker
    finally:
        leftovers = cluster.stop_all()
        assert not leftovers, f"processes did not stop: {leftovers}"


def container_py(role: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, CONTAINER_PY, "health", role], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=HEALTH_TIMEOUT_S)


def test_healthchecks_pass_over_tls_with_the_credentials(live):
    bookie, broker = live
    for role, node in (("bookie", bookie), ("broker", broker), ("zookeeper", broker)):
        done = container_py(role, node.env)
        assert done.returncode == 0, f"health {role}: {done.stderr}"


def test_healthchecks_fail_plaintext_or_without_credentials(live):
    bookie, broker = live
    for role, node in (("bookie", bookie), ("broker", broker)):
        plaintext = container_py(role, dict(node.env, BKSIM_SECURITY_TLS_ENABLED="false"))
        assert plaintext.returncode == 1 and plaintext.stderr.strip(), f"health {role} passed over plaintext"
        anonymous = {k: v for k, v in node.env.items() if k != "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"}
        done = container_py(role, anonymous)
        assert done.returncode == 1 and "NoAuth" in done.stderr, f"health {role} without credentials: {done.stderr}"
