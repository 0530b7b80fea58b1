"""The real ZooKeeper server (Debian's package), started and stopped by this project.

Owns: the standalone `zoo.cfg` (loopback only, our data dir, our client port, no admin server), the JVM
command line (`java -cp /usr/share/java/zookeeper.jar[:slf4j-simple.jar] ...QuorumPeerMain zoo.cfg`,
the jar's manifest pulls in jute, netty and slf4j-api), its pid file and log, and readiness (a kazoo
client can read `/`; the port accepts connections before the server is really serving).

TLS (optional): with a `secure_port` and server TLS files the server also listens there with TLS only
(Netty connection factory, `secureClientPort`), its key store a PEM file `zookeeper-keystore.pem` in the run
directory (the private key and the certificate chain, written at each start, mode 0600; ZooKeeper's PEM key
store wants both in one file), its trust store the CA file; with `client_auth` it requires a client
certificate signed by that CA. The plaintext `port` stays open (probes, tools): ZooKeeper's digest ACLs,
not the port, keep anonymous clients out of the cluster's znodes. Readiness then checks both ports.

Ensemble (optional): with `peers` (every server's host, quorum port and election port, server 1 first) and
this server's `server_id`, zoo.cfg gets `server.N=host:quorum:election` lines, initLimit/syncLimit and the data
dir a `myid` file; the server then serves only while a quorum (a majority of the peers) has elected a leader, so
readiness (a kazoo client reads `/`) means "in a quorum". `mode()` asks the server itself (the `srvr` four-letter
word): "leader", "follower", "standalone", or "" when it is not serving.

Session timeouts are clamped by the server to [2, 20] x tick_time_ms (the upper bound `max_session_timeout_ms`
when given), so a short tick (tests use ~200 ms) lets a client ask for a session that expires in about a second.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import time

from bksim.adapters import processes
from bksim.adapters.zk_client import OPEN, ZkSecurity, ZkTls, new_client
from bksim.model.errors import BksimError

JAVA_DIR = "/usr/share/java"
ZOOKEEPER_JAR = f"{JAVA_DIR}/zookeeper.jar"
# the Netty connection factory (the TLS port) needs these beside the jars zookeeper.jar's manifest names
NETTY_JARS = (f"{JAVA_DIR}/netty-codec.jar", f"{JAVA_DIR}/netty-resolver.jar")
SLF4J_SIMPLE_JAR = f"{JAVA_DIR}/slf4j-simple.jar"  # optional: without a binding the server logs nothing
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,envi,conf,cons"  # `envi` is needed by KazooClient.server_version()


INIT_LIMIT_TICKS = 10  # a follower has this many ticks to connect and sync to a new leader
SYNC_LIMIT_TICKS = 5  # a follower this many ticks behind the leader is dropped (and a leader without a quorum of
# followers within it gives up leadership)
MODE_PROBE_TIMEOUT_S = 2.0


class ZooKeeperError(BksimError):
    """ZooKeeper could not be started or did not become ready (the message carries its log tail)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Peer:
    """One server of an ensemble as every server's zoo.cfg names it (`server.<server_id>=host:quorum:election`)."""
    server_id: int
    host: str
    quorum_port: int
    election_port: int

    def line(self) -> str:
        return f"server.{self.server_id}={self.host}:{self.quorum_port}:{self.election_port}"


