"""consume: messages received and acknowledged through bksim.client from a topic on a fresh cluster; msgs/s,
MB/s, and end-to-end latency at a steady rate.

Same cluster and topic set-up as perf/produce.py. Three measurements:

1. `produce-backlog`: a subscription is created at the earliest position, then `records` messages (or as
   many as the producer sends in `seconds`) are published (batching on) by produce's closed loop
   (`produce.drive_produce`, the producer options of `bksim perf produce`); msgs/s and publish latency as there.
   The subscription's consumer already holds `receiver_queue_size` permits meanwhile, so up to that many
   messages are dispatched to it during this measurement.
2. `consume` (throughput): one Consumer (`receiver_queue_size` permits) receives and acknowledges every message
   of that backlog as fast as it can. msgs/s = messages over first receive .. last receive; each must be a
   message of this run, in order per partition, none missing. Its latency columns are the time each receive()
   call took (the queue was full: this is the client's per-message cost, not an end-to-end figure).
3. `consume-e2e` (latency): a producer sends at `rate` msgs/s (open loop: message k is due at start + k/rate;
   the due time travels in the payload) while the consumer receives; a message's end-to-end latency is its
   receive time minus its due time, so queueing anywhere (producer batch delay, broker, bookies, dispatcher)
   shows. Both run in this process (one clock); at `rate` they fit in its share of the CPU. Messages not
   received within the bound count as missing (an error).

Targets (100-byte messages): the backlog consumed at >= 1.2x the msgs/s it was produced at in the same run
(`ratios`), and end-to-end p99 <= 25 ms at 10,000 msgs/s (`targets`); perf/produce.py's >= 100,000 msgs/s
applies to `consume` too.
"""
from __future__ import annotations

import struct
import threading
import time
from typing import Callable

from bksim.client import Client, InitialPosition, SubscriptionType
from bksim.model.config import Config
from bksim.perf.ledger_write import CpuMeter, Shape
from bksim.perf.produce import (OPERATION_TIMEOUT_MS, SEND_TIMEOUT_MS, TARGET_MESSAGE_BYTES, drive_produce,
                                fresh_topic, payload_of, topic_cluster)
from bksim.perf.stats import LatencyRecorder, Ratio, Result, make_result, ratio

RECEIVER_QUEUE_DEFAULT = 10_000
E2E_RATE_DEFAULT = 10_000.0   # msgs/s offered in the end-to-end measurement
E2E_SECONDS_MAX = 10.0        # the end-to-end measurement lasts min(seconds, this) (or its records)
RECEIVE_TIMEOUT_MS = 30_000   # a receive() waiting longer than this breaks the run
PACE_MIN_S, PACE_MAX_S = 0.001, 0.005  # the e2e producer's sleeps (not one wake-up per message)
_STAMP = struct.Struct(">q")  # the due time (perf_counter_ns) at the head of an e2e payload
TARGET_RATIO_TO_PRODUCE = 1.2  # consume msgs/s over produce-backlog's, same run
TARGET_E2E_P99_MS = 25.0      # consume-e2e p99 ...
TARGET_E2E_RATE = 10_000.0    # ... offering this many msgs/s


