"""ledger-write: appends through a real broker to a ledger on E real bookies, compared with grpc-baseline.

The cluster (`LedgerCluster`, also used by the other cluster benchmarks): adapters.local_cluster's real
ZooKeeper, E `bksim bookie run` processes and (by default) one `bksim broker run` process, under a fresh
directory in the benchmark's temp dir, every one stopped by pid whatever happens. Ready means: the broker's
health says SERVING and its ListBookies shows at least E writable bookies.

A measurement creates a ledger (E/Qw/Qa) through the broker (CreateLedger) and appends batches of `batch`
payloads of `entry_bytes` bytes on one Append stream (adapters.broker_client.AppendStream, at most
`window` requests unanswered). Every response is checked (count, and first_entry_id = the number of
entries sent before it: one writer, so ids are the append order); at the end the ledger is closed through
the broker and its last_entry_id must be the last acknowledged entry. An entry's latency is its batch's
response time:

- closed loop (no rate): the next batch goes as soon as the window has room (the maximum rate); latency
  from the moment the batch is handed to the stream to its response;
- open loop (`rate` entries/s): batch k is due at start + k * batch / rate and is sent then (or as soon as
  possible after, if the sender or the window is behind); latency is measured from the *due* time, so
  queueing anywhere (client, window, broker, bookies) shows in the figures instead of silently slowing the
  sender (no coordinated omission). Batches still unsent when the time bound ends are counted
  (`entries_unsent_behind_schedule`): then the rate was not sustained.

CPU: seconds used during the measurement by the broker, the bookies (sum and busiest), ZooKeeper and the
client (this process), as cores (CPU seconds / elapsed), plus the whole machine's busy cores and what of
them none of these used (`others_cpu_cores`: the idle guard checks only the start; on a shared machine
this says whether someone else took CPU during the measurement; both are None when /proc/stat did not
advance during a short run).

`measure_against_baseline` is the whole benchmark (`bksim perf ledger-write`, and the ledger-write rows of
`bksim perf targets`): grpc-baseline (perf/grpc_baseline.py, with the entry size, batch and window of the closed
loop) when a closed loop is asked for, then the cluster's measurements; the ratio and the targets.

Targets (1 KiB entries, with every process on this machine's 2 cores): closed loop >= 0.18x grpc-baseline's
records/s measured in the same run (TARGET_RATIO), and p99 <= 15 ms in the open loop at half the closed-loop
rate of the same run (the `both` mode). `targets()` states each verdict.
"""
from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from bksim.adapters.broker_client import BrokerCallError, BrokerClient
from bksim.adapters.local_cluster import LocalCluster, Node
from bksim.adapters.ports import free_port
from bksim.model.config import Config
from bksim.perf import grpc_baseline
from bksim.perf.machine import idle_fraction, read_cpu_times
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Ratio, Result, make_result, ratio
from bksim.security.kit import SecurityKit

PASSWORD = b"bksim-perf"
TARGET_RATIO = 0.18  # closed-loop entries/s over grpc-baseline's records/s, same run, entry size, batch and window
TARGET_ENTRY_BYTES = 1024
TARGET_P99_MS = 15.0  # open loop, at ...
TARGET_P99_RATE_FRACTION = 0.5  # ... this fraction of the closed-loop entries/s of the same run
ZOOKEEPER_READY_TIMEOUT_S = 60.0
CLUSTER_READY_TIMEOUT_S = 90.0  # bookies and broker started together on a busy 2-core machine
RESPONSE_TIMEOUT_S = 30.0  # an append response slower than this breaks the run
CALL_DEADLINE_S = 30.0  # unary broker calls (create, close, metadata)
WINDOW_DEFAULT = 16  # unanswered AppendRequests on the stream
BATCH_DEFAULT = 100  # payloads per AppendRequest
FUTURES_PRUNE_AT = 4096  # keep the list of outstanding futures short


