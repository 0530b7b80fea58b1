"""A Spark standalone cluster on this machine's loopback: one master and N workers, from the PySpark
installation's own jars, started and stopped by pid. `bksim audit cluster up|down|status` and the tests use it;
`bksim audit --master spark://127.0.0.1:PORT` then runs the audit's executors in the worker processes.

Owns:
- the JVM command lines: `java -Xmx<daemon heap> <the module options Spark's own launcher adds on Java 17>
  -cp <pyspark>/conf:<pyspark>/jars/* org.apache.spark.deploy.master.Master --host 127.0.0.1 --port PORT
  --webui-port UI_PORT` and `... org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --port PORT+i
  --webui-port UI_PORT+i --cores C --memory M --work-dir RUN_DIR/worker-i spark://127.0.0.1:PORT` (the pip
  package has no start-master.sh: its sbin/ only has the connect and history servers);
- the run directory: `cluster.json` (the configuration, so `down` and `status` need only the directory),
  `master.pid`/`master.log`, `worker-<i>.pid`/`worker-<i>.log`, `worker-<i>/` (the worker's work directory:
  one directory per application and executor, with the executor's stdout/stderr and the files the driver
  shipped) and `worker-<i>/local` (the executors' spark.local.dir);
- readiness: the master's JSON status (`http://127.0.0.1:UI_PORT/json/`) says the master is ALIVE (only then are
  the workers started), then lists exactly `workers` ALIVE workers, both within one deadline (a daemon that
  exits meanwhile fails the wait at once, with its log's tail);
- stopping: SIGTERM by pid (workers first, their executors with them, then the master), SIGKILL after a bound.

Loopback only: every daemon gets `--host 127.0.0.1` and SPARK_LOCAL_IP=127.0.0.1 (the executors a worker starts
inherit it); the master's REST submission server (port 6066) is off; the ports are PORT (master), PORT+i (worker
i's RPC), UI_PORT (master web UI, its JSON status) and UI_PORT+i (worker i's web UI), each taken as given or
the daemon fails (spark.port.maxRetries=0: Spark would otherwise move to the next port, away from the one the
workers and the readiness check use). Executors run the Python the driver names (PySpark sends it with each
task: `bksim audit` sets PYSPARK_PYTHON to its own interpreter, this venv's, which has crc32c); the bksim package
reaches them as a zip (audit/spark.py).

Must not: signal a pid whose command line lacks this run directory's marker (`-Dbksim.spark.run_dir=...`), so a
stale pid file whose pid was reused is never signalled; bind anything outside 127.0.0.0/8.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from bksim.adapters import processes
from bksim.model.errors import BksimError

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
PORT_DEFAULT = 7077  # Spark's own default master port
UI_PORT_DEFAULT = 8090  # not Spark's 8080: `make up` gives broker i HTTP port 8080 + i - 1
WORKERS_DEFAULT = 2
WORKERS_MAX = 16  # a laptop cluster: each worker is a JVM of DAEMON_HEAP_MB plus its executors
WORKER_CORES_DEFAULT = 1  # this machine has 2 cores and other work runs on it
EXECUTOR_MEMORY_MB = 1024  # Spark's spark.executor.memory default: a worker with less never gets an executor
WORKER_MEMORY_DEFAULT = "1g"
DAEMON_HEAP_MB = 256  # master's and workers' own heap (Spark's default is 1 GiB): they only schedule
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 2.0  # one GET of the master's JSON status
POLL_INTERVAL_S = 0.2
# what Spark's launcher (org.apache.spark.launcher.JavaModuleOptions) adds to every JVM it starts on Java 17+
JAVA_MODULE_OPTIONS = (
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-modules=jdk.incubator.vector",
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang", "java.base/java.lang.invoke", "java.base/java.lang.reflect", "java.base/java.io",
        "java.base/java.net", "java.base/java.nio", "java.base/java.util", "java.base/java.util.concurrent",
        "java.base/java.util.concurrent.atomic", "java.base/jdk.internal.ref", "java.base/sun.nio.ch",
        "java.base/sun.nio.cs", "java.base/sun.security.action", "java.base/sun.util.calendar",
        "java.security.jgss/sun.security.krb5")),
    "-Dio.netty.tryReflectionSetAccessible=true",
)
MARKER_PROPERTY = "bksim.spark.run_dir"
CONFIG_FILE = "cluster.json"


class SparkStandaloneError(BksimError):
    """The Spark standalone cluster could not be configured, started, reached or stopped (the message says
    which daemon, with its log's tail)."""


def parse_memory_mb(text: str) -> int:
    """Spark's memory notation for a worker: '1g' -> 1024, '1536m' -> 1536, '2048' (MiB) -> 2048."""
    m = re.fullmatch(r"\s*(\d+)\s*([mMgG]?)[bB]?\s*", text)
    if m is None:
        raise SparkStandaloneError(f"memory {text!r}: a number of MiB with an optional unit m or g (e.g. 1g)")
    value = int(m.group(1)) * (1024 if m.group(2).lower() == "g" else 1)
    return value


@dataclass(frozen=True, slots=True)
class StandaloneConfig:
    """One cluster's shape. Validated on construction; `port`/`ui_port` are the bases of runs of workers + 1."""

    run_dir: str
    port: int = PORT_DEFAULT
    ui_port: int = UI_PORT_DEFAULT
    workers: int = WORKERS_DEFAULT
    worker_cores: int = WORKER_CORES_DEFAULT
    worker_memory_mb: int = EXECUTOR_MEMORY_MB
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if not self.host.startswith("127."):
            raise SparkStandaloneError(f"host {self.host}: the standalone cluster binds loopback (127.0.0.0/8) only")
        if not 1 <= self.workers <= WORKERS_MAX:
            raise SparkStandaloneError(f"workers {self.workers}: must be in 1..{WORKERS_MAX}")
        if self.worker_cores < 1:
            raise SparkStandaloneError(f"worker cores {self.worker_cores}: must be >= 1")
        if self.worker_memory_mb < EXECUTOR_MEMORY_MB:
            raise SparkStandaloneError(f"worker memory {self.worker_memory_mb} MiB: must be >= {EXECUTOR_MEMORY_MB} "
                                       "MiB, an executor's memory (a smaller worker never runs one)")
        for name, base in (("port", self.port), ("ui port", self.ui_port)):
            if not 1 <= base <= 65535 - self.workers:
                raise SparkStandaloneError(f"{name} {base}: {base}..{base + self.workers} must be TCP ports")
        if abs(self.port - self.ui_port) <= self.workers:
            raise SparkStandaloneError(f"ports {self.port}.. and ui ports {self.ui_port}.. overlap")
        object.__setattr__(self, "run_dir", os.path.abspath(self.run_dir))

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's JSON status (workers, applications)."""
        return f"http://{self.host}:{self.ui_port}/json/"


def spark_home() -> str:
    """The PySpark installation's directory (its jars/ is Spark's)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.origin:
        raise SparkStandaloneError("pyspark is not installed in this Python (`make deps`)")
    home = os.path.dirname(spec.origin)
    if not os.path.isdir(os.path.join(home, "jars")):
        raise SparkStandaloneError(f"{home}/jars not found: a pyspark installation without Spark's jars")
    return home


def scala_version(home: str) -> str:
    """The Scala version of the installation's spark-core jar ("2.13"). A worker builds its executors' command
    lines with Spark's launcher, which needs SPARK_SCALA_VERSION where there are no build directories (what
    bin/load-spark-env.sh exports for spark-submit)."""
    for name in sorted(os.listdir(os.path.join(home, "jars"))):
        m = re.fullmatch(r"spark-core_(\d+\.\d+)-.*\.jar", name)
        if m:
            return m.group(1)
    raise SparkStandaloneError(f"{home}/jars has no spark-core_<scala version>-*.jar")


class StandaloneCluster:
    """A master and `config.workers` workers, their pid files and logs under `config.run_dir`."""

    def __init__(self, config: StandaloneConfig) -> None:
        self.config = config
        self.run_dir = config.run_dir

    @classmethod
    def from_run_dir(cls, run_dir: str) -> "StandaloneCluster":
        """The cluster `up` wrote to `run_dir` (its cluster.json)."""
        path = os.path.join(os.path.abspath(run_dir), CONFIG_FILE)
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            raise SparkStandaloneError(f"{path} not found: no Spark standalone cluster was started there") from None
        except (OSError, ValueError) as e:
            raise SparkStandaloneError(f"{path}: unreadable ({e})") from None
        fields = {f.name for f in dataclasses.fields(StandaloneConfig)}
        return cls(StandaloneConfig(**{k: v for k, v in doc.items() if k in fields}))

    # -- files ----------------------------------------------------------------------------------------------
    def pid_path(self, name: str) -> str:
        return os.path.join(self.run_dir, f"{name}.pid")

    def log_path(self, name: str) -> str:
        return os.path.join(self.run_dir, f"{name}.log")

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.config.workers + 1)]

    @property
    def marker(self) -> str:
        """In every daemon's command line: what a pid must show before it is signalled."""
        return f"-D{MARKER_PROPERTY}={self.run_dir}"

    # -- command lines --------------------------------------------------------------------------------------
    def _java(self, main_class: str, args: list[str]) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise SparkStandaloneError("java not found: Spark needs a Java 17+ runtime (`make deps`)")
        home = spark_home()
        classpath = f"{home}/conf:{home}/jars/*"
        return [java, f"-Xmx{DAEMON_HEAP_MB}m", *JAVA_MODULE_OPTIONS, "-Djava.net.preferIPv4Stack=true",
                "-Dspark.master.rest.enabled=false", "-Dspark.port.maxRetries=0", self.marker, "-cp", classpath,
                main_class, *args]

    def master_command(self) -> list[str]:
        c = self.config
        return self._java(MASTER_CLASS, ["--host", c.host, "--port", str(c.port), "--webui-port", str(c.ui_port)])

    def worker_command(self, i: int) -> list[str]:
        """Worker `i` (1-based)."""
        c = self.config
        return self._java(WORKER_CLASS, [
            "--host", c.host, "--port", str(c.port + i), "--webui-port", str(c.ui_port + i),
            "--cores", str(c.worker_cores), "--memory", f"{c.worker_memory_mb}m",
            "--work-dir", os.path.join(self.run_dir, f"worker-{i}"), c.master_url])

    def environment(self, local_dir: str | None = None) -> dict[str, str]:
        """The daemons' environment: loopback, Spark's home, the driver's Python for executors' workers."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        home = spark_home()
        env.update({"SPARK_HOME": home, "SPARK_SCALA_VERSION": scala_version(home),
                    "SPARK_LOCAL_IP": self.config.host, "PYSPARK_PYTHON": sys.executable})
        if local_dir is not None:
            env["SPARK_LOCAL_DIRS"] = local_dir
        return env

    # -- lifecycle ------------------------------------------------------------------------------------------
    def running(self) -> dict[str, int | None]:
        """Daemon name -> its pid when that process runs (with this run's marker), else None."""
        out: dict[str, int | None] = {}
        for name in ["master", *self.worker_names()]:
            pid = processes.read_pid(self.pid_path(name))
            out[name] = pid if processes.is_alive(pid, self.marker) else None
        return out

    def up(self, timeout_s: float = READY_TIMEOUT_S) -> dict[str, int]:
        """Write cluster.json, start the master, wait until it answers ALIVE, start the workers, wait until it
        lists them all ALIVE (a worker that registers before the master has taken leadership is only taken on
        its retry, seconds later). Returns name -> pid; on failure stops what it started and raises
        SparkStandaloneError (also when a daemon of this run directory already runs)."""
        already = {name: pid for name, pid in self.running().items() if pid}
        if already:
            raise SparkStandaloneError(f"a Spark standalone cluster already runs from {self.run_dir}: {already} "
                                       "(`bksim audit cluster down` first)")
        deadline = time.monotonic() + timeout_s
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, CONFIG_FILE), "w") as f:
            json.dump(dataclasses.asdict(self.config), f, indent=1)
        try:
            with processes.interrupts_deferred():
                pids = {"master": processes.spawn(self.master_command(), self.environment(), self.log_path("master"),
                                                  self.pid_path("master"), cwd=self.run_dir)}
            self._wait(["master"], lambda status: status.get("status") == "ALIVE", "answer ALIVE", deadline)
            for i, name in enumerate(self.worker_names(), start=1):
                local_dir = os.path.join(self.run_dir, name, "local")
                os.makedirs(local_dir, exist_ok=True)
                with processes.interrupts_deferred():
                    pids[name] = processes.spawn(self.worker_command(i), self.environment(local_dir),
                                                 self.log_path(name), self.pid_path(name), cwd=self.run_dir)
            self._wait(list(self.running()), lambda status: self.alive_workers(status) == self.config.workers,
                       f"list {self.config.workers} ALIVE workers", deadline)
        except BaseException:
            self.stop()
            raise
        return pids

    def _wait(self, names: list[str], ready, what: str, deadline: float) -> None:
        """Poll the master's JSON status until `ready(status)`; fail at once if a daemon of `names` exits."""
        while True:
            running = self.running()
            for name in names:
                if running[name] is None:
                    raise SparkStandaloneError(f"Spark {name} exited during start-up; log {self.log_path(name)}:\n"
                                               f"{processes.tail(self.log_path(name))}")
            status = self.status()
            if status is not None and ready(status):
                return
            if time.monotonic() >= deadline:
                raise SparkStandaloneError(f"Spark master {self.config.master_url} did not {what} in time "
                                           f"({self.alive_workers(status)} ALIVE workers); log "
                                           f"{self.log_path('master')}:\n{processes.tail(self.log_path('master'))}")
            time.sleep(POLL_INTERVAL_S)

    def status(self) -> dict | None:
        """The master's JSON status, or None when it does not answer."""
        try:
            with urllib.request.urlopen(self.config.status_url, timeout=STATUS_TIMEOUT_S) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def alive_workers(self, status: dict | None) -> int:
        """ALIVE workers in a JSON status (0 without one)."""
        if not status:
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, int | None]:
        """SIGTERM the workers (their executors go with them) then the master, by pid, SIGKILL after `timeout_s`;
        removes the pid files of those gone. Returns name -> the pid stopped (None: none ran). Raises
        SparkStandaloneError when one is still running at the end."""
        running = self.running()
        stopped: dict[str, int | None] = {}
        left = []
        for name in [*self.worker_names(), "master"]:
            pid = running[name]
            if pid is not None and not processes.stop(pid, timeout_s, self.marker):
                left.append(f"{name} (pid {pid})")
                continue
            processes.remove_pid(self.pid_path(name))  # gone now, or a stale file naming no daemon of ours
            stopped[name] = pid
        if left:
            raise SparkStandaloneError(f"still running after SIGKILL: {', '.join(left)}")
        return stopped