def measure(workdir: str, shape: Shape, message_bytes: int, batch: int, max_pending: int, partitions: int,
            seconds: float, records_max: int, receiver_queue: int, rate: float, idle_guard: Callable[[str], float],
            config: Config, config_path: str | None = None, keep: bool = False) -> list[Result]:
    if message_bytes < _STAMP.size:
        raise ValueError(f"message size must be >= {_STAMP.size} bytes (the e2e payload carries a timestamp)")
    results = []
    with topic_cluster(workdir, shape, config, config_path, keep) as cluster:
        with Client(cluster.broker_address, operation_timeout_ms=OPERATION_TIMEOUT_MS) as client:
            common = {"ensemble": shape.ensemble, "write_quorum": shape.write_quorum, "ack_quorum": shape.ack_quorum,
                      "partitions": partitions, "receiver_queue": receiver_queue}
            # 1. a backlog produced, then 2. consumed as fast as it can be
            topic = fresh_topic(client, partitions)
            consumer = client.subscribe(topic, "perf", SubscriptionType.Exclusive,
                                        initial_position=InitialPosition.Earliest, receiver_queue_size=receiver_queue)
            producer = client.create_producer(topic, batching_max_messages=batch, max_pending_messages=max_pending,
                                              block_if_queue_full=True, send_timeout_ms=SEND_TIMEOUT_MS)
            idle = idle_guard("produce-backlog")
            meter = CpuMeter(cluster)
            meter.start()
            filled = drive_produce(producer, message_bytes, seconds, records_max)
            cpu = meter.stop(filled.elapsed_s)
            producer.close()
            if filled.failed or filled.receipted != filled.sent:
                raise RuntimeError(f"filling the backlog: {filled.failed} of {filled.sent} failed ({filled.first_error})")
            results.append(make_result("produce-backlog", message_bytes, batch, filled.elapsed_s, filled.latencies,
                                       idle, {**common, "max_pending": max_pending,
                                              "latency": "send_async -> receipt", **cpu,
                                              "p95_ms": filled.latencies.percentile_s(95.0) * 1000.0}))
            idle = idle_guard("consume")
            meter = CpuMeter(cluster)
            meter.start()
            latencies, elapsed = _drain(consumer, filled.sent, message_bytes)
            cpu = meter.stop(elapsed)
            consumer.close()
            results.append(make_result("consume", message_bytes, batch, elapsed, latencies, idle,
                                       {**common, "latency": "receive() call", **cpu,
                                        "p95_ms": latencies.percentile_s(95.0) * 1000.0}))
            # 3. end-to-end latency at a steady rate
            topic = fresh_topic(client, partitions)
            consumer = client.subscribe(topic, "perf", SubscriptionType.Exclusive,
                                        initial_position=InitialPosition.Earliest, receiver_queue_size=receiver_queue)
            producer = client.create_producer(topic, batching_max_messages=batch, max_pending_messages=max_pending,
                                              block_if_queue_full=True, send_timeout_ms=SEND_TIMEOUT_MS)
            idle = idle_guard(f"consume-e2e at {rate:,.0f} msgs/s")
            e2e_seconds = min(seconds, E2E_SECONDS_MAX) if seconds > 0 else 0.0
            e2e_records = records_max if records_max > 0 else 0
            meter = CpuMeter(cluster)
            meter.start()
            latencies, elapsed, lag_ms = _end_to_end(producer, consumer, message_bytes, rate, e2e_seconds, e2e_records)
            cpu = meter.stop(elapsed)
            producer.close()
            consumer.close()
            results.append(make_result("consume-e2e", message_bytes, batch, elapsed, latencies, idle,
                                       {**common, "latency": "due time -> received", "rate_target_per_s": rate,
                                        "producer_lag_max_ms": lag_ms, **cpu,
                                        "p95_ms": latencies.percentile_s(95.0) * 1000.0}))
    for r in results:
        r.extra.update(cluster.pids())
    return results


def _drain(consumer, count: int, message_bytes: int) -> tuple[LatencyRecorder, float]:
    """Receive and acknowledge `count` messages; check them (size, order per partition, no duplicates)."""
    clock = time.perf_counter
    samples: list[float] = []
    last_id: dict[int, tuple] = {}
    receive, ack = consumer.receive, consumer.acknowledge
    start = clock()
    for _ in range(count):
        t0 = clock()
        m = receive(RECEIVE_TIMEOUT_MS)
        samples.append(clock() - t0)
        mid = m.message_id()
        previous = last_id.get(mid.partition)
        if previous is not None and mid <= previous:
            raise RuntimeError(f"message {mid} came after {previous}: out of order or a duplicate")
        last_id[mid.partition] = mid
        if len(m.data()) != message_bytes:
            raise RuntimeError(f"message {mid} has {len(m.data())} bytes, sent {message_bytes}")
        ack(m)
    elapsed = clock() - start
    recorder = LatencyRecorder()
    for s in samples:
        recorder.add(s)
    return recorder, elapsed


