"""The real ZooKeeper server (Debian's package), started and stopped by this project.

Owns: the standalone `zoo.cfg` (loopback only, our data dir, our client port, no admin server), the JVM
command line (`java -cp /usr/share/java/zookeeper.jar[:slf4j-simple.jar] ...QuorumPeerMain zoo.cfg`,
the jar's manifest pulls in jute, netty and slf4j-api), its pid file and log, and readiness (a kazoo
client can read `/`; the port accepts connections before the server is really serving).

Session timeouts are clamped by the server to [2, 20] x tick_time_ms, so a short tick (tests use
~200 ms) makes a lost session expire in about a second.
"""
from __future__ import annotations

import logging
import os
import shutil
import time

from bksim.adapters import processes
from bksim.model.errors import BksimError

JAVA_DIR = "/usr/share/java"
ZOOKEEPER_JAR = f"{JAVA_DIR}/zookeeper.jar"
SLF4J_SIMPLE_JAR = f"{JAVA_DIR}/slf4j-simple.jar"  # optional: without a binding the server logs nothing
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,envi,conf,cons"  # `envi` is needed by KazooClient.server_version()


class ZooKeeperError(BksimError):
    """ZooKeeper could not be started or did not become ready (the message carries its log tail)."""


class ZooKeeperServer:
    """One standalone ZooKeeper process bound to `host:port`, data under `data_dir`.

    `zoo.cfg` and (by default) the pid file live in the parent of `data_dir` (the run directory).
    """

    def __init__(self, host: str, port: int, data_dir: str, tick_time_ms: int, heap_mb: int, log_path: str,
                 pid_path: str | None = None, cfg_path: str | None = None) -> None:
        self.host = host
        self.port = int(port)
        self.data_dir = os.path.abspath(data_dir)
        self.tick_time_ms = int(tick_time_ms)
        self.heap_mb = int(heap_mb)
        self.log_path = os.path.abspath(log_path)
        run_dir = os.path.dirname(self.data_dir)
        self.pid_path = os.path.abspath(pid_path or os.path.join(run_dir, "zookeeper.pid"))
        self.cfg_path = os.path.abspath(cfg_path or os.path.join(run_dir, "zoo.cfg"))
        self.pid: int | None = processes.read_pid(self.pid_path)

    @property
    def connect(self) -> str:
        """Connect string for clients: "host:port"."""
        return f"{self.host}:{self.port}"

    def config_text(self) -> str:
        return "\n".join([
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
            "preAllocSize=4096",  # KiB: 4 MiB transaction-log preallocation instead of 64 MiB
            "",
        ])

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperError("java not found: install the zookeeper package (`make deps`)")
        if not os.path.exists(ZOOKEEPER_JAR):
            raise ZooKeeperError(f"{ZOOKEEPER_JAR} not found: install Debian's zookeeper package (`make deps`)")
        classpath = [ZOOKEEPER_JAR] + ([SLF4J_SIMPLE_JAR] if os.path.exists(SLF4J_SIMPLE_JAR) else [])
        return [java, f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", ":".join(classpath), MAIN_CLASS, self.cfg_path]

    def is_running(self) -> bool:
        """True when the pid file names a live ZooKeeper process."""
        self.pid = processes.read_pid(self.pid_path)
        return processes.is_alive(self.pid, MAIN_CLASS)

    def start(self) -> int:
        """Write zoo.cfg and launch the server in its own session. Returns its pid (does not wait)."""
        os.makedirs(self.data_dir, exist_ok=True)
        os.makedirs(os.path.dirname(self.cfg_path), exist_ok=True)
        with open(self.cfg_path, "w") as f:
            f.write(self.config_text())
        argv = self.command()
        self.pid = processes.spawn(argv, None, self.log_path, self.pid_path)
        return self.pid

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until a kazoo client can read `/`. Returns the seconds waited; raises ZooKeeperError."""
        from kazoo.client import KazooClient
        from kazoo.handlers.threading import KazooTimeoutError

        quiet = logging.getLogger("bksim.zookeeper.probe")
        quiet.setLevel(logging.CRITICAL)
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            if self.pid is not None and not processes.is_alive(self.pid):
                raise ZooKeeperError(f"ZooKeeper (pid {self.pid}) exited during start-up; "
                                     f"log {self.log_path}:\n{processes.tail(self.log_path)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ZooKeeperError(f"ZooKeeper at {self.connect} not ready after {timeout_s:.1f}s; "
                                     f"log {self.log_path}:\n{processes.tail(self.log_path)}")
            client = KazooClient(hosts=self.connect, timeout=min(2.0, max(0.2, remaining)),
                                 connection_retry={"max_tries": 0}, logger=quiet)
            try:
                client.start(timeout=min(1.0, max(0.1, remaining)))
                client.get("/")
                return time.monotonic() - started
            except (KazooTimeoutError, Exception):  # not serving yet: try again until the deadline
                time.sleep(0.05)
            finally:
                try:
                    client.stop()
                    client.close()
                except Exception:
                    pass

    def stop(self, timeout_s: float = 10.0) -> bool:
        """SIGTERM by pid, SIGKILL after `timeout_s`. True when it is gone; removes the pid file."""
        pid = self.pid or processes.read_pid(self.pid_path)
        stopped = processes.stop(pid, timeout_s, MAIN_CLASS)
        if stopped:
            processes.remove_pid(self.pid_path)
            self.pid = None
        return stopped