# ---------------------------------------------------------------------------------------------- the cluster
class LedgerCluster(LocalCluster):
    """ZooKeeper + `bookies` bookie processes + `brokers` broker processes under a fresh directory in `workdir`;
    `child_env`: BKSIM_ overrides for every bookie and broker.

    Use as a context manager: `__enter__` starts everything (not waiting for readiness: `await
    wait_serving(client)`), `__exit__` stops every child by pid and removes the directory unless `keep`.
    """

    def __init__(self, workdir: str, bookies: int, config: Config, config_path: str | None = None,
                 keep: bool = False, brokers: int = 1, child_env: dict[str, str] | None = None,
                 tls: bool = False, auth: bool = False, http: bool = False) -> None:
        if bookies < 1:
            raise ValueError(f"a cluster needs at least 1 bookie, got {bookies}")
        run_dir = tempfile.mkdtemp(prefix="cluster-", dir=workdir)
        # `tls`: every gRPC link over TLS; `auth`: brokers require a token and check grants (the super-user's)
        self.kit = (SecurityKit.create(os.path.join(run_dir, "security"), tls=tls, auth=auth, zk_digest=False)
                    if tls or auth else None)
        env = {**(self.kit.child_env() if self.kit else {}), **(child_env or {})}
        super().__init__(run_dir, config_path=config_path, child_env=env,
                         tls_dir=self.kit.tls_dir if self.kit and self.kit.tls_dir else None)
        self.token = self.kit.token() if self.kit else None  # what this process's own clients present
        self.bookie_count = bookies
        self.broker_count = brokers
        self.config = config
        self.keep = keep
        self.http = http  # every bookie and broker serves HTTP (/metrics) on a free port of its own

    def __enter__(self) -> "LedgerCluster":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for failure in self.stop_all():
            print(f"# {failure} did not stop", file=sys.stderr)
        if not self.keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _start(self) -> None:
        z = self.config.zookeeper
        self.start_zookeeper(tick_time_ms=z.tick_time_ms, heap_mb=z.heap_mb, timeout_s=ZOOKEEPER_READY_TIMEOUT_S)
        for _ in range(self.bookie_count):
            port = free_port(self.host) if self.http else None
            node = self.add_bookie(env={"BKSIM_BOOKIE_HTTP_PORT": str(port)} if port else None)
            node.http_port = port
            self.spawn(node)
        for _ in range(self.broker_count):
            self.spawn_broker()

    def spawn_broker(self) -> Node:
        """Start one more `bksim broker run` on this cluster (perf failover runs two)."""
        port = free_port(self.host) if self.http else None
        node = self.add_broker(env={"BKSIM_BROKER_HTTP_PORT": str(port)} if port else None)
        node.http_port = port
        self.spawn(node)
        return node

    @property
    def security_suffix(self) -> str:
        """"" for a plain cluster, "-tls", "-auth" or "-tls-auth": appended to its results' names."""
        if self.kit is None:
            return ""
        return ("-tls" if self.kit.tls_dir else "") + ("-auth" if self.kit.auth else "")

    def broker_client(self, **kwargs) -> BrokerClient:
        """A BrokerClient of the first broker with this cluster's TLS files and token."""
        return BrokerClient(self.broker_address, tls=self.tls, token=self.token, **kwargs)

    @property
    def broker(self) -> Node:
        return self.brokers[0]

    @property
    def broker_address(self) -> str:
        return self.broker.address

    @property
    def bookie_ids(self) -> list[str]:
        return [b.node_id for b in self.bookies]

    @property
    def journal_dirs(self) -> list[str]:
        return [b.journal_dir for b in self.bookies]

    def pids(self) -> dict[str, object]:
        """The pids of the broker, the bookies and ZooKeeper for a report (kept after they stopped)."""
        return {"broker_pid": self.last_pids.get(self.broker.name) if self.brokers else None,
                "bookie_pids": ",".join(str(self.last_pids.get(b.name)) for b in self.bookies),
                "zookeeper_pid": self.last_pids.get("zookeeper")}

    def servers(self) -> list[Node]:
        """The brokers and the bookies (the processes whose CPU is reported)."""
        return [*self.brokers, *self.bookies]

    def check_alive(self) -> None:
        for node in self.servers():
            if not node.alive():
                raise RuntimeError(f"{node.name} (pid {node.pid}) exited; its log:\n{node.log_tail()}")

    async def wait_serving(self, client: BrokerClient, bookies_writable: int) -> None:
        """Wait (bounded) until the broker serves and lists `bookies_writable` writable bookies."""
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        last = "nothing yet"
        while True:
            self.check_alive()
            try:
                await client.wait_ready(0.5)
                health = await client.health(deadline_s=2.0)
                if health != "SERVING":
                    last = f"broker health {health}"
                else:
                    writable = [b for b in await client.list_bookies() if b["state"] == "writable"]
                    if len(writable) >= bookies_writable:
                        return
                    last = f"{len(writable)} writable bookies of {bookies_writable}"
            except BrokerCallError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"cluster not ready after {CLUSTER_READY_TIMEOUT_S:.0f} s ({last});\n{self.logs()}")
            await asyncio.sleep(0.1)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by each server process, ZooKeeper and this process ("client")."""
        return {**super().cpu_s(), "client": time.process_time()}


@dataclass
class CpuMeter:
    """CPU use of the cluster's processes and of the whole machine between `start()` and `stop()`."""
    cluster: LedgerCluster
    _before: dict[str, float] = field(default_factory=dict)
    _machine_before: object = None

    def start(self) -> None:
        self._before = self.cluster.cpu_s()
        self._machine_before = read_cpu_times()

    def stop(self, elapsed_s: float) -> dict[str, float]:
        after = self.cluster.cpu_s()
        machine_after = read_cpu_times()
        used = {name: after[name] - self._before[name] for name in after}
        bookies = [used[c.name] for c in self.cluster.bookies]
        cores = len(os.sched_getaffinity(0))
        per_s = (lambda s: s / elapsed_s) if elapsed_s > 0 else (lambda s: 0.0)
        idle = idle_fraction(self._machine_before, machine_after)
        busy = None if idle is None else (1.0 - idle) * cores  # None: /proc/stat did not advance
        return {"broker_cpu_cores": per_s(used[self.cluster.broker.name]), "bookies_cpu_cores": per_s(sum(bookies)),
                "bookie_cpu_cores_max": per_s(max(bookies)), "zookeeper_cpu_cores": per_s(used["zookeeper"]),
                "client_cpu_cores": per_s(used["client"]), "machine_busy_cores": busy,
                "others_cpu_cores": None if busy is None else max(0.0, busy - per_s(sum(used.values())))}


