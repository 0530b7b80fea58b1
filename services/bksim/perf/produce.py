"""produce: messages published through bksim.client to a topic on a fresh cluster; msgs/s, MB/s and publish
latency.

The cluster (`topic_cluster`): perf/ledger_write.LedgerCluster — a real ZooKeeper, E `bksim bookie run`
processes and one `bksim broker run` (which serves the Topics API next to the Broker API) — with the topic's
ledgers shaped E/Qw/Qa through the children's BKSIM_TOPIC_ENSEMBLE_SIZE / _WRITE_QUORUM_SIZE /
_ACK_QUORUM_SIZE. A fresh tenant/namespace (retention forever) and a
topic (`--partitions`) per measurement.

The measurement (closed loop): one Producer (batching on: `batch` messages, 128 KiB, 1 ms; at most
`max_pending` messages waiting for receipts, the sender blocking when full) sends `message_bytes`-byte
messages with send_async until `seconds` pass and/or `records_max` were sent, then flushes. A message's
publish latency is send_async() -> its receipt callback; msgs/s counts receipted messages over first send ..
last receipt. Every receipt must carry a message id and no message may fail; the topic's stats must then
count every message (msgInCounter).

Target (every process on this machine's 2 cores): >= 100,000 msgs/s of 100 bytes, E3/Qw3/Qa2.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

from bksim.client import Client
from bksim.model.config import Config
from bksim.perf.ledger_write import CALL_DEADLINE_S, CpuMeter, LedgerCluster, Shape
from bksim.perf.metrics_cost import Scraper
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

TARGET_MSGS_PER_S = 100_000.0
TARGET_MESSAGE_BYTES = 100
MESSAGE_BYTES_DEFAULT = 100
BATCH_DEFAULT = 1000          # batching_max_messages
MAX_PENDING_DEFAULT = 10_000  # messages waiting for receipts (Pulsar's perf producer uses 1000 per partition)
SEND_TIMEOUT_MS = 60_000
OPERATION_TIMEOUT_MS = 30_000
DEADLINE_CHECK_EVERY = 256    # messages between clock reads of the time bound


@contextlib.contextmanager
def topic_cluster(workdir: str, shape: Shape, config: Config, config_path: str | None = None,
                  keep: bool = False, tls: bool = False, auth: bool = False,
                  http: bool = False) -> Iterator[LedgerCluster]:
    """A started, ready LedgerCluster whose broker makes topic ledgers of `shape`; stopped (by pid) on exit.
    `tls` / `auth`: secured (LedgerCluster); its clients take `cluster.tls` and `cluster.token`. `http`: every
    process serves HTTP (/metrics) on a port of its own (Node.http_port)."""
    env = {"BKSIM_TOPIC_ENSEMBLE_SIZE": str(shape.ensemble), "BKSIM_TOPIC_WRITE_QUORUM_SIZE": str(shape.write_quorum),
           "BKSIM_TOPIC_ACK_QUORUM_SIZE": str(shape.ack_quorum)}
    cluster = LedgerCluster(workdir, shape.ensemble, config, config_path, keep, child_env=env, tls=tls,
                            auth=auth, http=http).__enter__()
    try:
        run_interruptible(_wait_ready(cluster, shape.ensemble))
        yield cluster
    finally:
        cluster.__exit__(None, None, None)


async def _wait_ready(cluster: LedgerCluster, bookies: int) -> None:
    async with cluster.broker_client(deadline_s=CALL_DEADLINE_S) as client:
        await cluster.wait_serving(client, bookies)


def fresh_topic(client: Client, partitions: int) -> str:
    """A new tenant/namespace (retention forever, so nothing is trimmed meanwhile) and topic; its name."""
    tenant = f"perf{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    topic = f"persistent://{tenant}/ns/perf"
    client.create_topic(topic, partitions)
    return topic


def payload_of(message_bytes: int) -> bytes:
    return (b"bksim-perf-" * (message_bytes // 11 + 1))[:message_bytes]


@dataclass
class ProduceRun:
    latencies: LatencyRecorder
    elapsed_s: float
    sent: int
    receipted: int
    failed: int
    first_error: str


def drive_produce(producer, message_bytes: int, seconds: float, records_max: int) -> ProduceRun:
    """Closed loop: send_async until the bound, flush, and collect each message's publish latency."""
    payload = payload_of(message_bytes)
    lat: list[float] = []
    failures: list = []
    state = {"last": 0.0}
    clock = time.perf_counter

    def done(error, message_id, t0) -> None:
        now = clock()
        if error is not None or message_id is None:
            failures.append(error)
            return
        lat.append(now - t0)
        state["last"] = now

    start = clock()
    deadline = start + seconds if seconds > 0 else float("inf")
    sent = 0
    send = producer.send_async
    while records_max <= 0 or sent < records_max:
        if sent % DEADLINE_CHECK_EVERY == 0 and clock() >= deadline:
            break
        t0 = clock()
        send(payload, lambda e, mid, t0=t0: done(e, mid, t0))
        sent += 1
    producer.flush(timeout_s=SEND_TIMEOUT_MS / 1000 + 10)
    recorder = LatencyRecorder()
    for value in lat:
        recorder.add(value)
    return ProduceRun(recorder, (state["last"] or clock()) - start, sent, len(lat), len(failures),
                      str(failures[0]) if failures else "")