def _end_to_end(producer, consumer, message_bytes: int, rate: float, seconds: float,
                records_max: int) -> tuple[LatencyRecorder, float, float]:
    """Open-loop producer thread at `rate`; this thread receives. (latencies, elapsed, the latest the producer
    sent a message after its due time, in ms)."""
    clock_ns = time.perf_counter_ns
    filler = payload_of(message_bytes)[_STAMP.size:]
    total = records_max if records_max > 0 else int(rate * seconds)
    state = {"sent": 0, "lag_max_ns": 0, "error": None}
    start_ns = clock_ns() + 50_000_000  # 50 ms to start both sides
    step_ns = 1e9 / rate

    def produce() -> None:
        try:
            k = 0
            while k < total:
                now = clock_ns()
                due = start_ns + int(k * step_ns)
                if due > now:  # pacing: sleep to the next due time, at least PACE_MIN_S (what falls due
                    # meanwhile goes in one burst; its latency counts from its due time)
                    time.sleep(max(PACE_MIN_S, min((due - now) / 1e9, PACE_MAX_S)))
                    continue
                state["lag_max_ns"] = max(state["lag_max_ns"], now - due)
                while k < total and start_ns + int(k * step_ns) <= now:  # everything due by now
                    producer.send_async(_STAMP.pack(start_ns + int(k * step_ns)) + filler, None)
                    k += 1
            state["sent"] = k
        except Exception as e:  # noqa: BLE001 - reported by the receiving side
            state["error"] = e

    thread = threading.Thread(target=produce, name="perf-e2e-producer", daemon=True)
    thread.start()
    samples: list[int] = []
    receive, ack = consumer.receive, consumer.acknowledge
    try:
        for _ in range(total):
            m = receive(RECEIVE_TIMEOUT_MS)
            samples.append(clock_ns() - _STAMP.unpack_from(m.data())[0])
            ack(m)
    finally:
        thread.join(RECEIVE_TIMEOUT_MS / 1000)
    if state["error"] is not None:
        raise RuntimeError(f"the e2e producer failed: {state['error']}")
    elapsed = (clock_ns() - start_ns) / 1e9
    recorder = LatencyRecorder()
    for s in samples:
        recorder.add(max(0, s) / 1e9)
    return recorder, elapsed, state["lag_max_ns"] / 1e6


# ---------------------------------------------------------------------------------------------- verdicts
def ratios(results: list[Result]) -> list[Ratio]:
    """consume / produce-backlog (msgs/s, the same run) against TARGET_RATIO_TO_PRODUCE."""
    by_name = {r.name: r for r in results}
    if "consume" not in by_name or "produce-backlog" not in by_name:
        return []
    return [ratio(by_name["consume"], by_name["produce-backlog"], TARGET_RATIO_TO_PRODUCE)]


def targets(results: list[Result]) -> list[dict]:
    """The end-to-end target of each consume-e2e result."""
    return [e2e_target(r) for r in results if r.name == "consume-e2e"]


def e2e_target(r: Result) -> dict:
    """p99 <= TARGET_E2E_P99_MS offering TARGET_E2E_RATE msgs/s of 100 bytes. Offered less, the run can fail the
    target but not establish it."""
    rate = r.extra["rate_target_per_s"]
    value = f"p99 {r.p99_ms:.1f} ms at {rate:,.0f} msgs/s offered, {r.record_bytes} B"
    if r.record_bytes != TARGET_MESSAGE_BYTES:
        met, why = None, " (target is for 100-byte messages)"
    elif rate >= TARGET_E2E_RATE:
        met, why = r.p99_ms <= TARGET_E2E_P99_MS, ""
    elif r.p99_ms > TARGET_E2E_P99_MS:
        met, why = False, f" (above the limit even below {TARGET_E2E_RATE:,.0f} msgs/s)"
    else:
        met, why = None, f" (offered below {TARGET_E2E_RATE:,.0f} msgs/s: not established)"
    return {"target": f"{r.name} p99 <= {TARGET_E2E_P99_MS:g} ms at {TARGET_E2E_RATE:,.0f} msgs/s "
                      f"(producer and consumer in one process)", "value": value + why, "met": met}
