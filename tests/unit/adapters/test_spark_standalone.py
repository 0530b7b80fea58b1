"""The Spark standalone launcher's configuration and command lines (adapters/spark_standalone.py), without starting a
JVM: loopback only, the port runs, the worker's offer, the run-directory marker that guards every signal."""
from __future__ import annotations

import os

import pytest

from bksim.adapters import spark_standalone as ss


def cluster(tmp_path, **kw) -> ss.StandaloneCluster:
    return ss.StandaloneCluster(ss.StandaloneConfig(run_dir=str(tmp_path / "spark"), **kw))


def after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_daemon_binds_loopback_on_its_port_of_the_run(tmp_path):
    c = cluster(tmp_path, port=17077, ui_port=18090, workers=2)
    master = c.master_command()
    assert master[master.index(ss.MASTER_CLASS) + 1:] == ["--host", "127.0.0.1", "--port", "17077", "--webui-port",
                                                          "18090"]
    worker = c.worker_command(2)
    assert (after(worker, "--host"), after(worker, "--port"), after(worker, "--webui-port")) == \
        ("127.0.0.1", "17079", "18092")
    assert (after(worker, "--cores"), after(worker, "--memory"), worker[-1]) == \
        ("1", "1024m", "spark://127.0.0.1:17077")
    assert after(worker, "--work-dir") == os.path.join(c.run_dir, "worker-2")
    for argv in (master, worker):
        assert c.marker in argv and "-Dspark.master.rest.enabled=false" in argv
        assert "-Dspark.port.maxRetries=0" in argv  # a busy port fails the daemon, not moves it
        assert after(argv, "-cp").endswith("/jars/*")
    env = c.environment()
    assert (env["SPARK_LOCAL_IP"], env["SPARK_SCALA_VERSION"]) == ("127.0.0.1", "2.13")
    assert c.config.status_url == "http://127.0.0.1:18090/json/"


@pytest.mark.parametrize("kw, message", [
    ({"host": "0.0.0.0"}, "loopback"),
    ({"workers": 0}, "workers 0"),
    ({"worker_memory_mb": 512}, "must be >= 1024 MiB"),
    ({"port": 7077, "ui_port": 7079}, "overlap"),
    ({"port": 65535}, "must be TCP ports"),
])
def test_a_shape_that_cannot_work_is_refused(tmp_path, kw, message):
    with pytest.raises(ss.SparkStandaloneError, match=message):
        cluster(tmp_path, **kw)


def test_worker_memory_in_spark_notation():
    assert [ss.parse_memory_mb(t) for t in ("1g", "1536m", "2048", "2G")] == [1024, 1536, 2048, 2048]
    with pytest.raises(ss.SparkStandaloneError):
        ss.parse_memory_mb("lots")


def test_down_signals_no_pid_without_the_run_marker_and_needs_a_run_directory(tmp_path):
    with pytest.raises(ss.SparkStandaloneError, match="cluster.json not found"):
        ss.StandaloneCluster.from_run_dir(str(tmp_path / "none"))
    c = cluster(tmp_path, workers=1)
    os.makedirs(c.run_dir)
    with open(c.pid_path("master"), "w") as f:
        f.write(f"{os.getpid()}\n")  # a stale pid file naming a live process that is no daemon of this run
    assert c.running() == {"master": None, "worker-1": None}
    assert c.stop() == {"worker-1": None, "master": None}  # we are still here
    assert not os.path.exists(c.pid_path("master"))