def measure(workdir: str, shape: Shape, message_bytes: int, batch: int, max_pending: int, partitions: int,
            seconds: float, records_max: int, idle_guard: Callable[[str], float], config: Config,
            config_path: str | None = None, keep: bool = False, tls: bool = False, auth: bool = False,
            metrics: bool = False) -> list[Result]:
    """One closed-loop measurement on a fresh cluster (`tls` / `auth`: secured; the result is named
    "produce-tls-auth" then; `metrics`: every process's /metrics scraped meanwhile, perf/metrics_cost.py, the
    result named "produce-metrics")."""
    scraper = None
    with topic_cluster(workdir, shape, config, config_path, keep, tls=tls, auth=auth, http=metrics) as cluster:
        with Client(cluster.broker_address, operation_timeout_ms=OPERATION_TIMEOUT_MS, tls=cluster.tls,
                    token=cluster.token) as client:
            topic = fresh_topic(client, partitions)
            producer = client.create_producer(topic, batching_max_messages=batch, max_pending_messages=max_pending,
                                              block_if_queue_full=True, send_timeout_ms=SEND_TIMEOUT_MS)
            idle = idle_guard("produce")
            meter = CpuMeter(cluster)
            meter.start()
            if metrics:
                scraper = Scraper([n.http_port for n in cluster.servers()], "process_cpu_seconds_total")
            with scraper or contextlib.nullcontext():
                run = drive_produce(producer, message_bytes, seconds, records_max)
            cpu = meter.stop(run.elapsed_s)
            producer.close()
            if run.failed:
                raise RuntimeError(f"{run.failed} of {run.sent} messages failed; the first: {run.first_error};\n"
                                   f"{cluster.logs()}")
            if run.receipted != run.sent:
                raise RuntimeError(f"{run.sent} messages sent, {run.receipted} receipted")
            stats = _stats(client, topic, partitions)
            if stats["msgInCounter"] != run.sent:
                raise RuntimeError(f"the topic counts {stats['msgInCounter']} messages in, {run.sent} were sent")
    extra = {"ensemble": shape.ensemble, "write_quorum": shape.write_quorum, "ack_quorum": shape.ack_quorum,
             "partitions": partitions, "max_pending": max_pending, "entries": stats["entries"],
             "entries_per_partition": ",".join(map(str, stats["per_partition"])),
             "messages_per_entry": run.sent / stats["entries"] if stats["entries"] else 0.0,
             "p95_ms": run.latencies.percentile_s(95.0) * 1000.0}
    extra.update(cpu)
    extra.update(cluster.pids())
    if scraper is not None:
        if scraper.errors or not scraper.scrapes:
            raise RuntimeError(f"/metrics scrapes failed ({scraper.scrapes} done): {scraper.errors[:3]}")
        extra.update(scraper.extra())
    return [make_result("produce" + cluster.security_suffix + ("-metrics" if metrics else ""), message_bytes, batch, run.elapsed_s, run.latencies, idle, extra)]


def _stats(client: Client, topic: str, partitions: int) -> dict:
    """msgInCounter and the entries written, summed over the partitions."""
    names = [f"{topic}-partition-{i}" for i in range(partitions)] if partitions else [topic]
    out = {"msgInCounter": 0, "entries": 0, "per_partition": []}
    for name in names:
        s = client.topic_stats(name)
        out["msgInCounter"] += int(s.get("msgInCounter", 0))
        internal = client.topic_stats_internal(name)
        entries = int(internal.get("numberOfEntries", internal.get("entriesAddedCounter", 0)))
        out["entries"] += entries
        out["per_partition"].append(entries)
    return out


def targets(results: list[Result]) -> list[dict]:
    out = []
    for r in results:
        if r.name not in ("produce", "consume"):  # a secured run is judged against its plain run (security_cost)
            continue
        right_size = r.record_bytes == TARGET_MESSAGE_BYTES
        value = f"{r.records_per_s:,.0f} msgs/s at {r.record_bytes} B"
        out.append({"target": f">= {TARGET_MSGS_PER_S:,.0f} msgs/s ({r.name}, 100-byte messages)",
                    "value": value + ("" if right_size else " (target is for 100-byte messages)"),
                    "met": (r.records_per_s >= TARGET_MSGS_PER_S) if right_size else None})
    return out