# ---------------------------------------------------------------------------------------------- the driver
@dataclass
class AppendRun:
    latencies: LatencyRecorder
    elapsed_s: float  # first batch due/sent .. last response
    batches: int
    entries_acked: int
    entries_unsent: int  # open loop: entries due before the time bound but not sent by then
    schedule_lag_max_s: float  # open loop: the latest a batch was sent after its due time


async def drive_appends(stream, entry_bytes: int, batch: int, seconds: float, records_max: int,
                        rate: float | None) -> AppendRun:
    """Append on `stream` until `seconds` pass and/or `records_max` entries were sent; wait for every response.

    `rate` None: closed loop (send when the window has room). `rate` R: open loop, batch k due at
    start + k * batch / R, latency from the due time. Raises RuntimeError when a response does not match its
    request (count, first entry id) and BrokerCallError when the stream fails.
    """
    if batch <= 0:
        raise ValueError(f"batch must be > 0, got {batch}")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    if rate is not None and rate <= 0:
        raise ValueError(f"rate must be > 0 entries/s, got {rate}")
    payload = os.urandom(entry_bytes)
    full = [payload] * batch
    latencies = LatencyRecorder()
    state = {"last": 0.0, "batches": 0, "acked": 0, "mismatch": ""}
    perf_counter = time.perf_counter

    def on_done(future: asyncio.Future, t0: float, first: int, n: int) -> None:
        done_at = perf_counter()
        if future.cancelled() or future.exception() is not None:
            return  # raised below, by gather
        r = future.result()
        if (r.first_entry_id, r.count) != (first, n) and not state["mismatch"]:
            state["mismatch"] = (f"request {r.request_id}: broker answered entries {r.first_entry_id}+{r.count}, "
                                 f"expected {first}+{n}")
        state["last"] = max(state["last"], done_at)
        state["batches"] += 1
        state["acked"] += r.count
        latencies.add(done_at - t0, n)

    interval = batch / rate if rate else 0.0
    futures: list[asyncio.Future] = []
    sent = 0
    k = 0
    unsent = 0
    lag_max = 0.0
    start = perf_counter()
    deadline = start + seconds if seconds > 0 else math.inf
    while True:
        n = batch if records_max <= 0 else min(batch, records_max - sent)
        if n <= 0:
            break
        now = perf_counter()
        if rate:
            due = start + k * interval
            if due >= deadline:
                break
            if now >= deadline:  # behind schedule when time ran out: what was due is counted, not sent
                due_batches = math.ceil((deadline - due) / interval)
                unsent = due_batches * batch if records_max <= 0 else min(due_batches * batch, records_max - sent)
                break
            if due > now:
                await asyncio.sleep(due - now)
        elif now >= deadline:
            break
        future = await stream.send(full if n == batch else full[:n])
        sent_at = perf_counter()
        if rate:
            lag_max = max(lag_max, sent_at - due)
            t0 = due
        else:
            t0 = sent_at
        future.add_done_callback(lambda f, t=t0, first=sent, m=n: on_done(f, t, first, m))
        futures.append(future)
        sent += n
        k += 1
        if len(futures) > FUTURES_PRUNE_AT:
            futures = [f for f in futures if not f.done()]
    await asyncio.gather(*futures)  # raises BrokerCallError if the stream broke
    await asyncio.sleep(0)  # let the last done-callbacks run
    await stream.close()
    if state["mismatch"]:
        raise RuntimeError(f"append responses out of order: {state['mismatch']}")
    return AppendRun(latencies, state["last"] - start, state["batches"], state["acked"], unsent, lag_max)


