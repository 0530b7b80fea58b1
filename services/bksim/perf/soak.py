"""soak: the bookies' disk usage over time under a steady producer and consumer on a topic with retention 0, with
small entry logs and frequent garbage collection and compaction; a table, a PNG chart, and whether usage stayed
bounded by the live data plus one compaction's worth of slack.

The cluster: perf/ledger_write.LedgerCluster (a real ZooKeeper, BOOKIES `bksim bookie run` processes, one
`bksim broker run`) with the overrides of `CHILD_ENV` in every child: entry logs of LOG_BYTES, a checkpoint every
second, a GC round every 2 s, minor compaction every 4 s and major every 8 s, topic ledgers rolled at
TOPIC_LEDGER_BYTES and trimmed every 2 s. A fresh namespace with retention 0 (a ledger goes once every
subscription has consumed it) and one topic (E/Qw/Qa from the configuration's [topic]).

Load: a producer thread sends `message_bytes`-byte messages at `rate` msgs/s (open loop, batching on); a consumer
thread receives and acknowledges every message. Both run for `minutes`.

Samples, every `sample_s` s, for every bookie: its ledger directory's bytes (entry logs, and the RocksDB index
apart), and the live data it holds by its own count: the live bytes of each of its entry logs, the one being
written included (BookieAdmin EntryLogStats: ledgers still present in its index; a ledger deleted from the
metadata counts as live until the bookie's next GC round). The bound checked at each sample from the first GC
period on: entry-log bytes <= live + SLACK_LOGS x LOG_BYTES, the slack being the log being written (never
compacted: its dead part waits until it rolls) and one sealed log (waiting for the next round, or an old log
beside its compacted copy). The index is shown but not in the bound (RocksDB frees deleted keys at its own
compactions).

The result row counts consumed messages (latency = send due time -> received, as consume-e2e), so the table has
the load's figures; the disk figures are in the samples table and the JSON ("samples").
"""
from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
import uuid
from typing import Callable

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.broker_client import BrokerClient
from bksim.client import Client, InitialPosition, SubscriptionType
from bksim.model.config import Config
from bksim.perf.ledger_write import CALL_DEADLINE_S, LedgerCluster
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import MB, LatencyRecorder, Result, make_result

BOOKIES = 3
MiB = 1024 * 1024
LOG_BYTES = 4 * MiB
TOPIC_LEDGER_BYTES = 2 * MiB
GC_WAIT_MS = 2_000
SLACK_LOGS = 2
CHILD_ENV = {
    "BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(LOG_BYTES),
    "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "1000",
    "BKSIM_BOOKIE_GC_WAIT_TIME_MS": str(GC_WAIT_MS),
    "BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS": "4000",
    "BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS": "8000",
    "BKSIM_TOPIC_LEDGER_BYTES_MAX": str(TOPIC_LEDGER_BYTES),
    "BKSIM_TOPIC_TRIM_INTERVAL_MS": "2000",
}
RATE_DEFAULT = 1_000.0
MESSAGE_BYTES_DEFAULT = 1_000
SAMPLE_S_DEFAULT = 5.0
BATCH = 100
RECEIVE_TIMEOUT_MS = 30_000
OPERATION_TIMEOUT_MS = 30_000
PACE_S = 0.002
_STAMP = struct.Struct(">q")  # send due time (perf_counter_ns) at the head of each payload


def describe(rate: float, message_bytes: int) -> str:
    return (f"{BOOKIES} bookies, a retention-0 topic, {rate:,.0f} msgs/s of {message_bytes} B produced and consumed; "
            f"entry logs of {LOG_BYTES // MiB} MiB, GC every {GC_WAIT_MS / 1000:g} s, topic ledgers of "
            f"{TOPIC_LEDGER_BYTES // MiB} MiB; bound: entry-log bytes <= live + {SLACK_LOGS} logs")


