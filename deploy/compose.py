"""The docker-compose deployment's tooling (docker-compose.yml), run by `bksim compose render|check`.

- `render(host, out)`: the merged, interpolated configuration (`docker-compose config`) of docker-compose.yml,
  with `host` also deploy/docker-compose.host.yml and without any `ports:` (the v1 tool refuses published
  ports on host networking and cannot delete them in an override). Written as JSON, which every compose tool
  reads as YAML. With `zookeepers=3` the ensemble override deploy/docker-compose.ensemble.yml is merged too
  (and, on host networking, deploy/docker-compose.ensemble-host.yml: distinct ports on 127.0.0.1).
- `check(run_dir, base_image, audit)`: the end-to-end check behind `make compose-check`, on this machine where
  Docker has no registry: install docker.io, docker-compose and debootstrap when missing; start a private
  dockerd (its own socket, data-root, exec-root and pid file under <run_dir>/docker, with --bridge=none
  --iptables=false --ip-forward=false, so nothing about the machine's network changes); build the base image
  with debootstrap + `docker import` when missing; build the bksim image; `up` the host-network stack; wait
  until every service is healthy; write and read entries through a broker from this venv; `docker kill`
  (SIGKILL) a bookie of the ledger's ensemble; write more; read everything back through both brokers (no loss,
  no change); restart the bookie and use it again; `down -v`; stop dockerd by its pid. With `zookeepers=3`
  the stack has a three-server ZooKeeper ensemble, and the ZooKeeper leader is killed together with the bookie
  (the ensemble change that follows is a metadata write the two remaining servers must take).

It lives beside the files it deploys, not in the bksim package: the package is what runs inside the
containers; this builds and drives them from the host. The bksim CLI loads it from the checkout
(bksim.cli.compose_cmd.deploy_compose()).

Invariants: every wait is bounded (the *_TIMEOUT_S constants); whatever happens (failure, SIGINT,
SIGTERM) the stack is taken down and the dockerd this check started is stopped by its pid, together
with any containerd/shim process it left (found by our exec-root in their command line, stopped by pid).
A dockerd running from an earlier, interrupted check (our pid file, our socket) is stopped first. Images
stay in the data-root between runs (a second check skips debootstrap); `make clean` removes them.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from bksim.adapters import processes
from bksim.model.errors import BksimError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSE_FILE = os.path.join(REPO, "docker-compose.yml")
HOST_OVERRIDE = os.path.join(REPO, "deploy", "docker-compose.host.yml")
SECURE_OVERRIDE = os.path.join(REPO, "deploy", "docker-compose.secure.yml")
ENSEMBLE_OVERRIDE = os.path.join(REPO, "deploy", "docker-compose.ensemble.yml")
ENSEMBLE_HOST_OVERRIDE = os.path.join(REPO, "deploy", "docker-compose.ensemble-host.yml")
ENSEMBLE_SIZE = 3  # the ZooKeeper servers of the ensemble override
SECRETS_DIR_ENV = "BKSIM_SECRETS_DIR"  # the host directory the secure override mounts at /etc/bksim/secrets
EXTRA_CA_DIR = os.path.join(REPO, "deploy", "extra-ca")
LOCAL_CA_DIR = "/usr/local/share/ca-certificates"  # locally added CAs (a TLS-intercepting proxy's)
PROJECT = "bksim"
BASE_IMAGE_DEFAULT = "local/debian:bookworm"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
APT_PACKAGES = {"dockerd": "docker.io", "docker": "docker.io", "docker-compose": "docker-compose",
                "debootstrap": "debootstrap"}

# the host-network stack's ports (docker-compose.yml): they must be free on 127.0.0.1 before `up`
HOST_PORTS = {"zookeeper": 2181, "bookie-1": 3181, "bookie-2": 3182, "bookie-3": 3183,
              "broker-1": 6650, "broker-2": 6651}
# the ensemble override's further servers on host networking (zookeeper is server 1), and every server's
# quorum and election ports there (2888-2890, 3888-3890)
ENSEMBLE_HOST_PORTS = {"zookeeper-2": 2182, "zookeeper-3": 2183}
ENSEMBLE_PEER_PORTS = (2888, 2889, 2890, 3888, 3889, 3890)
BOOKIES = ("bookie-1", "bookie-2", "bookie-3")
BROKERS = ("broker-1", "broker-2")

# bounds of every wait
APT_TIMEOUT_S = 600
DOCKERD_START_TIMEOUT_S = 30
DOCKERD_STOP_TIMEOUT_S = 30
DEBOOTSTRAP_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 900
UP_TIMEOUT_S = 300
HEALTHY_TIMEOUT_S = 180
DOWN_TIMEOUT_S = 120
KILL_TIMEOUT_S = 30
COMPOSE_CMD_TIMEOUT_S = 60
POLL_S = 0.5
AUDIT_TIMEOUT_S = 600
# processes an engine starts besides dockerd (matched with our root in their command line before stopping)
ENGINE_PROGRAMS = ("dockerd", "containerd", "docker-proxy", "runc")

# the workload
LEDGER_PASSWORD = b"compose-check"
ENTRY_BYTES = 256
ENTRIES_BEFORE_KILL = 1000
ENTRIES_AFTER_KILL = 1000
ENTRIES_AFTER_RESTART = 200
BATCH = 50


class ComposeError(BksimError):
    """A step of the compose check failed; the message says which and why."""


# -- compose configuration --------------------------------------------------------------------------------------

def compose_files(host: bool, secure: bool = False, zookeepers: int = 1) -> list[str]:
    """The files of a variant, in merge order; `zookeepers`: 1 (the base file's server) or ENSEMBLE_SIZE."""
    if zookeepers not in (1, ENSEMBLE_SIZE):
        raise ComposeError(f"the compose files have 1 or {ENSEMBLE_SIZE} ZooKeeper servers, not {zookeepers}")
    ensemble = zookeepers == ENSEMBLE_SIZE
    return ([COMPOSE_FILE] + ([SECURE_OVERRIDE] if secure else []) + ([ENSEMBLE_OVERRIDE] if ensemble else [])
            + ([HOST_OVERRIDE] if host else []) + ([ENSEMBLE_HOST_OVERRIDE] if host and ensemble else []))


def host_ports(zookeepers: int = 1) -> dict[str, int]:
    """service -> the port its process listens on in the host-network stack."""
    return dict(HOST_PORTS, **(ENSEMBLE_HOST_PORTS if zookeepers == ENSEMBLE_SIZE else {}))


def make_secrets(out_dir: str) -> list[str]:
    """The files deploy/docker-compose.secure.yml mounts, under `out_dir` (security.kit's layout): a CA and a
    certificate per service naming it (bookie-1 .. broker-2, plus `client` for tools), an HS256 secret, the
    super-user's token, ZooKeeper digest credentials. Files already there are kept (certificates) or refused
    (keys: never overwritten). Returns the names made or kept."""
    from bksim.security import certs
    from bksim.security.kit import SecurityKit

    names = {b: ((b,), ("bookie",)) for b in BOOKIES} | {b: ((b,), ("broker",)) for b in BROKERS}
    names[certs.CLIENT_NAME] = ((), ("client",))
    if os.path.exists(os.path.join(out_dir, "super-user.token")):
        kept = ["token-secret.key", "super-user.token", "zk-credentials"]
    else:
        kit = SecurityKit.create(out_dir)
        kept = [os.path.basename(p) for p in (kit.secret_key_file, kit.token_file, kit.zk_credentials_file)]
    issued = certs.ensure(os.path.join(out_dir, "tls"), names)
    return kept + [f"tls/{os.path.basename(i.cert_file)}" for i in issued.values()]


def compose_argv(files: list[str], project: str = PROJECT) -> list[str]:
    compose = shutil.which("docker-compose")
    if compose is None:
        raise ComposeError("docker-compose not found: `make compose-tools` installs Debian's docker-compose")
    argv = [compose, "-p", project]
    for f in files:
        argv += ["-f", f]
    return argv


def _compose_python(compose: str) -> str:
    """The interpreter docker-compose (v1, a Python program) runs with: it has PyYAML."""
    with open(compose, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    if first.startswith("#!"):
        interpreter = first[2:].split()[0]
        if os.path.basename(interpreter) == "env":
            interpreter = shutil.which(first[2:].split()[1]) or ""
        if interpreter and os.access(interpreter, os.X_OK):
            return interpreter
    return "/usr/bin/python3"


def config_dict(files: list[str], profiles: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """`docker-compose config` of `files` as a dict (validated, merged, interpolated)."""
    argv = compose_argv(files)
    for profile in profiles:
        argv[1:1] = ["--profile", profile]
    done = subprocess.run(argv + ["config"], capture_output=True, text=True, timeout=COMPOSE_CMD_TIMEOUT_S,
                          cwd=REPO, env=env)
    if done.returncode != 0:
        raise ComposeError(f"docker-compose config of {' '.join(files)} failed:\n{done.stderr.strip()}")
    to_json = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    parsed = subprocess.run([_compose_python(argv[0]), "-c", to_json], input=done.stdout, capture_output=True,
                            text=True, timeout=COMPOSE_CMD_TIMEOUT_S)
    if parsed.returncode != 0:
        raise ComposeError(f"cannot parse docker-compose config output: {parsed.stderr.strip()}")
    return json.loads(parsed.stdout)


def render(host: bool, out: str, env: dict | None = None, secure: bool = False, zookeepers: int = 1) -> dict:
    """Write the merged configuration to `out` (JSON); for host networking without `ports:`; with `secure` the
    security override merged too, with `zookeepers` = 3 the ensemble override. `env` is the environment the files
    are interpolated with (default this process's)."""
    config = config_dict(compose_files(host, secure, zookeepers), profiles=("audit",), env=env)
    if host:
        for service in config.get("services", {}).values():
            service.pop("ports", None)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    return config


# -- the check --------------------------------------------------------------------------------------------------

class Step:
    """Prints one progress line per step with its duration; keeps (name, seconds) for the summary."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.times: list[tuple[str, float]] = []

    def run(self, name: str, fn, *args, **kwargs):
        print(f"[{time.monotonic() - self.started:7.1f}s] {name} ...", flush=True)
        t0 = time.monotonic()
        result = fn(*args, **kwargs)
        took = time.monotonic() - t0
        self.times.append((name, took))
        print(f"[{time.monotonic() - self.started:7.1f}s] {name}: done in {took:.1f}s", flush=True)
        return result

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s]   {text}", flush=True)


def _run(argv: list[str], timeout_s: float, what: str, env: dict | None = None, quiet: bool = False,
         input_bytes: bytes | None = None, log: str | None = None) -> str:
    """Run a command to completion within `timeout_s`; its output is returned (or appended to `log`)."""
    try:
        if log is not None:
            with open(log, "ab") as out:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, env=env,
                                      cwd=REPO, input=input_bytes)
            text = ""
        else:
            done = subprocess.run(argv, capture_output=True, timeout=timeout_s, env=env, cwd=REPO, input=input_bytes)
            text = (done.stdout + done.stderr).decode(errors="replace")
    except subprocess.TimeoutExpired:
        raise ComposeError(f"{what}: no result after {timeout_s}s ({' '.join(argv[:6])} ...)") from None
    if done.returncode != 0:
        detail = text.strip()[-3000:] if log is None else _tail(log)
        raise ComposeError(f"{what} failed (exit {done.returncode}):\n{detail}")
    if not quiet and text.strip():
        print(text.rstrip(), flush=True)
    return text


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return f"(no {path})"


def ensure_tools() -> list[str]:
    """apt-get install what is missing of docker.io, docker-compose, debootstrap. Returns what was installed."""
    missing = sorted({pkg for cmd, pkg in APT_PACKAGES.items() if shutil.which(cmd) is None})
    if missing:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run(["apt-get", "update"], APT_TIMEOUT_S, "apt-get update", env=env, quiet=True)
        _run(["apt-get", "install", "-y", "--no-install-recommends", *missing], APT_TIMEOUT_S,
             f"apt-get install {' '.join(missing)}", env=env, quiet=True)
    return missing


def ensure_extra_ca() -> list[str]:
    """When this machine trusts locally added CAs (a TLS-intercepting proxy's) and deploy/extra-ca/ has none,
    copy them there (git-ignored) so pip inside the image build reaches PyPI. Returns the copied names."""
    if any(n.endswith(".crt") for n in os.listdir(EXTRA_CA_DIR)) or not os.path.isdir(LOCAL_CA_DIR):
        return []
    copied = []
    for name in sorted(os.listdir(LOCAL_CA_DIR)):
        if name.endswith(".crt") and os.path.isfile(os.path.join(LOCAL_CA_DIR, name)):
            shutil.copyfile(os.path.join(LOCAL_CA_DIR, name), os.path.join(EXTRA_CA_DIR, name))
            copied.append(name)
    return copied


def check_ports_free(zookeepers: int = 1) -> None:
    ports = list(host_ports(zookeepers).items())
    if zookeepers == ENSEMBLE_SIZE:
        ports += [("ZooKeeper quorum/election", p) for p in ENSEMBLE_PEER_PORTS]
    for service, port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise ComposeError(f"port 127.0.0.1:{port} ({service} of the host-network stack) is in use "
                                   f"({e.strerror}): stop what holds it (`make down`?)") from None


class Dockerd:
    """A private Docker engine: socket, data-root, exec-root, pid file and log under `root`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.sock = os.path.join(self.root, "docker.sock")
        self.pid_file = os.path.join(self.root, "dockerd.pid")
        self.log = os.path.join(self.root, "dockerd.log")
        self.exec_root = os.path.join(self.root, "exec")
        self.data_root = os.path.join(self.root, "data")
        self.pid: int | None = None
        self.env = dict(os.environ, DOCKER_HOST=f"unix://{self.sock}")
        self.env.pop("DOCKER_CONTEXT", None)

    def argv(self) -> list[str]:
        return [shutil.which("dockerd") or "dockerd", "-H", f"unix://{self.sock}", "--data-root", self.data_root,
                "--exec-root", self.exec_root, "--pidfile", self.pid_file,
                "--bridge=none", "--iptables=false", "--ip-forward=false"]

    def _ours(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return "dockerd" in cmd and self.sock in cmd

    def stop_stale(self) -> bool:
        """Stop a dockerd left by an interrupted check (our pid file naming a live dockerd on our socket)."""
        try:
            with open(self.pid_file) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            return False
        if pid > 0 and self._ours(pid):
            self.pid = pid
            self.stop()
            return True
        self.unmount()  # an earlier dockerd's nsfs mount, if any
        return False

    def start(self) -> int:
        os.makedirs(self.root, exist_ok=True)
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.pid = proc.pid
        self._proc = proc
        deadline = time.monotonic() + DOCKERD_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise ComposeError(f"dockerd exited with {proc.returncode} during start-up; {self.log}:\n"
                                   f"{_tail(self.log)}")
            done = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=self.env,
                                  capture_output=True, text=True, timeout=DOCKERD_START_TIMEOUT_S)
            if done.returncode == 0:
                return self.pid
            if time.monotonic() > deadline:
                raise ComposeError(f"dockerd (pid {self.pid}) not answering on {self.sock} after "
                                   f"{DOCKERD_START_TIMEOUT_S}s; {self.log}:\n{_tail(self.log)}")
            time.sleep(POLL_S)

    def leftovers(self) -> list[int]:
        """Live processes whose command line names our root (containerd, shims, docker-proxy), not dockerd."""
        return [pid for pid, cmd in processes.processes_mentioning(self.root).items()
                if os.path.basename(cmd.split(" ", 1)[0]).startswith(ENGINE_PROGRAMS)]

    def stop(self) -> list[int]:
        """SIGTERM dockerd by pid (it stops its containerd), SIGKILL after DOCKERD_STOP_TIMEOUT_S; then stop any
        leftover process of ours by pid. Returns the leftover pids that had to be stopped."""
        pid = self.pid
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGTERM)
            if not _wait_gone(pid, DOCKERD_STOP_TIMEOUT_S):
                os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 5)
        proc = getattr(self, "_proc", None)
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.pid = None
        stray = self.leftovers()
        for p in stray:
            try:
                os.kill(p, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in stray:
            if not _wait_gone(p, 10):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.unmount()
        return stray

    def mounts(self) -> list[str]:
        """Mount points under our root (dockerd leaves exec/netns/default, an nsfs bind mount, after it exits;
        it would make the run directory impossible to delete)."""
        points = []
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    point = line.split()[4].replace("\\040", " ")
                    if point == self.root or point.startswith(self.root + "/"):
                        points.append(point)
        except OSError:
            pass
        return sorted(points, key=len, reverse=True)  # deepest first

    def unmount(self) -> None:
        for point in self.mounts():
            subprocess.run(["umount", point], capture_output=True, timeout=DOCKERD_STOP_TIMEOUT_S)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Check:
    def __init__(self, run_dir: str, base_image: str, audit: bool = False, secure: bool = False,
                 zookeepers: int = 1) -> None:
        self.run_dir = os.path.abspath(run_dir)
        self.zookeepers = zookeepers  # ENSEMBLE_SIZE: the ensemble override, its leader killed with the bookie
        self.ports = host_ports(zookeepers)
        self.base_image = base_image
        self.audit = audit
        self.secure = secure  # the security override: TLS, tokens + authorization, ZooKeeper digest ACLs
        self.secrets_dir = os.path.join(os.path.abspath(run_dir), "secrets")
        self.audit_out = os.path.join(self.run_dir, "audit")
        self.engine = Dockerd(os.path.join(self.run_dir, "docker"))
        self.rendered = os.path.join(self.run_dir, "host.yml")
        self.compose_log = os.path.join(self.run_dir, "compose.log")
        self.step = Step()
        self.stack_up = False
        self.env = dict(self.engine.env, BKSIM_BASE_IMAGE=base_image, BKSIM_AUDIT_OUT=self.audit_out)
        if secure:
            self.env[SECRETS_DIR_ENV] = self.secrets_dir

    # -- engine and images --

    def docker(self, *args: str, timeout_s: float = COMPOSE_CMD_TIMEOUT_S, what: str = "") -> str:
        return _run(["docker", *args], timeout_s, what or f"docker {args[0]}", env=self.env, quiet=True)

    def compose(self, *args: str, timeout_s: float = COMPOSE_CMD_TIMEOUT_S, log: bool = False) -> str:
        argv = compose_argv([self.rendered]) + list(args)
        return _run(argv, timeout_s, f"docker-compose {' '.join(args)}", env=self.env, quiet=True,
                    log=self.compose_log if log else None)

    def image_exists(self, tag: str) -> bool:
        done = subprocess.run(["docker", "image", "inspect", tag], env=self.env, capture_output=True,
                              timeout=COMPOSE_CMD_TIMEOUT_S)
        return done.returncode == 0

    def build_base(self) -> str:
        if self.image_exists(self.base_image):
            return f"{self.base_image} present"
        rootfs = os.path.join(self.run_dir, "rootfs")
        shutil.rmtree(rootfs, ignore_errors=True)
        _run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, rootfs, DEBIAN_MIRROR], DEBOOTSTRAP_TIMEOUT_S,
             "debootstrap", log=os.path.join(self.run_dir, "debootstrap.log"))
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        try:
            done = subprocess.run(["docker", "import", "-", self.base_image], stdin=tar.stdout, env=self.env,
                                  capture_output=True, timeout=DEBOOTSTRAP_TIMEOUT_S)
        finally:
            tar.stdout.close()
            tar.wait(timeout=DEBOOTSTRAP_TIMEOUT_S)
        if done.returncode != 0 or tar.returncode != 0:
            raise ComposeError(f"docker import of {rootfs} failed: {done.stderr.decode(errors='replace')}")
        shutil.rmtree(rootfs, ignore_errors=True)
        return f"{self.base_image} built with debootstrap {DEBIAN_SUITE}"

    # -- the stack --

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service).strip()
        if not cid:
            raise ComposeError(f"service {service} has no container")
        return cid

    def states(self) -> dict[str, str]:
        """service -> health status ("healthy", "starting", "unhealthy") or the container state when not running."""
        out = {}
        for service in self.ports:
            cid = self.compose("ps", "-q", service).strip()
            if not cid:
                out[service] = "missing"
                continue
            text = self.docker("inspect", "--format", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}"
                               "{{end}}", cid).split()
            out[service] = text[1] if text[0] == "running" and len(text) > 1 else text[0]
        return out

    def wait_healthy(self, services: tuple[str, ...] = ()) -> float:
        services = services or tuple(self.ports)
        t0 = time.monotonic()
        deadline = t0 + HEALTHY_TIMEOUT_S
        while True:
            states = self.states()
            if all(states[s] == "healthy" for s in services):
                return time.monotonic() - t0
            bad = {s: st for s, st in states.items() if s in services and st not in ("healthy", "starting")}
            if bad or time.monotonic() > deadline:
                logs = self.compose("logs", "--no-color", "--tail", "30")
                why = f"unhealthy or stopped: {bad}" if bad else f"not healthy after {HEALTHY_TIMEOUT_S}s: {states}"
                raise ComposeError(f"{why}\n{logs[-6000:]}")
            time.sleep(POLL_S)

    def up(self) -> str:
        _run(compose_argv(compose_files(True, self.secure, self.zookeepers)) + ["config", "-q"], COMPOSE_CMD_TIMEOUT_S,
             "docker-compose config -q (docker-compose.yml + " + ("security and " if self.secure else "")
             + ("ensemble and " if self.zookeepers > 1 else "") + "host override)", env=self.env)
        render(True, self.rendered, env=self.env, secure=self.secure, zookeepers=self.zookeepers)
        self.stack_up = True
        self.compose("down", "-v", "--remove-orphans", timeout_s=DOWN_TIMEOUT_S, log=True)  # an interrupted run's
        check_ports_free(self.zookeepers)
        self.compose("up", "-d", "--no-build", timeout_s=UP_TIMEOUT_S, log=True)
        took = self.wait_healthy()
        return f"{len(self.ports)} services healthy {took:.1f}s after up returned"

    def zk_modes(self) -> dict[str, str]:
        """ZooKeeper service -> what the server says it is (srvr): leader, follower, "" when not serving."""
        return {name: zookeeper_mode(port) for name, port in self.ports.items() if name.startswith("zookeeper")}

    def kill_zookeeper_leader(self) -> str:
        """SIGKILL the ensemble's leader; the two others must elect a new one. Returns the service killed."""
        modes = self.zk_modes()
        leaders = [name for name, mode in modes.items() if mode == "leader"]
        if len(leaders) != 1:
            raise ComposeError(f"expected one ZooKeeper leader, the servers say {modes}")
        self.docker("kill", "--signal", "KILL", self.container(leaders[0]), what=f"docker kill {leaders[0]}")
        t0 = time.monotonic()
        while True:
            modes = self.zk_modes()
            if sorted(m for n, m in modes.items() if n != leaders[0]) == ["follower", "leader"]:
                break
            if time.monotonic() - t0 > KILL_TIMEOUT_S:
                raise ComposeError(f"no new ZooKeeper leader {KILL_TIMEOUT_S}s after killing {leaders[0]}: {modes}")
            time.sleep(POLL_S)
        self.step.say(f"docker kill --signal KILL {leaders[0]} (the ZooKeeper leader): the others elected a new one "
                      f"in {time.monotonic() - t0:.1f}s ({modes})")
        return leaders[0]

    def down(self) -> None:
        if self.stack_up:
            self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout_s=DOWN_TIMEOUT_S, log=True)
            self.stack_up = False

    # -- the workload --

    def client_security(self):
        """(ChannelSecurity, token) of this check's clients: the CA and `client` certificate and the super-user's
        token with the security override, else (None, None)."""
        if not self.secure:
            return None, None
        from bksim.security import certs
        from bksim.security.tls import ChannelSecurity
        from bksim.security.tokens import read_token_file

        tls_dir = os.path.join(self.secrets_dir, "tls")
        tls = ChannelSecurity(os.path.join(tls_dir, certs.CA_FILE), certs.cert_path(tls_dir, certs.CLIENT_NAME),
                              certs.key_path(tls_dir, certs.CLIENT_NAME))
        return tls, read_token_file(os.path.join(self.secrets_dir, "super-user.token"))

    def refusals(self, address: str, tls) -> str:
        """The secured stack refuses a ledger call without a token (UNAUTHENTICATED) and a plaintext client."""
        from bksim.adapters.broker_client import BrokerCallError, SyncBrokerClient

        said = []
        for label, client_tls, wanted in (("no token", tls, "UNAUTHENTICATED"), ("plaintext", None, None)):
            with SyncBrokerClient(address, tls=client_tls, deadline_s=5.0) as client:
                try:
                    client.list_bookies()
                except BrokerCallError as e:
                    if wanted is not None and e.grpc_code != wanted:
                        raise ComposeError(f"{label}: broker-1 answered {e.grpc_code}, expected {wanted}") from None
                    said.append(f"{label}: {e.grpc_code}")
                    continue
                raise ComposeError(f"{label}: broker-1 answered ListBookies")
        return "secured: " + "; ".join(said)

    def workload(self) -> dict:
        from bksim.adapters.broker_client import SyncBrokerClient

        def payload(ledger_id: int, i: int) -> bytes:
            head = f"compose-check ledger {ledger_id} entry {i:08d} ".encode()
            return (head * (ENTRY_BYTES // len(head) + 1))[:ENTRY_BYTES]

        def append(client, ledger_id: int, first: int, count: int) -> None:
            batches = [[payload(ledger_id, i) for i in range(start, min(start + BATCH, first + count))]
                       for start in range(first, first + count, BATCH)]
            acks = client.append(ledger_id, batches, password=LEDGER_PASSWORD)
            got = [(f, n) for f, n in acks]
            want = [(first + k * BATCH, len(b)) for k, b in enumerate(batches)]
            if got != want:
                raise ComposeError(f"ledger {ledger_id}: appends acknowledged as {got[:3]}..., expected {want[:3]}...")

        def read_all(client, ledger_id: int, count: int, who: str) -> None:
            entries = client.read_entries(ledger_id, 0, count - 1, password=LEDGER_PASSWORD)
            ids = [e for e, _ in entries]
            if ids != list(range(count)):
                missing = sorted(set(range(count)) - set(ids))
                raise ComposeError(f"ledger {ledger_id} through {who}: read {len(ids)} of {count} entries; "
                                   f"missing {missing[:10]}")
            wrong = [e for e, p in entries if p != payload(ledger_id, e)]
            if wrong:
                raise ComposeError(f"ledger {ledger_id} through {who}: entries {wrong[:10]} read back different")

        s = self.step
        addresses = {b: f"127.0.0.1:{HOST_PORTS[b]}" for b in BROKERS}
        report: dict = {}
        tls, token = self.client_security()
        with SyncBrokerClient(addresses["broker-1"], tls=tls, token=token) as one, \
                SyncBrokerClient(addresses["broker-2"], tls=tls, token=token) as two:
            for name, client in (("broker-1", one), ("broker-2", two)):
                status = client.health("", 5.0)
                if status != "SERVING":
                    raise ComposeError(f"{name} health {status}")
            services = reflection_services(addresses["broker-1"], tls)
            if self.secure:
                s.say(self.refusals(addresses["broker-1"], tls))
            s.say(f"broker-1 reflection lists: {', '.join(services)}")
            if "bksim.broker.v1.Broker" not in services:
                raise ComposeError(f"broker-1 reflection does not list bksim.broker.v1.Broker: {services}")
            bookies = one.list_bookies()
            s.say(f"ListBookies: {', '.join(b['bookie_id'] + ' ' + b['state'] for b in bookies)}")
            if sorted(b["bookie_id"] for b in bookies if b["state"] == "writable") != sorted(
                    f"127.0.0.1:{HOST_PORTS[b]}" for b in BOOKIES):
                raise ComposeError(f"expected the three bookies writable, broker-1 lists {bookies}")

            info = one.create_ledger(2, 2, 2, password=LEDGER_PASSWORD)
            lid = info.ledger_id
            ensemble = list(info.segments[-1].ensemble)
            s.say(f"ledger {lid} created through broker-1: E=2 Qw=2 Qa=2 on {', '.join(ensemble)}")
            t0 = time.monotonic()
            append(one, lid, 0, ENTRIES_BEFORE_KILL)
            s.say(f"{ENTRIES_BEFORE_KILL} entries of {ENTRY_BYTES} B acknowledged in {time.monotonic() - t0:.2f}s")
            read_all(one, lid, ENTRIES_BEFORE_KILL, "broker-1")
            s.say(f"read back {ENTRIES_BEFORE_KILL} entries through broker-1: identical")

            victim_id = ensemble[0]
            victim = next(b for b in BOOKIES if f"127.0.0.1:{HOST_PORTS[b]}" == victim_id)
            cid = self.container(victim)
            self.docker("kill", "--signal", "KILL", cid, what=f"docker kill {victim}")
            deadline = time.monotonic() + KILL_TIMEOUT_S
            while self.docker("inspect", "--format", "{{.State.Running}}", cid).strip() == "true":
                if time.monotonic() > deadline:
                    raise ComposeError(f"{victim} still running {KILL_TIMEOUT_S}s after docker kill")
                time.sleep(0.1)
            s.say(f"docker kill --signal KILL {victim} ({victim_id}, in the ledger's ensemble): container stopped")
            zk_victim = self.kill_zookeeper_leader() if self.zookeepers > 1 else ""

            t0 = time.monotonic()
            append(one, lid, ENTRIES_BEFORE_KILL, ENTRIES_AFTER_KILL)
            total = ENTRIES_BEFORE_KILL + ENTRIES_AFTER_KILL
            s.say(f"{ENTRIES_AFTER_KILL} more entries acknowledged in {time.monotonic() - t0:.2f}s with {victim} dead")
            running = self.docker("inspect", "--format", "{{.State.Running}} {{.RestartCount}}", cid).split()
            s.say(f"{victim} after the writes: running={running[0]} restarts={running[1]}")
            after = one.get_metadata(lid)
            s.say("segments: " + "; ".join(f"from {g.first_entry_id}: {', '.join(g.ensemble)}"
                                           for g in after.segments))
            if running[0] != "true" and victim_id in after.segments[-1].ensemble:
                raise ComposeError(f"ledger {lid} still writes to the dead {victim_id}: {after.segments}")
            read_all(one, lid, total, "broker-1")
            closed = one.close_ledger(lid, password=LEDGER_PASSWORD)
            if closed.state != "CLOSED" or closed.last_entry_id != total - 1:
                raise ComposeError(f"ledger {lid} closed as {closed.state} at {closed.last_entry_id}, "
                                   f"expected CLOSED at {total - 1}")
            read_all(two, lid, total, "broker-2")
            s.say(f"ledger {lid} CLOSED at entry {total - 1}; all {total} entries read back identical through "
                  f"broker-1 and broker-2: lost 0")

            if running[0] != "true":
                self.compose("start", victim)
            took = self.wait_healthy((victim,))
            s.say(f"{victim} started again, healthy in {took:.1f}s (same volume, same cookie)")
            if zk_victim:
                self.compose("start", zk_victim)
                took = self.wait_healthy((zk_victim,))
                s.say(f"{zk_victim} started again, healthy in {took:.1f}s (rejoined as {self.zk_modes()[zk_victim]})")
            info2 = one.create_ledger(3, 3, 3, password=LEDGER_PASSWORD)
            append(one, info2.ledger_id, 0, ENTRIES_AFTER_RESTART)
            read_all(one, info2.ledger_id, ENTRIES_AFTER_RESTART, "broker-1")
            # another broker reads an open ledger only up to the LAC the bookies know (it lags the writer's),
            # so close it first: then broker-2 must read every entry
            one.close_ledger(info2.ledger_id, password=LEDGER_PASSWORD)
            read_all(two, info2.ledger_id, ENTRIES_AFTER_RESTART, "broker-2")
            s.say(f"ledger {info2.ledger_id} (E=Qw=Qa=3, includes {victim}): {ENTRIES_AFTER_RESTART} entries written "
                  f"through broker-1, closed, read back through both brokers")
            report.update(ledger=lid, entries=total, victim=victim, segments=len(after.segments))
        return report

    # -- everything --

    def run(self) -> int:
        s = self.step
        print(f"compose check: run dir {self.run_dir}; base image {self.base_image}; project {PROJECT}", flush=True)
        os.makedirs(self.run_dir, exist_ok=True)
        installed = s.run("tools (docker.io, docker-compose, debootstrap)", ensure_tools)
        if installed:
            s.say(f"apt-get installed {', '.join(installed)}")
        if self.secure:
            made = s.run("secrets (CA, certificates, HS256 secret, super-user token, ZooKeeper credentials)",
                         make_secrets, self.secrets_dir)
            s.say(f"secrets under {self.secrets_dir}: {', '.join(made)}")
        copied = ensure_extra_ca()
        if copied:
            s.say(f"copied this machine's local CA certificates into deploy/extra-ca/: {', '.join(copied)}")
        try:
            if self.engine.stop_stale():
                s.say("stopped a dockerd left by an earlier check")
            pid = s.run("start dockerd", self.engine.start)
            s.say(f"dockerd pid {pid} on {self.engine.sock} (--bridge=none --iptables=false --ip-forward=false)")
            s.say(s.run("base image", self.build_base))
            s.run("build bksim image", lambda: self.compose_build())
            s.say(s.run("up (host networking) and wait healthy", self.up))
            s.run("write, kill a bookie, write, read back", self.workload)
            if self.audit:
                s.say(s.run("audit service (Spark) over the bookies' volumes", self.run_audit))
            s.run("down -v", self.down)
        except ComposeError as e:
            print(f"compose check FAILED: {e}", file=sys.stderr, flush=True)
            return 1
        finally:
            try:
                self.down()
            except Exception as e:  # noqa: BLE001 - still stop the engine
                print(f"compose check: down after failure: {e}", file=sys.stderr, flush=True)
            stray = self.engine.stop()
            gone = not self.engine.leftovers()
            mounted = self.engine.mounts()
            print(f"[{time.monotonic() - s.started:7.1f}s] dockerd stopped"
                  + (f"; also stopped leftover pids {stray}" if stray else "")
                  + ("" if gone else "; WARNING: processes of ours still alive")
                  + (f"; WARNING: still mounted: {mounted}" if mounted else ""), flush=True)
        total = time.monotonic() - s.started
        print("compose check PASSED in %.1fs (%s)" % (total, ", ".join(f"{n} {t:.1f}s" for n, t in s.times)),
              flush=True)
        return 0

    def compose_build(self) -> None:
        render(True, self.rendered, env=self.env, secure=self.secure, zookeepers=self.zookeepers)
        self.compose("build", "zookeeper", timeout_s=BUILD_TIMEOUT_S, log=True)
        if self.audit:
            self.compose("--profile", "audit", "build", "audit", timeout_s=BUILD_TIMEOUT_S, log=True)

    def run_audit(self) -> str:
        """The audit service (profile audit) over the live stack's volumes: report.json must say clean."""
        shutil.rmtree(self.audit_out, ignore_errors=True)
        os.makedirs(self.audit_out, exist_ok=True)
        try:
            self.compose("--profile", "audit", "run", "--rm", "audit", timeout_s=AUDIT_TIMEOUT_S, log=True)
        except ComposeError as e:
            raise ComposeError(f"the audit service failed (exit 1 = violations, 2 = unusable input): {e}") from None
        with open(os.path.join(self.audit_out, "report.json")) as f:
            report = json.load(f)
        verdict = report.get("verdict")
        if verdict != "clean":
            raise ComposeError(f"audit verdict {verdict!r}: {json.dumps(report.get('totals', {}))[:2000]}")
        return f"audit verdict clean: {json.dumps(report.get('totals', {}), sort_keys=True)[:400]}"


def zookeeper_mode(port: int) -> str:
    """The `Mode:` a ZooKeeper server on 127.0.0.1:port answers to `srvr` ("" when it does not serve)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
            sock.sendall(b"srvr")
            reply = sock.makefile("rb").read(65536).decode("utf-8", "replace")
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in reply.splitlines() if line.startswith("Mode:")), "")


def reflection_services(address: str, tls=None) -> list[str]:
    """Service names a server lists through gRPC reflection (what `grpcurl ADDRESS list` prints); `tls`: a
    bksim.security.tls.ChannelSecurity for a TLS server."""
    import grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with (grpc.secure_channel(address, tls.credentials(), tls.options()) if tls else
          grpc.insecure_channel(address)) as channel:
        return sorted(ProtoReflectionDescriptorDatabase(channel).get_services())


def check(run_dir: str, base_image: str = BASE_IMAGE_DEFAULT, audit: bool = False, secure: bool = False,
          zookeepers: int = 1) -> int:
    """The end-to-end check (module docstring); SIGTERM runs the same clean-up as a failure. Exit status."""
    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        return Check(run_dir, base_image, audit, secure, zookeepers).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