# ---------------------------------------------------------------------------------------------- measurements
@dataclass(frozen=True)
class Shape:
    ensemble: int
    write_quorum: int
    ack_quorum: int

    def __str__(self) -> str:
        return f"E={self.ensemble} Qw={self.write_quorum} Qa={self.ack_quorum}"


def measure_against_baseline(workdir: str, shape: Shape, entry_bytes: int, batch: int, window: int, seconds: float,
                             records_max: int, rates: list[float | None], idle_guard: Callable[[str], float],
                             config: Config, config_path: str | None = None, keep: bool = False,
                             half_after_max: bool = False) -> tuple[list[Result], list[Ratio], list[dict]]:
    """grpc-baseline (same entry size, batch, and the window as its batches in flight) when `rates` has a closed
    loop (None), then `measure`: the Results ([baseline] + the cluster's), the ratio closed loop / baseline
    against TARGET_RATIO, and the targets' verdicts."""
    results: list[Result] = []
    if None in rates:  # the baseline is the denominator of the maximum rate only
        results.append(grpc_baseline.measure(workdir, entry_bytes, batch, window, seconds, records_max, idle_guard))
    results += measure(workdir, shape, entry_bytes, batch, window, seconds, records_max, rates, idle_guard, config,
                       config_path=config_path, keep=keep, half_after_max=half_after_max)
    ratios = []
    if results[0].name == "grpc-baseline":
        base = results[0]
        ratios = [ratio(r, base, TARGET_RATIO) for r in results[1:] if r.extra.get("mode") == "closed-loop"]
    return results, ratios, targets(results)