class ZooKeeperServer:
    """One standalone ZooKeeper process bound to `host:port`, data under `data_dir`.

    `zoo.cfg` and (by default) the pid file live in the parent of `data_dir` (the run directory).
    """

    def __init__(self, host: str, port: int, data_dir: str, tick_time_ms: int, heap_mb: int, log_path: str,
                 pid_path: str | None = None, cfg_path: str | None = None, *, secure_port: int = 0,
                 tls: ZkTls | None = None, client_auth: bool = False, security: ZkSecurity = OPEN,
                 server_id: int = 0, peers: tuple[Peer, ...] = (), max_session_timeout_ms: int = 0) -> None:
        """`tls`: the server's CA, certificate and key files (needed with `secure_port`); `security`: how the
        readiness probe connects (digest credentials; its TLS files are used on the secure port); `peers` and
        `server_id`: the ensemble this server is a member of (none: standalone); `max_session_timeout_ms`: the
        longest session the server grants (0: ZooKeeper's default, 20 ticks)."""
        if secure_port and tls is None:
            raise ZooKeeperError("a ZooKeeper secure_port needs the server's TLS files (CA, certificate, key)")
        if peers and server_id not in {p.server_id for p in peers}:
            raise ZooKeeperError(f"ZooKeeper server id {server_id} is not one of its peers' "
                                 f"({', '.join(str(p.server_id) for p in peers)})")
        self.server_id = int(server_id) if peers else 0
        self.peers = tuple(peers)
        self.host = host
        self.port = int(port)
        self.data_dir = os.path.abspath(data_dir)
        self.tick_time_ms = int(tick_time_ms)
        self.max_session_timeout_ms = int(max_session_timeout_ms)
        self.heap_mb = int(heap_mb)
        self.log_path = os.path.abspath(log_path)
        run_dir = os.path.dirname(self.data_dir)
        self.pid_path = os.path.abspath(pid_path or os.path.join(run_dir, "zookeeper.pid"))
        self.cfg_path = os.path.abspath(cfg_path or os.path.join(run_dir, "zoo.cfg"))
        self.keystore_path = os.path.join(run_dir, "zookeeper-keystore.pem")
        self.secure_port = int(secure_port)
        self.tls = tls
        self.client_auth = client_auth
        self.security = security
        self.pid: int | None = processes.read_pid(self.pid_path)

    @property
    def connect(self) -> str:
        """Connect string for clients: "host:port"."""
        return f"{self.host}:{self.port}"

    @property
    def secure_connect(self) -> str:
        """Connect string of the TLS port ("" without one)."""
        return f"{self.host}:{self.secure_port}" if self.secure_port else ""

    @property
    def name(self) -> str:
        """"zookeeper" standalone, "zookeeper-<server_id>" in an ensemble."""
        return f"zookeeper-{self.server_id}" if self.peers else "zookeeper"

    def config_text(self) -> str:
        return "\n".join(self._base_config() + self._ensemble_config() + self._tls_config() + [""])

    def _ensemble_config(self) -> list[str]:
        if not self.peers:
            return []
        return [f"initLimit={INIT_LIMIT_TICKS}", f"syncLimit={SYNC_LIMIT_TICKS}", "reconfigEnabled=false",
                *(p.line() for p in self.peers)]

    def _tls_config(self) -> list[str]:
        if not self.secure_port:
            return []
        return [
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"secureClientPort={self.secure_port}",
            f"secureClientPortAddress={self.host}",
            f"ssl.keyStore.location={self.keystore_path}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={os.path.abspath(self.tls.ca_file)}",
            "ssl.trustStore.type=PEM",
            "ssl.enabledProtocols=TLSv1.3,TLSv1.2",
            f"ssl.clientAuth={'need' if self.client_auth else 'none'}",
            "ssl.hostnameVerification=false",  # of clients: a client certificate names a role, not the client's host
        ]

    def _base_config(self) -> list[str]:
        return [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
            "preAllocSize=4096",  # KiB: 4 MiB transaction-log preallocation instead of 64 MiB
        ] + ([f"maxSessionTimeout={self.max_session_timeout_ms}"] if self.max_session_timeout_ms else [])

    def command(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperError("java not found: install the zookeeper package (`make deps`)")
        if not os.path.exists(ZOOKEEPER_JAR):
            raise ZooKeeperError(f"{ZOOKEEPER_JAR} not found: install Debian's zookeeper package (`make deps`)")
        classpath = [ZOOKEEPER_JAR] + [jar for jar in (*NETTY_JARS, SLF4J_SIMPLE_JAR) if os.path.exists(jar)]
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
        self.write_config()
        if self.secure_port:
            self._write_keystore()
        argv = self.command()
        self.pid = processes.spawn(argv, None, self.log_path, self.pid_path)
        return self.pid

    def write_config(self) -> None:
        """zoo.cfg, and in an ensemble the data dir's `myid` (this server's id)."""
        with open(self.cfg_path, "w") as f:
            f.write(self.config_text())
        if self.peers:
            with open(os.path.join(self.data_dir, "myid"), "w") as f:
                f.write(f"{self.server_id}\n")

    def mode(self, timeout_s: float = MODE_PROBE_TIMEOUT_S) -> str:
        """What the server says it is (`srvr`): "leader", "follower", "standalone"; "" when it does not answer or
        is not serving (no quorum)."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout_s) as sock:
                sock.sendall(b"srvr")
                reply = b""
                while len(reply) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return ""
        for line in reply.decode("utf-8", "replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def _write_keystore(self) -> None:
        """The PEM key store ZooKeeper reads: private key then certificate chain, one file, mode 0600."""
        try:
            with open(self.tls.key_file, "rb") as f:
                key = f.read()
            with open(self.tls.cert_file, "rb") as f:
                chain = f.read()
        except OSError as e:
            raise ZooKeeperError(f"cannot read ZooKeeper's TLS files: {e.strerror or e} ({e.filename})") from None
        tmp = f"{self.keystore_path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.rstrip(b"\n") + b"\n" + chain)
        os.replace(tmp, self.keystore_path)

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until a kazoo client can read `/` (on the TLS port too, when there is one). Returns the seconds
        waited; raises ZooKeeperError."""
        started = time.monotonic()
        deadline = started + timeout_s
        plain = dataclasses.replace(self.security, tls=None)
        self._wait_serving(self.connect, plain, deadline, timeout_s)
        if self.secure_port:
            secure = self.security if self.security.tls is not None else dataclasses.replace(
                self.security, tls=dataclasses.replace(self.tls, check_hostname=False))
            self._wait_serving(self.secure_connect, secure, deadline, timeout_s)
        return time.monotonic() - started

    def _wait_serving(self, hosts: str, security: ZkSecurity, deadline: float, timeout_s: float) -> None:
        from kazoo.handlers.threading import KazooTimeoutError

        quiet = logging.getLogger("bksim.zookeeper.probe")
        quiet.setLevel(logging.CRITICAL)
        while True:
            if self.pid is not None and not processes.is_alive(self.pid):
                raise ZooKeeperError(f"ZooKeeper (pid {self.pid}) exited during start-up; "
                                     f"log {self.log_path}:\n{processes.tail(self.log_path)}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ZooKeeperError(f"ZooKeeper at {hosts} not ready after {timeout_s:.1f}s; "
                                     f"log {self.log_path}:\n{processes.tail(self.log_path)}")
            client = new_client(hosts, security, timeout=min(2.0, max(0.2, remaining)),
                                connection_retry={"max_tries": 0}, logger=quiet)
            try:
                client.start(timeout=min(1.0, max(0.1, remaining)))
                client.get("/")
                return
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