def measure(workdir: str, config: Config, *, minutes: float, rate: float, message_bytes: int, sample_s: float,
            idle: Callable[[str], float], png: str | None = None, config_path: str | None = None,
            keep: bool = False, log: Callable[[str], None] = print) -> tuple[list[Result], list, list[dict]]:
    if message_bytes < _STAMP.size:
        raise ValueError(f"message size must be >= {_STAMP.size} bytes (the payload carries a timestamp)")
    with LedgerCluster(workdir, BOOKIES, config, config_path, keep, child_env=CHILD_ENV) as cluster:
        run_interruptible(_wait_ready(cluster))
        with Client(cluster.broker_address, operation_timeout_ms=OPERATION_TIMEOUT_MS) as client:
            tenant = f"soak{uuid.uuid4().hex[:8]}"
            client.create_tenant(tenant)
            client.create_namespace(f"{tenant}/ns", retention_ms=0)
            topic = f"persistent://{tenant}/ns/soak"
            client.create_topic(topic, 0)
            consumer = client.subscribe(topic, "soak", SubscriptionType.Exclusive,
                                        initial_position=InitialPosition.Earliest)
            producer = client.create_producer(topic, batching_max_messages=BATCH, block_if_queue_full=True)
            cpu_idle = idle("soak")
            samples, latencies, elapsed, load = _run(cluster, producer, consumer, minutes * 60.0, rate, message_bytes,
                                                     sample_s, log)
            for s in samples:  # what the bookies would hold without garbage collection
                s["written_per_bookie"] = s["received"] * message_bytes * config.topic.write_quorum_size // BOOKIES
            producer.close()
            consumer.close()
        pids = cluster.pids()
    names = [b["name"] for b in samples[0]["bookies"]] if samples else []
    for line in table(samples, names):
        log(line)
    verdict = bound(samples)
    if png:
        draw(samples, names, png, describe(rate, message_bytes))
        log(f"# chart: {png}")
    result = make_result("soak", message_bytes, BATCH, elapsed, latencies, cpu_idle,
                         {"latency": "send due time -> received", "rate_target_per_s": rate, **load, **pids,
                          "samples": len(samples),
                          "load_avg_1m_max": max((s["load_avg_1m"] for s in samples), default=0.0)})
    target = {"target": f"entry-log bytes <= live + {SLACK_LOGS} x {LOG_BYTES // MiB} MiB on every bookie "
                        f"(from {GC_WAIT_MS / 1000:g} s on)", "value": verdict["value"], "met": verdict["met"],
              "samples": samples}
    return [result], [], [target]


async def _wait_ready(cluster: LedgerCluster) -> None:
    async with BrokerClient(cluster.broker_address, deadline_s=CALL_DEADLINE_S) as client:
        await cluster.wait_serving(client, BOOKIES)


