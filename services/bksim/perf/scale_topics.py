"""The topic axes of `bksim perf scale` (perf/scale.py): topics per broker, and subscriptions per topic.

The cluster (perf/scale_load.scale_cluster, a perf/ledger_write.LedgerCluster): a real ZooKeeper, BOOKIES `bksim
bookie run` processes and one `bksim broker run`, topic ledgers E/Qw/Qa = SHAPE (the configuration's default, Pulsar's
2/2/2), the broker admitting every producer's and consumer's stream (broker.requests_inflight_max raised to the streams
of the largest point + STREAMS_SPARE when the configuration's is lower: its default, 1,000 concurrent RPCs, holds 500
topics of one producer and one consumer); one namespace. The load (producers on a schedule, consumers drained by one
thread) is perf/scale_load.Load.

`topics`: first a baseline with no topic (the broker idle for `seconds`: its CPU, its RSS, the znodes). Then for
each point N, topics are added until there are N, CREATE_WORKERS at a time but for the last ADDED_ALONE, which are
added one at a time (so that every point's figure is the same operation: a topic added alone to a broker holding
the others; the first half of them under load, the second half with the producers paused, `quiet`; the bulk's
figures are in the JSON). Each: the topic is created (admin call, not timed), then, timed, a consumer subscribes
(Exclusive, earliest), a producer is created, one message is sent and the consumer receives it: the first-message
latency (split in the JSON: subscribed, producer ready, message received). Every topic's producer then sends
TOPIC_RATE msgs/s (open loop: one sender thread, message k of a producer due at its start + k / rate, the due time
in the payload) and its consumer receives and acknowledges every message (one draining thread). With all N topics
loaded the point measures, after SETTLE_S: the broker's CPU over `seconds` (from /proc/PID/stat), its RSS, the
znodes (the whole ZooKeeper tree counted with kazoo), then LOOKUPS Lookup calls of topics drawn at random from all
N (one after the other) while the load runs, and LOOKUPS more with the producers paused (`quiet`), and then, still
paused, the broker's CPU over `seconds` again (`still`: what holding N topics costs with no message moving). Per
topic: (CPU - the baseline's) / N, (RSS - baseline) / N, (znodes - baseline) / N.
The clients: one `bksim.client.Client` (one event-loop thread, one gRPC channel) per TOPICS_PER_CLIENT topics, all
in the benchmark's process: 1,000 topics are 4 clients of 250 producers and 250 consumers each.

`subscriptions`: one topic and one producer at SUBSCRIPTION_RATE msgs/s (open loop, as above). A baseline with the
producer alone (no subscription: the write cost), then for each point N, subscriptions are added until there are
N (one Exclusive consumer each, from the latest position, so no backlog is replayed), and after SETTLE_S the
broker's CPU over `seconds` and the messages delivered meanwhile. Per delivered message: the broker's CPU (all of
it) and its dispatch part (CPU above the baseline's), in microseconds. The end-to-end latency (due time ->
received) of the delivered messages is the axis's Result.

Every message sent must be received once the load stops (bounded wait), or the axis fails.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import random
import time
import uuid
from typing import Callable

from bksim.client import Client, InitialPosition, SubscriptionType
from bksim.model.config import Config
from bksim.perf.ledger_write import LedgerCluster
from bksim.perf.machine import idle_fraction, process_cpu_s, read_cpu_times
from bksim.perf.scale import AxisReport, Column, Cost, count_znodes, resolved, rss_bytes
from bksim.perf.scale_load import (BOOKIES, MESSAGE_BYTES, RECEIVE_TIMEOUT_MS, SHAPE, Clients, Load,
                                   scale_cluster)
from bksim.perf.stats import LatencyRecorder, make_result

TOPIC_POINTS = [1, 10, 100, 1000]
SUBSCRIPTION_POINTS = [1, 10, 100]
TOPIC_RATE = 0.2  # msgs/s of every topic's producer (1 msg/s x 1,000 topics needs more than the 2 cores)
SUBSCRIPTION_RATE = 50.0  # msgs/s of the one producer of the subscriptions axis (100 subscriptions: 5,000 deliveries/s;
# 10,000/s take the 2 cores: the one consumer process alone needs ~0.85)
CREATE_WORKERS = 8
ADDED_ALONE = 16  # the last topics of a point are added one at a time: their first-message latency is the figure
TOPICS_PER_CLIENT = 250
LOOKUPS = 200
RECEIVER_QUEUE = 100
CPU_RESOLVED_S = 0.1  # a CPU difference below 10 ticks of /proc/PID/stat is not resolved
RSS_RESOLVED_BYTES = 2 * 1024 * 1024  # an RSS difference below this is the allocator's noise
SETTLE_S = 1.0  # after the last topic or subscription is added, before the CPU window


def _window(cluster: LedgerCluster, load: Load, seconds: float) -> dict:
    """CPU over `seconds` with the load running (the broker's; the bookies' and ZooKeeper's; this process's; and
    what the rest of the machine used meanwhile), the messages sent and received meanwhile, the broker's RSS."""
    broker = cluster.broker.pid
    time.sleep(SETTLE_S)
    machine0, cpu0, all0, (sent0, received0) = read_cpu_times(), process_cpu_s(broker), cluster.cpu_s(), load.counts()
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    machine1, cpu1, all1, (sent1, received1) = read_cpu_times(), process_cpu_s(broker), cluster.cpu_s(), load.counts()
    ours = sum(all1[k] - all0[k] for k in all1 if k in all0)
    servers = sum(all1[k] - all0[k] for k in all1 if k in all0 and k not in (cluster.broker.name, "client"))
    idle = idle_fraction(machine0, machine1)
    busy = None if idle is None else (1.0 - idle) * len(os.sched_getaffinity(0)) * elapsed
    return {"elapsed_s": elapsed, "broker_cpu_s": cpu1 - cpu0, "broker_cores": (cpu1 - cpu0) / elapsed,
            "bookies_zk_cores": servers / elapsed, "client_cores": (all1["client"] - all0["client"]) / elapsed,
            "others_cores": None if busy is None else max(0.0, busy - ours) / elapsed,
            "sent": sent1 - sent0, "received": received1 - received0, "broker_rss": rss_bytes(broker)}