def measure(workdir: str, shape: Shape, entry_bytes: int, batch: int, window: int, seconds: float,
            records_max: int, rates: list[float | None], idle_guard: Callable[[str], float], config: Config,
            config_path: str | None = None, keep: bool = False, half_after_max: bool = False,
            tls: bool = False, auth: bool = False) -> list[Result]:
    """Start a cluster, run one measurement per entry of `rates` (None = closed loop) on a fresh ledger
    each, stop the cluster; the Results in order. With `half_after_max`, after the closed-loop run an
    open-loop run follows at half its entries/s (the "both" mode). `tls` / `auth`: the cluster is secured
    (LedgerCluster) and the results' names say so ("ledger-write-tls")."""
    with LedgerCluster(workdir, shape.ensemble, config, config_path, keep, tls=tls, auth=auth) as cluster:
        return run_interruptible(_measure_all(cluster, shape, entry_bytes, batch, window, seconds, records_max,
                                              rates, idle_guard, half_after_max))


async def _measure_all(cluster: LedgerCluster, shape: Shape, entry_bytes: int, batch: int, window: int,
                       seconds: float, records_max: int, rates: list[float | None],
                       idle_guard: Callable[[str], float], half_after_max: bool) -> list[Result]:
    results = []
    async with cluster.broker_client(deadline_s=CALL_DEADLINE_S) as client:
        await cluster.wait_serving(client, shape.ensemble)
        plan = list(rates)
        while plan:
            rate = plan.pop(0)
            result = await _measure_one(cluster, client, shape, entry_bytes, batch, window, seconds, records_max,
                                        rate, idle_guard)
            results.append(result)
            if rate is None and half_after_max:
                plan.insert(0, half_rate(result.records_per_s))
    return results


def half_rate(max_entries_per_s: float) -> float:
    """The open-loop rate of the "both" mode: half of the measured maximum (at least 1 entry/s)."""
    return max(1.0, TARGET_P99_RATE_FRACTION * max_entries_per_s)


async def _measure_one(cluster: LedgerCluster, client: BrokerClient, shape: Shape, entry_bytes: int, batch: int,
                       window: int, seconds: float, records_max: int, rate: float | None,
                       idle_guard: Callable[[str], float]) -> Result:
    name = ("ledger-write" if rate is None else "ledger-open-loop") + cluster.security_suffix
    info = await client.create_ledger(shape.ensemble, shape.write_quorum, shape.ack_quorum, password=PASSWORD)
    idle = idle_guard(name if rate is None else f"{name} at {rate:,.0f} entries/s")
    meter = CpuMeter(cluster)
    meter.start()
    stream = client.append_stream(info.ledger_id, password=PASSWORD, window_max=window,
                                  response_timeout_s=RESPONSE_TIMEOUT_S)
    try:
        run = await drive_appends(stream, entry_bytes, batch, seconds, records_max, rate)
    except BrokerCallError as e:
        await stream.close(1.0)
        raise RuntimeError(f"append stream to ledger {info.ledger_id} failed: {e};\n{cluster.logs()}") from None
    cpu = meter.stop(run.elapsed_s)
    closed = await client.close_ledger(info.ledger_id, password=PASSWORD)
    if closed.state != "CLOSED" or closed.last_entry_id != run.entries_acked - 1:
        raise RuntimeError(f"ledger {info.ledger_id} closed as {closed.state} at last_entry_id "
                           f"{closed.last_entry_id}, but {run.entries_acked} entries were acknowledged")
    extra = {"mode": "closed-loop" if rate is None else "open-loop", "ensemble": shape.ensemble,
             "write_quorum": shape.write_quorum, "ack_quorum": shape.ack_quorum, "window": window,
             "batches": run.batches, "p95_ms": run.latencies.percentile_s(95.0) * 1000.0}
    if rate is not None:
        extra["rate_target_per_s"] = rate
        extra["entries_unsent_behind_schedule"] = run.entries_unsent
        extra["schedule_lag_max_ms"] = run.schedule_lag_max_s * 1000.0
    extra.update(cpu)
    extra["ledger_id"] = info.ledger_id
    extra.update(cluster.pids())
    return make_result(name, entry_bytes, batch, run.elapsed_s, run.latencies, idle, extra)