def _run(cluster: LedgerCluster, producer, consumer, seconds: float, rate: float, message_bytes: int,
         sample_s: float, log: Callable[[str], None]):
    """Producer and consumer threads for `seconds`; this thread samples. (samples, latencies, elapsed, load)."""
    clock_ns = time.perf_counter_ns
    filler = (b"bksim-soak-" * (message_bytes // 11 + 1))[:message_bytes - _STAMP.size]
    total = int(rate * seconds)
    stop = threading.Event()
    state = {"sent": 0, "received": 0, "error": None, "consumed_ns": 0}
    start_ns = clock_ns()
    step_ns = 1e9 / rate
    latencies = LatencyRecorder()

    def produce() -> None:
        try:
            k = 0
            while k < total and not stop.is_set():
                now = clock_ns()
                due = start_ns + int(k * step_ns)
                if due > now:
                    time.sleep(PACE_S)
                    continue
                while k < total and start_ns + int(k * step_ns) <= now:
                    producer.send_async(_STAMP.pack(start_ns + int(k * step_ns)) + filler, None)
                    k += 1
                state["sent"] = k
        except Exception as e:  # noqa: BLE001 - reported below
            state["error"] = f"producer: {e}"

    def consume() -> None:
        try:
            while state["received"] < total and not stop.is_set():
                m = consumer.receive(RECEIVE_TIMEOUT_MS)
                latencies.add(max(0, clock_ns() - _STAMP.unpack_from(m.data())[0]) / 1e9)
                consumer.acknowledge(m)
                state["received"] += 1
            state["consumed_ns"] = clock_ns()
        except Exception as e:  # noqa: BLE001 - reported below
            state["error"] = f"consumer: {e}"

    threads = [threading.Thread(target=produce, name="soak-producer", daemon=True),
               threading.Thread(target=consume, name="soak-consumer", daemon=True)]
    for t in threads:
        t.start()
    try:  # the sampler runs on an event loop of its own; Ctrl-C or SIGTERM cancel it at an await
        samples = run_interruptible(_sample_loop(cluster, threads, state, start_ns, sample_s, log))
    finally:
        stop.set()
        if any(t.is_alive() for t in threads):
            consumer.close()  # interrupted: a receive() waiting for a message returns now
        for t in threads:
            t.join(RECEIVE_TIMEOUT_MS / 1000)
    if state["error"]:
        raise RuntimeError(state["error"])
    elapsed = (state["consumed_ns"] - start_ns) / 1e9  # first due send .. last message received
    if state["received"] != total:
        raise RuntimeError(f"received {state['received']:,} of {total:,} messages")
    return samples, latencies, elapsed, {"sent": state["sent"], "received": state["received"]}


async def _sample_loop(cluster: LedgerCluster, threads: list[threading.Thread], state: dict, start_ns: int,
                       sample_s: float, log: Callable[[str], None]) -> list[dict]:
    """A sample every `sample_s` s until both threads are done (the last sample is taken after they are)."""
    clients = {b.name: BookieClient(b.address, deadline_s=CALL_DEADLINE_S) for b in cluster.bookies}
    samples: list[dict] = []
    try:
        next_at = time.monotonic()
        while True:
            finished = bool(state["error"]) or not any(t.is_alive() for t in threads)  # then this sample is the last
            s = await _sample(cluster, clients, (time.perf_counter_ns() - start_ns) / 1e9, state)
            samples.append(s)
            log(f"# t={s['t_s']:.0f} s: " + ", ".join(f"{b['name']} {b['entrylog_bytes'] / MB:.1f} MB "
                                                       f"(live {b['live_bytes'] / MB:.1f})" for b in s["bookies"])
                + f"; sent {state['sent']:,}, received {state['received']:,}")
            if finished:
                return samples
            cluster.check_alive()
            next_at += sample_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        for c in clients.values():
            await c.close()


async def _sample(cluster: LedgerCluster, clients: dict, t_s: float, state: dict) -> dict:
    out = []
    for b in cluster.bookies:
        entrylogs = _dir_bytes(os.path.join(b.ledger_dir, "entrylogs"))
        index = _dir_bytes(os.path.join(b.ledger_dir, "index"))
        live, logs, first = 0, 0, 0
        while True:  # every page of the bookie's entry logs
            page = await clients[b.name].entry_log_stats(first)
            for stat in page["logs"]:
                live += stat["live_bytes"]
                logs += 1
            if page["next_log_id"] < 0:
                break
            first = page["next_log_id"]
        out.append({"name": b.name, "entrylog_bytes": entrylogs, "index_bytes": index, "live_bytes": live,
                    "logs": logs})
    return {"t_s": round(t_s, 1), "sent": state["sent"], "received": state["received"],
            "load_avg_1m": os.getloadavg()[0], "bookies": out}


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # maybe: deleted by GC or a RocksDB compaction while we walk
                pass
    return total


def bound(samples: list[dict]) -> dict:
    """Whether entry-log bytes <= live + slack held at every sample from the first GC period on."""
    slack = SLACK_LOGS * LOG_BYTES
    checked = [s for s in samples if s["t_s"] >= GC_WAIT_MS / 1000]
    if not checked:
        return {"met": None, "value": "no sample after the first GC period"}
    worst = max(((b["entrylog_bytes"] - b["live_bytes"], s["t_s"], b["name"]) for s in checked for b in s["bookies"]))
    peak = max(b["entrylog_bytes"] for s in samples for b in s["bookies"])
    last = samples[-1]["bookies"]
    value = (f"largest excess over live {worst[0] / MB:.1f} MB ({worst[2]} at {worst[1]:.0f} s) vs slack "
             f"{slack / MB:.1f} MB; peak entry-log bytes {peak / MB:.1f} MB, at the end "
             + ", ".join(f"{b['name']} {b['entrylog_bytes'] / MB:.1f} MB" for b in last)
             + f"; {len(checked)} samples checked")
    return {"met": worst[0] <= slack, "value": value}


def table(samples: list[dict], names: list[str]) -> list[str]:
    head = f"{'t s':>6}  " + "  ".join(f"{n + ' MB':>11} {'live':>6} {'index':>6}" for n in names) + \
        f"  {'sent':>9} {'received':>9} {'load':>5}"
    lines = ["# disk usage per bookie: entry-log MB, live MB by the bookie's count, RocksDB index MB; the machine's "
             "1-minute load average", head]
    for s in samples:
        cells = "  ".join(f"{b['entrylog_bytes'] / MB:>11.1f} {b['live_bytes'] / MB:>6.1f} {b['index_bytes'] / MB:>6.1f}"
                          for b in s["bookies"])
        lines.append(f"{s['t_s']:>6.0f}  {cells}  {s['sent']:>9,} {s['received']:>9,} {s['load_avg_1m']:>5.1f}")
    return lines


def draw(samples: list[dict], names: list[str], path: str, title: str) -> None:
    """Entry-log bytes (solid), live bytes (dashed) and live + slack (dotted) per bookie over time, and the payload
    bytes written per bookie so far (grey: what the disks would hold without garbage collection)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=(10, 5))
    t = [s["t_s"] for s in samples]
    for i, name in enumerate(names):
        color = f"C{i}"
        ax.plot(t, [s["bookies"][i]["entrylog_bytes"] / MB for s in samples], color=color, label=f"{name} entry logs")
        ax.plot(t, [s["bookies"][i]["live_bytes"] / MB for s in samples], color=color, linestyle="--",
                label=f"{name} live")
        ax.plot(t, [(s["bookies"][i]["live_bytes"] + SLACK_LOGS * LOG_BYTES) / MB for s in samples], color=color,
                linestyle=":", linewidth=0.8, label=f"{name} live + slack")
    ax.plot(t, [s.get("written_per_bookie", 0) / MB for s in samples], color="grey", linewidth=0.8,
            label="payload written per bookie (no GC)")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("MB")
    ax.set_title(title, fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(fig)
