"""The monitoring Prometheus server (Debian's `prometheus` package), started and stopped by this project.

Owns the monitor's part of a cluster's run directory:

    <run_dir>/monitor/prometheus.yml           scrape configuration (adapters.prometheus_config), written at start
    <run_dir>/monitor/rules/*.rules.yml        recording and alerting rules, written at start
    <run_dir>/monitor/data/                    Prometheus's TSDB (retention `retention`, default 6 h)
    <run_dir>/logs/prometheus.log              its stdout+stderr
    <run_dir>/pids/prometheus.pid              its pid

and the command line: `prometheus --config.file=<run_dir>/monitor/prometheus.yml --web.listen-address=<host>:<port>
--storage.tsdb.path=... --storage.tsdb.retention.time=...`, readiness (GET /-/ready answers 200), and stopping by
pid. `promtool check config|rules` validates the files.

Invariants: Prometheus listens only on a loopback address (refused otherwise), on a port nothing else answers on
(checked before the start: another server's /-/ready is never taken for this one's); a pid is signalled only when its
command line names this run directory's prometheus.yml (a stale pid file whose pid was reused is never
signalled); every wait has a deadline. HTTP requests here bypass any proxy of the environment (loopback only).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

from bksim.adapters import processes
from bksim.adapters.prometheus_config import (RULES_FILE_ALERTS, RULES_FILE_RECORDING, ScrapeTarget, alerting_rules,
                                              is_loopback, prometheus_config, recording_rules, to_yaml)
from bksim.model.errors import BksimError

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
INSTALL_HINT = "install Debian's prometheus package (`make monitor` does)"
READY_POLL_S = 0.1
HTTP_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 10.0  # Prometheus closes its TSDB head on SIGTERM (well under a second for a small one)
PROMTOOL_TIMEOUT_S = 30.0


class MonitorError(BksimError):
    """The monitoring Prometheus could not be configured, started, reached or stopped."""


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _no_proxy_opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusServer:
    """One Prometheus process for the cluster whose run directory is `run_dir`, on `host:port` (loopback)."""

    def __init__(self, run_dir: str, host: str = "127.0.0.1", port: int = 9090, retention: str = "6h") -> None:
        if not is_loopback(host):
            raise MonitorError(f"Prometheus listens only on loopback, not {host}")
        if not 0 < port < 65536:
            raise MonitorError(f"Prometheus port {port} out of range")
        self.run_dir = os.path.abspath(run_dir)
        self.host, self.port, self.retention = host, int(port), retention
        self.dir = os.path.join(self.run_dir, "monitor")
        self.config_path = os.path.join(self.dir, "prometheus.yml")
        self.rules_dir = os.path.join(self.dir, "rules")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.run_dir, "logs", "prometheus.log")
        self.pid_path = os.path.join(self.run_dir, "pids", "prometheus.pid")
        self.pid: int | None = processes.read_pid(self.pid_path)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def marker(self) -> str:
        """What the command line of this run directory's Prometheus contains."""
        return f"--config.file={self.config_path}"

    @property
    def rule_paths(self) -> list[str]:
        return [os.path.join(self.rules_dir, name) for name in (RULES_FILE_RECORDING, RULES_FILE_ALERTS)]

    def write_files(self, targets: list[ScrapeTarget], scrape_interval_s: float) -> list[str]:
        """prometheus.yml and the rule files; their paths (configuration first)."""
        os.makedirs(self.rules_dir, exist_ok=True)
        files = {self.config_path: prometheus_config(targets, self.rule_paths, scrape_interval_s,
                                                     f"{self.host}:{self.port}"),
                 self.rule_paths[0]: recording_rules(), self.rule_paths[1]: alerting_rules()}
        for path, doc in files.items():
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                f.write("# written by `bksim monitor`; rewritten at each start\n" + to_yaml(doc))
            os.replace(tmp, path)
        return list(files)

    def check_files(self) -> str:
        """`promtool check config` (which also checks the rule files it names); its output, or MonitorError."""
        if not os.path.exists(PROMTOOL):
            raise MonitorError(f"{PROMTOOL} not found: {INSTALL_HINT}")
        done = subprocess.run([PROMTOOL, "check", "config", self.config_path], capture_output=True, text=True,
                              timeout=PROMTOOL_TIMEOUT_S)
        if done.returncode != 0:
            raise MonitorError(f"promtool check config {self.config_path} failed:\n{done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def command(self) -> list[str]:
        if not os.path.exists(PROMETHEUS):
            raise MonitorError(f"{PROMETHEUS} not found: {INSTALL_HINT}")
        return [PROMETHEUS, self.marker, f"--web.listen-address={self.host}:{self.port}",
                f"--storage.tsdb.path={self.data_dir}", f"--storage.tsdb.retention.time={self.retention}",
                "--log.level=warn"]

    def is_running(self) -> bool:
        """True when the pid file names a live Prometheus of this run directory."""
        self.pid = processes.read_pid(self.pid_path)
        return processes.is_alive(self.pid, self.marker)

    def listen_address(self) -> tuple[str, int]:
        """(host, port) the running Prometheus's command line names (this object's own when it names none)."""
        flag = "--web.listen-address="
        for arg in processes.cmdline(self.pid).split(" ") if self.pid else ():
            if arg.startswith(flag):
                host, _, port = arg[len(flag):].rpartition(":")
                if port.isdigit():
                    return host, int(port)
        return self.host, self.port

    def start(self) -> int:
        """Launch Prometheus in its own session on the files written by write_files(); its pid (does not wait).
        A live one of this run directory is kept (its pid returned) after a reload of the files (SIGHUP)."""
        if self.is_running():
            os.kill(self.pid, 1)  # SIGHUP: Prometheus rereads its configuration and rule files
            return self.pid
        processes.remove_pid(self.pid_path)
        if _port_answers(self.host, self.port):  # another server (a system Prometheus?) would answer /-/ready
            raise MonitorError(f"{self.host}:{self.port} is already in use by a process this run directory did not "
                               f"start (no live pid in {self.pid_path}); stop it or choose another --port")
        os.makedirs(self.data_dir, exist_ok=True)
        argv = self.command()
        with processes.interrupts_deferred():  # a Ctrl-C between the fork and the pid file orphans nothing
            self.pid = processes.spawn(argv, None, self.log_path, self.pid_path)
        return self.pid

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until GET /-/ready answers 200; the seconds waited, or MonitorError with the log tail."""
        started = time.monotonic()
        deadline = started + timeout_s
        opener = _no_proxy_opener()
        while True:
            if self.pid is not None and not processes.is_alive(self.pid):
                raise MonitorError(f"Prometheus (pid {self.pid}) exited during start-up; log {self.log_path}:\n"
                                   f"{processes.tail(self.log_path)}")
            try:
                with opener.open(f"{self.url}/-/ready", timeout=HTTP_TIMEOUT_S) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass  # not listening or not ready yet
            if time.monotonic() >= deadline:
                raise MonitorError(f"Prometheus at {self.url} not ready after {timeout_s:.1f}s; log {self.log_path}:"
                                   f"\n{processes.tail(self.log_path)}")
            time.sleep(READY_POLL_S)

    def api(self, path: str, timeout_s: float = HTTP_TIMEOUT_S) -> dict:
        """GET /api/v1/<path> (query string included); the `data` of a successful answer, or MonitorError."""
        try:
            with _no_proxy_opener().open(f"{self.url}/api/v1/{path}", timeout=timeout_s) as response:
                body = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise MonitorError(f"Prometheus API {path}: {e}") from None
        if body.get("status") != "success":
            raise MonitorError(f"Prometheus API {path}: {body.get('error', body)}")
        return body["data"]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """SIGTERM by pid, SIGKILL after `timeout_s`; True when it is gone (or was not running); removes the pid
        file."""
        pid = processes.read_pid(self.pid_path) or self.pid
        stopped = processes.stop(pid, timeout_s, self.marker)
        if stopped:
            processes.remove_pid(self.pid_path)
            self.pid = None
        return stopped