def _lookups(clients: "Clients", topics: list[str]) -> list[float]:
    """LOOKUPS Lookup calls, one after the other, of topics drawn at random; their latencies (s)."""
    out = []
    client = clients.for_topic(0)
    for _ in range(LOOKUPS):
        topic = random.choice(topics)
        t0 = time.perf_counter()
        client.lookup(topic)
        out.append(time.perf_counter() - t0)
    return out


def _fanout_settled(client: Client, topic: str, load: Load) -> bool:
    """Every subscription has no backlog and the broker delivered exactly the messages the consumers received."""
    subs = client.topic_stats(topic).get("subscriptions", {})
    out = sum(int(s.get("msgOutCounter", 0)) for s in subs.values())
    return all(int(s.get("msgBacklog", 0)) == 0 for s in subs.values()) and out == load.received


def _percentile_ms(samples: list[float], q: float) -> float | None:
    """Nearest-rank percentile of `samples` (seconds), in ms; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(1, math.ceil(len(ordered) * q / 100.0)) - 1] * 1000.0


def _open_topic(client: Client, topic: str, load: Load) -> tuple[float, float, float]:
    """Create `topic` (not timed), then subscribe, create a producer, send one message and receive it; the seconds
    from the start of the subscribe to the consumer's subscription, to the producer's readiness, and to the message
    received (the first-message latency)."""
    client.create_topic(topic)
    t0 = time.perf_counter()
    consumer = client.subscribe(topic, "scale", SubscriptionType.Exclusive, initial_position=InitialPosition.Earliest,
                                receiver_queue_size=RECEIVER_QUEUE)
    subscribed = time.perf_counter() - t0
    producer = client.create_producer(topic, block_if_queue_full=True)
    ready = time.perf_counter() - t0
    producer.send_async(load.payload(time.perf_counter_ns()), load.on_receipt)
    message = consumer.receive(RECEIVE_TIMEOUT_MS)
    elapsed = time.perf_counter() - t0
    consumer.acknowledge(message)
    load.add(producer, [consumer])
    return subscribed, ready, elapsed


def measure_topics(workdir: str, points: list[int], seconds: float, config: Config, *, config_path: str | None = None,
                   keep: bool = False, log: Callable[[str], None] = print, idle_before: float = 1.0) -> AxisReport:
    report = AxisReport(
        "topics", "topics",
        f"N topics on one broker ({BOOKIES} bookies, ledgers {SHAPE}), each a producer at {TOPIC_RATE:g} msg/s of "
        f"{MESSAGE_BYTES} B and an Exclusive consumer; a client per {TOPICS_PER_CLIENT} topics, all in one process; "
        f"CPU over {seconds:g} s",
        [Column("points", "topics", ",d", 6), Column("others_cores", "others", ".2f", 6),
         Column("broker_cores", "broker cores", ".3f", 12),
         Column("broker_mcores_per_topic", "mcores/topic", ".3f", 12),
         Column("still_mcores_per_topic", "still mc/topic", ".3f", 14), Column("rss_mb", "RSS MB", ".1f", 6),
         Column("rss_kib_per_topic", "KiB/topic", ",.1f", 9),
         Column("znodes", "znodes", ",d", 6), Column("znodes_per_topic", "znodes/topic", ".2f", 12),
         Column("lookup_p50_ms", "lookup p50", ".2f", 10), Column("lookup_p99_ms", "lookup p99", ".2f", 10),
         Column("lookup_quiet_p99_ms", "quiet p99", ".2f", 9),
         Column("first_p50_ms", "1st msg p50", ".1f", 11), Column("first_p99_ms", "1st msg p99", ".1f", 11),
         Column("first_quiet_p99_ms", "quiet 1st p99", ".1f", 13),
         Column("msgs_per_s", "msgs/s", ",.0f", 6), Column("clients", "clients", "d", 7)],
        [Cost("broker_mcores_per_topic", "broker CPU per topic", "millicores"),
         Cost("still_mcores_per_topic", "broker CPU per topic, no traffic", "millicores"),
         Cost("rss_kib_per_topic", "broker RSS per topic", "KiB"), Cost("znodes_per_topic", "znodes per topic", ""),
         Cost("lookup_p99_ms", "lookup p99 under load", "ms"), Cost("lookup_quiet_p99_ms", "lookup p99 quiet", "ms"),
         Cost("first_p99_ms", "first-message p99 under load", "ms"),
         Cost("first_quiet_p99_ms", "first-message p99 quiet", "ms")])
    with scale_cluster(workdir, config, config_path, keep, 2 * max(points)) as cluster:
        clients = Clients(cluster.broker_address, TOPICS_PER_CLIENT)
        load = Load(TOPIC_RATE)
        zk = cluster.kazoo()
        try:
            admin = clients.for_topic(0)
            tenant = f"scale{uuid.uuid4().hex[:8]}"
            admin.create_tenant(tenant)
            admin.create_namespace(f"{tenant}/ns")
            base = _window(cluster, load, seconds)
            base_znodes = count_znodes(zk)
            report.rows.append({"points": 0, "baseline": True, "others_cores": base["others_cores"],
                                "broker_cores": base["broker_cores"], "rss_mb": base["broker_rss"] / 1e6,
                                "znodes": base_znodes, "clients": len(clients)})
            log(f"# scale topics: baseline broker {base['broker_cores']:.3f} cores, RSS {base['broker_rss'] / 1e6:.1f} "
                f"MB, {base_znodes} znodes")
            topics: list[str] = []
            for n in points:
                names = [f"persistent://{tenant}/ns/t{i}" for i in range(len(topics), n)]
                bulk, alone = names[:-ADDED_ALONE], names[-ADDED_ALONE:]
                started = time.monotonic()
                pool = concurrent.futures.ThreadPoolExecutor(CREATE_WORKERS, thread_name_prefix="scale-create")
                try:
                    futures = [pool.submit(_open_topic, clients.for_topic(len(topics) + i), name, load)
                               for i, name in enumerate(bulk)]
                    bulk_first = [f.result()[2] for f in futures]
                finally:  # interrupted or failed: the topics not started are dropped, the clients' close ends the rest
                    pool.shutdown(wait=False, cancel_futures=True)
                loaded, calm = alone[:len(alone) // 2], alone[len(alone) // 2:]
                stages = [_open_topic(clients.for_topic(len(topics) + len(bulk) + i), name, load)
                          for i, name in enumerate(loaded)]
                with load.paused():
                    calm_stages = [_open_topic(clients.for_topic(len(topics) + len(bulk) + len(loaded) + i), name, load)
                                   for i, name in enumerate(calm)]
                created_s = time.monotonic() - started
                first = [t for _, _, t in stages]
                first_quiet = [t for _, _, t in calm_stages]
                log(f"# scale topics: {len(names):,} topics added in {created_s:.1f} s; {n:,} under load for "
                    f"{seconds:g} s")
                topics += names
                w = _window(cluster, load, seconds)
                znodes = count_znodes(zk)
                lookups = _lookups(clients, topics)
                with load.paused():
                    quiet = _lookups(clients, topics)
                    still = _window(cluster, load, seconds)  # holding N topics, no message moving
                cpu = w["broker_cpu_s"] - base["broker_cores"] * w["elapsed_s"]
                cpu_still = still["broker_cpu_s"] - base["broker_cores"] * still["elapsed_s"]
                rss = w["broker_rss"] - base["broker_rss"]
                row = {"points": n, "others_cores": w["others_cores"], "broker_cores": w["broker_cores"],
                       "rss_mb": w["broker_rss"] / 1e6, "znodes": znodes,
                       "znodes_per_topic": (znodes - base_znodes) / n,
                       "lookup_p50_ms": _percentile_ms(lookups, 50), "lookup_p99_ms": _percentile_ms(lookups, 99),
                       "lookup_quiet_p50_ms": _percentile_ms(quiet, 50),
                       "lookup_quiet_p99_ms": _percentile_ms(quiet, 99),
                       "first_p50_ms": _percentile_ms(first, 50), "first_p99_ms": _percentile_ms(first, 99),
                       "first_quiet_p50_ms": _percentile_ms(first_quiet, 50),
                       "first_quiet_p99_ms": _percentile_ms(first_quiet, 99),
                       "first_quiet_subscribed_p50_ms": _percentile_ms([a for a, _, _ in calm_stages], 50),
                       "first_alone": len(first), "first_bulk_p50_ms": _percentile_ms(bulk_first, 50),
                       "first_bulk_p99_ms": _percentile_ms(bulk_first, 99),
                       "first_subscribed_p50_ms": _percentile_ms([a for a, _, _ in stages], 50),
                       "first_producer_p50_ms": _percentile_ms([b - a for a, b, _ in stages], 50),
                       "first_delivered_p50_ms": _percentile_ms([c - b for _, b, c in stages], 50),
                       "broker_still_cores": still["broker_cores"],
                       "msgs_per_s": w["received"] / w["elapsed_s"], "clients": len(clients),
                       "created": len(names), "create_s": created_s, "sent": w["sent"], "received": w["received"],
                       "bookies_zk_cores": w["bookies_zk_cores"], "client_cores": w["client_cores"],
                       "load_avg_1m": os.getloadavg()[0]}
                resolved(row, "broker_mcores_per_topic", cpu / w["elapsed_s"] * 1000 / n, cpu >= CPU_RESOLVED_S)
                resolved(row, "rss_kib_per_topic", rss / 1024 / n, rss >= RSS_RESOLVED_BYTES)
                resolved(row, "still_mcores_per_topic", cpu_still / still["elapsed_s"] * 1000 / n,
                         cpu_still >= CPU_RESOLVED_S)
                report.rows.append(row)
                log(f"# scale topics: {n:,} topics ({len(names):,} added in {created_s:.1f} s), broker "
                    f"{w['broker_cores']:.3f} cores, RSS {w['broker_rss'] / 1e6:.1f} MB, {znodes:,} znodes, "
                    f"{row['msgs_per_s']:,.0f} msgs/s received")
                recorder = LatencyRecorder()
                for value in first + first_quiet:
                    recorder.add(value)
                report.results.append(make_result(f"scale-topics-{n}", MESSAGE_BYTES, n, created_s, recorder,
                                                  idle_before,
                                                  {"latency": "subscribe + create producer -> first message received",
                                                   **{k: v for k, v in row.items() if k != "points"}}))
            load.stop()
        finally:
            load.close()
            with contextlib.suppress(Exception):
                zk.stop()
                zk.close()
            clients.close()
    report.notes.append(f"per topic = (value - the baseline's with no topic) / topics; others = cores the rest of the "
                        f"machine used during the window; still = the broker's CPU with the producers paused; lookups: "
                        f"{LOOKUPS} calls of topics drawn from all, under load and with the producers paused "
                        f"(quiet); first message: subscribe + create producer + send -> received, of the last "
                        f"{ADDED_ALONE} topics of each point, added one at a time, half under load and half with the "
                        f"producers paused (quiet; the others {CREATE_WORKERS} at a time)")
    return report


def measure_subscriptions(workdir: str, points: list[int], seconds: float, config: Config, *,
                          config_path: str | None = None, keep: bool = False,
                          log: Callable[[str], None] = print, idle_before: float = 1.0) -> AxisReport:
    report = AxisReport(
        "subscriptions", "subscriptions",
        f"one topic ({BOOKIES} bookies, ledgers {SHAPE}), one producer at {SUBSCRIPTION_RATE:g} msgs/s of "
        f"{MESSAGE_BYTES} B, N subscriptions of one Exclusive consumer each (fan-out); CPU over {seconds:g} s",
        [Column("points", "subs", ",d", 6), Column("others_cores", "others", ".2f", 6),
         Column("broker_cores", "broker cores", ".3f", 12), Column("delivered_per_s", "delivered/s", ",.0f", 11),
         Column("us_per_delivered", "us/delivered", ",.1f", 12),
         Column("dispatch_us_per_delivered", "dispatch us/deliv", ",.1f", 17),
         Column("e2e_p50_ms", "e2e p50 ms", ".1f", 10), Column("e2e_p99_ms", "e2e p99 ms", ".1f", 10),
         Column("client_cores", "client cores", ".3f", 12)],
        [Cost("dispatch_us_per_delivered", "broker dispatch CPU per delivered message", "us")])
    with scale_cluster(workdir, config, config_path, keep, 1 + max(points)) as cluster:
        clients = Clients(cluster.broker_address, 1 << 30)
        client = clients.for_topic(0)
        load = Load(SUBSCRIPTION_RATE)
        try:
            tenant = f"scale{uuid.uuid4().hex[:8]}"
            client.create_tenant(tenant)
            client.create_namespace(f"{tenant}/ns")
            topic = f"persistent://{tenant}/ns/fanout"
            client.create_topic(topic)
            load.add(client.create_producer(topic, block_if_queue_full=True))
            base = _window(cluster, load, seconds)
            report.rows.append({"points": 0, "baseline": True, "others_cores": base["others_cores"],
                                "broker_cores": base["broker_cores"], "client_cores": base["client_cores"]})
            log(f"# scale subscriptions: baseline (the producer alone) broker {base['broker_cores']:.3f} cores")
            subs = 0
            for n in points:
                while subs < n:
                    consumer = client.subscribe(topic, f"s{subs}", SubscriptionType.Exclusive,
                                                initial_position=InitialPosition.Latest,
                                                receiver_queue_size=RECEIVER_QUEUE * 10)
                    load.add(consumers=[consumer])
                    subs += 1
                load.recording = recorder = LatencyRecorder()
                w = _window(cluster, load, seconds)
                load.recording = None
                delivered = w["received"]
                dispatch_s = w["broker_cpu_s"] - base["broker_cores"] * w["elapsed_s"]
                row = {"points": n, "others_cores": w["others_cores"], "broker_cores": w["broker_cores"],
                       "delivered_per_s": delivered / w["elapsed_s"],
                       "us_per_delivered": w["broker_cpu_s"] * 1e6 / delivered if delivered else None,
                       "e2e_p50_ms": recorder.percentile_s(50) * 1000 if recorder.records else None,
                       "e2e_p99_ms": recorder.percentile_s(99) * 1000 if recorder.records else None,
                       "client_cores": w["client_cores"], "bookies_zk_cores": w["bookies_zk_cores"],
                       "sent": w["sent"], "received": delivered, "load_avg_1m": os.getloadavg()[0]}
                resolved(row, "dispatch_us_per_delivered", dispatch_s * 1e6 / delivered if delivered else None,
                         dispatch_s >= CPU_RESOLVED_S)
                report.rows.append(row)
                log(f"# scale subscriptions: {n} subscriptions, broker {w['broker_cores']:.3f} cores, "
                    f"{row['delivered_per_s']:,.0f} delivered/s")
                if recorder.records:
                    report.results.append(make_result(f"scale-subs-{n}", MESSAGE_BYTES, n, w["elapsed_s"], recorder,
                                                      idle_before, {"latency": "send due time -> received",
                                                            **{k: v for k, v in row.items() if k != "points"}}))
            load.stop(lambda: _fanout_settled(client, topic, load))
        finally:
            load.close()
            clients.close()
    report.notes.append("us/delivered = broker CPU / messages delivered (all subscriptions); dispatch = broker CPU "
                        "above the baseline's (the producer alone) / messages delivered; others = cores the rest of "
                        "the machine used during the window")
    return report
