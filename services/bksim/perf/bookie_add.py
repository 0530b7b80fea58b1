"""bookie-add: AddEntries batches against one real bookie process, compared with grpc-baseline.

Starts a real ZooKeeper and one `bksim bookie run` process (perf.ledger_write.LedgerCluster without a broker,
everything under the benchmark's temp dir), waits until the bookie's gRPC health says SERVING, then streams AddRequests through
bookie_client.AddStream with the same window, batch size, record size and entry factory as grpc-baseline
(`grpc_baseline.drive`), and waits for every ack. OK means the entry is durable (journal fsync). The
bookie is stopped with SIGTERM (drain + checkpoint; its stop time is reported), then ZooKeeper, by pid.

The bookie's resident set is read from /proc as it becomes SERVING and again when every ack is in (VmRSS, and
VmHWM: its peak over its whole life, start-up included): target peak <= its write cache + RSS_SLACK_MB, over a
sustained run (`make perf` runs 60 s for it), since the write cache is the one memory a bookie holds by design.

`measure_against_baseline` is the whole benchmark (`bksim perf bookie-add`, and the bookie-add row of `bksim perf
targets`): grpc-baseline, then the bookie, with the same record size, batch and window; the ratio and the targets.

Target on this machine: >= 0.6x grpc-baseline's records/s at the same batch size (1 KiB x 100).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time
from typing import Callable

from bksim.adapters import processes
from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.local_cluster import Node
from bksim.gen import bookie_pb2
from bksim.model.config import Config
from bksim.model.errors import BookieUnreachable
from bksim.perf import grpc_baseline
from bksim.perf.grpc_baseline import RESPONSE_TIMEOUT_S, EntryFactory, drive, drive_result
from bksim.perf.machine import process_cpu_s, process_memory_bytes
from bksim.perf.ledger_write import LedgerCluster
from bksim.perf.metrics_cost import Scraper
from bksim.perf.procs import Child, ProcessGroup, run_interruptible
from bksim.perf.stats import MB, Ratio, Result, ratio

TARGET_RATIO = 0.6  # bookie-add records/s over grpc-baseline's, same run, record size, batch and window
BOOKIE_READY_TIMEOUT_S = 60.0
LEDGER_ID = 7
RSS_SLACK_MB = 150.0  # the bookie's peak RSS may exceed its write cache by this much
PY_SPY_WAIT_S = 90.0  # py-spy stops by itself after the measurement's duration; wait this long at most


def measure_against_baseline(workdir: str, record_bytes: int, batch: int, inflight: int, seconds: float,
                             records_max: int, idle_guard: Callable[[str], float], config: Config,
                             config_path: str | None = None, py_spy_out: str | None = None,
                             keep: bool = False) -> tuple[list[Result], list[Ratio], list[dict]]:
    """grpc-baseline, then `measure`, one after the other with the same shape: [baseline, bookie-add], the ratio
    bookie-add / grpc-baseline against TARGET_RATIO, and the memory target."""
    base = grpc_baseline.measure(workdir, record_bytes, batch, inflight, seconds, records_max, idle_guard)
    subject = measure(workdir, record_bytes, batch, inflight, seconds, records_max, idle_guard, config,
                      config_path=config_path, py_spy_out=py_spy_out, keep=keep)
    return [base, subject], [ratio(subject, base, TARGET_RATIO)], targets([subject])


def measure(workdir: str, record_bytes: int, batch: int, inflight: int, seconds: float, records_max: int,
            idle_guard: Callable[[str], float], config: Config, config_path: str | None = None,
            py_spy_out: str | None = None, keep: bool = False, metrics: bool = False) -> Result:
    """Start ZooKeeper + one bookie under `workdir`, measure adds, stop both; return the figures.

    With `py_spy_out`, py-spy (installed by hand, not a dependency) samples the bookie's GIL-holding
    threads during the measurement and writes collapsed stacks (flamegraph.pl / speedscope input) there. The cluster's
    directory (a fresh one per call) is removed afterwards unless `keep`, so repeated runs start alike. With
    `metrics`, the bookie serves HTTP and its /metrics is scraped during the measurement (perf/metrics_cost.py;
    the result is named "bookie-add-metrics").
    """
    group = ProcessGroup()  # py-spy, when asked for
    scraper = None
    with LedgerCluster(workdir, 1, config, config_path, keep, brokers=0, http=metrics) as cluster:
        try:
            bookie = cluster.bookies[0]
            profiler = _profiler(group, bookie, py_spy_out, seconds, cluster.run_dir)
            if metrics:
                scraper = Scraper([bookie.http_port], "bookkeeper_server_ADD_ENTRY_REQUEST")
            result, bookie_cpu_s, idle, memory = run_interruptible(_measure(
                bookie, record_bytes, batch, inflight, seconds, records_max, idle_guard, profiler, scraper))
            server_pid, zk_pid = bookie.pid, cluster.zookeeper.pid
            stop_started = time.monotonic()
            stopped = cluster.stop(bookie)
            stop_s = time.monotonic() - stop_started
        finally:
            group.stop_all()
    out = drive_result("bookie-add-metrics" if metrics else "bookie-add", record_bytes, batch, inflight, result,
                       idle, bookie_cpu_s)
    if scraper is not None:
        if scraper.errors or not scraper.scrapes:
            raise RuntimeError(f"/metrics scrapes failed ({scraper.scrapes} done): {scraper.errors[:3]}")
        out.extra.update(scraper.extra())
    out.extra.update(memory)
    out.extra["write_cache_mb"] = config.bookie.write_cache_bytes_max / MB
    out.extra["bookie_stop_s"] = stop_s if stopped else -1.0
    out.extra["server_pid"] = server_pid  # both stopped before measure() returns
    out.extra["zookeeper_pid"] = zk_pid
    return out


def _profiler(group: ProcessGroup, bookie: Node, out: str | None, seconds: float,
              run_dir: str) -> Callable[[], Child] | None:
    """A function that starts py-spy on the bookie (None without `out`)."""
    if not out:
        return None
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        raise RuntimeError("--py-spy needs py-spy: install it by hand (.venv/bin/pip install py-spy)")
    duration_s = max(1, int(seconds)) if seconds > 0 else 60
    argv = [py_spy, "record", "-p", str(bookie.pid), "-d", str(duration_s), "-r", "250", "--threads", "--gil",
            "--nonblocking", "-f", "raw", "-o", os.path.abspath(out)]
    return lambda: group.spawn("py-spy", argv, os.path.join(run_dir, "py-spy.log"))


async def _measure(bookie: Node, record_bytes: int, batch: int, inflight: int, seconds: float,
                   records_max: int, idle_guard: Callable[[str], float], profiler: Callable[[], Child] | None,
                   scraper: Scraper | None = None):
    async with BookieClient(bookie.address, deadline_s=RESPONSE_TIMEOUT_S) as client:
        await wait_serving(client, bookie)
        rss_serving = process_memory_bytes(bookie.pid)["rss"]
        idle = idle_guard("bookie-add")
        spy = profiler() if profiler else None
        cpu_start = process_cpu_s(bookie.pid)
        stream = client.add_stream(window_max=inflight, response_timeout_s=RESPONSE_TIMEOUT_S)
        try:
            with scraper or contextlib.nullcontext():
                result = await drive(stream, bookie_pb2.AddRequest, EntryFactory(record_bytes, LEDGER_ID), batch,
                                     seconds, records_max)
        except BookieUnreachable as e:
            raise RuntimeError(f"bookie (pid {bookie.pid}) stream broke: {e}; its log:\n{bookie.log_tail()}") from None
        cpu_s = process_cpu_s(bookie.pid) - cpu_start
        memory = process_memory_bytes(bookie.pid)
    if spy is not None and not processes.wait_exit(spy.pid, PY_SPY_WAIT_S):
        print(f"# py-spy (pid {spy.pid}) still running after {PY_SPY_WAIT_S:.0f} s: stopping it", file=sys.stderr)
    return result, cpu_s, idle, {"bookie_rss_serving_mb": rss_serving / MB, "bookie_rss_end_mb": memory["rss"] / MB,
                                 "bookie_rss_peak_mb": memory["peak"] / MB}


def targets(results: list[Result]) -> list[dict]:
    """The memory target of each bookie-add row: peak RSS <= write cache + RSS_SLACK_MB."""
    out = []
    for r in results:
        if "bookie_rss_peak_mb" not in r.extra:
            continue
        bound = r.extra["write_cache_mb"] + RSS_SLACK_MB
        out.append({"target": f"{r.name}: bookie peak RSS <= write cache + {RSS_SLACK_MB:g} MB",
                    "value": f"peak {r.extra['bookie_rss_peak_mb']:.0f} MB (serving {r.extra['bookie_rss_serving_mb']:.0f}"
                             f", end {r.extra['bookie_rss_end_mb']:.0f}) after {r.elapsed_s:.0f} s of adds; bound "
                             f"{bound:.0f} MB", "met": r.extra["bookie_rss_peak_mb"] <= bound})
    return out


async def wait_serving(client: BookieClient, bookie: Node, timeout_s: float = BOOKIE_READY_TIMEOUT_S,
                       poll_s: float = 0.1) -> None:
    """Wait (bounded) until the bookie's health check says SERVING; fail fast with its log if it exits."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        if not bookie.alive():
            raise RuntimeError(f"bookie (pid {bookie.pid}) exited during start-up; its log:\n{bookie.log_tail()}")
        try:
            await client.wait_ready(0.5)
            last = await client.health(deadline_s=1.0)
            if last == "SERVING":
                return
        except BookieUnreachable as e:
            last = str(e)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"bookie (pid {bookie.pid}) not SERVING after {timeout_s:.0f} s "
                               f"(last: {last}); its log:\n{bookie.log_tail()}")
        await asyncio.sleep(poll_s)