# ---------------------------------------------------------------------------------------------- verdicts
def targets(results: list[Result]) -> list[dict]:
    """The two targets, judged on these results: [{"target", "value", "met"}] (met None = not
    established by this run). The plain closed loop is judged against the grpc-baseline of the results, when they
    have one (a secured pair has none: its closed loops are judged against each other, perf/security_cost.py); an
    open loop against the closed loop of the same cluster kind (the same name suffix: "-tls" ...)."""
    baseline = next((r for r in results if r.name == "grpc-baseline"), None)
    closed = {r.name.removeprefix("ledger-write"): r for r in results if r.extra.get("mode") == "closed-loop"}
    out = []
    for r in results:
        if r.extra.get("mode") == "closed-loop" and r.name == "ledger-write" and baseline is not None:
            out.append(closed_loop_target(r, baseline))
        elif r.extra.get("mode") == "open-loop":
            out.append(open_loop_target(r, closed.get(r.name.removeprefix("ledger-open-loop"))))
    return out


def closed_loop_target(r: Result, baseline: Result | None) -> dict:
    """Closed loop >= TARGET_RATIO x grpc-baseline's records/s (same run, 1 KiB entries)."""
    target = f"{r.name} >= {TARGET_RATIO:.2f}x grpc-baseline records/s at 1 KiB (closed loop)"
    value = f"{r.records_per_s:,.0f} entries/s at {r.record_bytes} B"
    if baseline is None or baseline.records_per_s <= 0:
        return {"target": target, "value": value + " (no grpc-baseline in this run)", "met": None}
    q = ratio(r, baseline, TARGET_RATIO)
    value = f"{q.records_per_s_ratio:.2f}x: " + value + f" vs grpc-baseline {baseline.records_per_s:,.0f} records/s"
    if r.record_bytes != TARGET_ENTRY_BYTES:
        return {"target": target, "value": value + " (target is for 1 KiB entries)", "met": None}
    return {"target": target, "value": value, "met": q.met}


def open_loop_target(r: Result, closed: Result | None) -> dict:
    """p99 <= TARGET_P99_MS with the open loop offering TARGET_P99_RATE_FRACTION of the closed loop's entries/s of
    the same run (1 KiB entries). Offered less, the run can fail the target but not establish it."""
    rate = r.extra["rate_target_per_s"]
    unsent = r.extra["entries_unsent_behind_schedule"]
    fraction = "half" if TARGET_P99_RATE_FRACTION == 0.5 else f"{TARGET_P99_RATE_FRACTION:g}x"
    target = f"{r.name} p99 <= {TARGET_P99_MS:g} ms at {fraction} the closed-loop entries/s (open loop)"
    value = (f"p99 {r.p99_ms:.1f} ms at {rate:,.0f} entries/s offered, {r.records_per_s:,.0f} achieved"
             + (f", {unsent} entries not sent in time (rate not sustained)" if unsent else ""))
    target_rate = TARGET_P99_RATE_FRACTION * closed.records_per_s if closed is not None else None
    if r.record_bytes != TARGET_ENTRY_BYTES:
        met, why = None, " (target is for 1 KiB entries)"
    elif unsent:
        met, why = False, ""
    elif target_rate is None:
        met, why = None, " (no closed loop in this run: --both measures one)"
    elif rate >= target_rate:
        met, why = r.p99_ms <= TARGET_P99_MS, f" (closed loop {closed.records_per_s:,.0f}/s)"
    elif r.p99_ms > TARGET_P99_MS:
        met, why = False, f" (above the limit even below {target_rate:,.0f}/s)"
    else:
        met, why = None, f" (offered below {target_rate:,.0f}/s: not established)"
    return {"target": target, "value": value + why, "met": met}
