"""The load of `bksim perf scale`'s topic axes (perf/scale_topics.py): the cluster, producers on a schedule and
consumers drained by one thread, and the clients they are spread over.

`scale_cluster`: a started, ready perf/ledger_write.LedgerCluster of BOOKIES bookies and one broker making topic
ledgers of SHAPE and admitting every stream of the run (broker.requests_inflight_max).

`Load`: every producer added sends `rate` msgs/s (open loop: one sender thread keeps a heap of due times; message k
of a producer is due at its start + k / rate, spread over one period at random when it is added, and its due time
travels at the head of the payload); one draining thread sweeps every consumer added, every SWEEP_S, receiving and
acknowledging what each has queued (and recording the end-to-end latency, due time -> received, while
`recording`). `paused()` stops sending (after what is in flight is received) and then shifts every schedule by the
pause. `stop(settled)` stops sending and waits, bounded, until `settled()` (by default: every message sent was
received) or fails.

`Clients`: one `bksim.client.Client` (one event-loop thread, one gRPC channel to the broker) per `per_client` topics,
all in this process.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import random
import struct
import threading
import time
from typing import Callable

from bksim.client import Client
from bksim.model.config import Config
from bksim.perf.ledger_write import CALL_DEADLINE_S, LedgerCluster, Shape
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder

BOOKIES = 2
SHAPE = Shape(2, 2, 2)
MESSAGE_BYTES = 100
SWEEP_S = 0.02  # the draining thread's pause between sweeps over the consumers
PACE_MAX_S = 0.01  # the sender thread's longest sleep
RECEIVE_TIMEOUT_MS = 30_000
OPERATION_TIMEOUT_MS = 30_000
DRAIN_WAIT_S = 30.0  # after the load stops: every message sent must be received within this
STREAMS_SPARE = 200  # concurrent RPCs beyond the producers' and consumers' streams (admin calls, lookups)
_STAMP = struct.Struct(">q")  # the send due time (perf_counter_ns) at the head of every payload


@contextlib.contextmanager
def scale_cluster(workdir: str, config: Config, config_path: str | None, keep: bool, streams: int):
    """A started, ready LedgerCluster: BOOKIES bookies, one broker making topic ledgers of SHAPE and admitting at
    least `streams` concurrent RPCs (broker.requests_inflight_max: every producer and consumer holds one stream)."""
    env = {"BKSIM_TOPIC_ENSEMBLE_SIZE": str(SHAPE.ensemble), "BKSIM_TOPIC_WRITE_QUORUM_SIZE": str(SHAPE.write_quorum),
           "BKSIM_TOPIC_ACK_QUORUM_SIZE": str(SHAPE.ack_quorum),
           "BKSIM_BROKER_REQUESTS_INFLIGHT_MAX": str(max(config.broker.requests_inflight_max, streams + STREAMS_SPARE))}
    cluster = LedgerCluster(workdir, BOOKIES, config, config_path, keep, child_env=env).__enter__()
    try:
        run_interruptible(_wait_ready(cluster))
        yield cluster
    finally:
        cluster.__exit__(None, None, None)


async def _wait_ready(cluster: LedgerCluster) -> None:
    async with cluster.broker_client(deadline_s=CALL_DEADLINE_S) as client:
        await cluster.wait_serving(client, BOOKIES)


class Load:
    """Producers at `rate` msgs/s each (one sender thread, open loop) and consumers drained by one thread, which
    acknowledges every message and records its end-to-end latency (due time -> received) while `recording`."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._heap: list[tuple[int, int, object]] = []
        self._held: list[tuple[int, int, object]] | None = None  # while paused: the schedules, producers added meanwhile
        self._consumers: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seq = itertools.count()
        self.sent = self.failed = self.received = 0
        self.first_error: str | None = None
        self.recording: LatencyRecorder | None = None
        self._filler = (b"bksim-scale-" * (MESSAGE_BYTES // 12 + 1))[:MESSAGE_BYTES - _STAMP.size]
        self._threads = [threading.Thread(target=self._send_loop, name="scale-sender", daemon=True),
                         threading.Thread(target=self._drain_loop, name="scale-drainer", daemon=True)]
        for t in self._threads:
            t.start()

    def payload(self, due_ns: int) -> bytes:
        return _STAMP.pack(due_ns) + self._filler

    def add(self, producer=None, consumers=()) -> None:
        """Start sending on `producer` (its first message due within one period from now, or from the end of a pause)
        and draining `consumers`."""
        with self._lock:
            if producer is not None:
                due = time.perf_counter_ns() + int(random.random() * 1e9 / self.rate)
                heapq.heappush(self._heap if self._held is None else self._held, (due, next(self._seq), producer))
            self._consumers.extend(consumers)

    def counts(self) -> tuple[int, int]:
        return self.sent, self.received

    @contextlib.contextmanager
    def paused(self):
        """No message is sent meanwhile (the ones in flight are received first, bounded; this counts one consumer per
        producer, as the topics axis has); afterwards every producer's schedule resumes where it stopped, shifted by the
        pause (no burst of overdue messages)."""
        with self._lock:
            self._held, self._heap = self._heap, []
        started = time.perf_counter_ns()
        deadline = time.monotonic() + DRAIN_WAIT_S
        while self.received < self.sent and time.monotonic() < deadline and self._threads[1].is_alive():
            time.sleep(SWEEP_S)
        try:
            yield
        finally:
            shift = time.perf_counter_ns() - started
            with self._lock:
                held, self._held = self._held or [], None
                for due, seq, producer in held:
                    heapq.heappush(self._heap, (due + shift, seq, producer))

    def on_receipt(self, error, _message_id) -> None:  # the client's loop thread: a send's callback
        if error is not None:
            with self._lock:
                self.failed += 1
                self.first_error = self.first_error or str(error)

    def _send_loop(self) -> None:
        step_ns = int(1e9 / self.rate)
        clock = time.perf_counter_ns
        try:
            while not self._stop.is_set():
                now = clock()
                due_items = []
                with self._lock:
                    while self._heap and self._heap[0][0] <= now:
                        due, seq, producer = heapq.heappop(self._heap)
                        due_items.append((due, producer))
                        heapq.heappush(self._heap, (due + step_ns, seq, producer))
                    next_due = self._heap[0][0] if self._heap else now + int(PACE_MAX_S * 1e9)
                for due, producer in due_items:
                    producer.send_async(self.payload(due), self.on_receipt)
                    self.sent += 1
                time.sleep(min(PACE_MAX_S, max(0.0, (next_due - clock()) / 1e9)))
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.first_error = self.first_error or f"sender: {e}"

    def _drain_loop(self) -> None:
        clock = time.perf_counter_ns
        try:
            while not self._stop.is_set():
                with self._lock:
                    consumers = list(self._consumers)
                for c in consumers:
                    while c.queued():
                        m = c.receive(RECEIVE_TIMEOUT_MS)
                        recording = self.recording
                        if recording is not None:
                            recording.add(max(0, clock() - _STAMP.unpack_from(m.data())[0]) / 1e9)
                        c.acknowledge(m)
                        self.received += 1
                time.sleep(SWEEP_S)
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.first_error = self.first_error or f"drainer: {e}"

    def stop(self, settled: Callable[[], bool] | None = None) -> None:
        """Stop sending, wait (bounded) until `settled()` (default: every message sent was received), then stop
        draining. RuntimeError when a send failed or the load did not settle."""
        settled = settled or (lambda: self.received >= self.sent)
        with self._lock:
            self._heap.clear()
            self._held = None
        time.sleep(SWEEP_S * 2)
        deadline = time.monotonic() + DRAIN_WAIT_S
        done = settled()
        while not done and time.monotonic() < deadline and self.first_error is None and self._threads[1].is_alive():
            time.sleep(0.1)
            done = settled()
        self.close()
        if self.first_error:
            raise RuntimeError(f"scale load failed: {self.first_error} ({self.failed} send(s) failed)")
        if not done:
            raise RuntimeError(f"scale load: {self.sent:,} messages sent, {self.received:,} received; not every "
                               f"message was received within {DRAIN_WAIT_S:.0f} s")

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(RECEIVE_TIMEOUT_MS / 1000)


class Clients:
    """One Client per `per_client` topics (created as needed); closed together (each in a thread of its own)."""

    def __init__(self, address: str, per_client: int) -> None:
        self.address = address
        self.per_client = per_client
        self._clients: list[Client] = []
        self._lock = threading.Lock()

    def for_topic(self, index: int) -> Client:
        with self._lock:
            while len(self._clients) <= index // self.per_client:
                self._clients.append(Client(self.address, operation_timeout_ms=OPERATION_TIMEOUT_MS))
            return self._clients[index // self.per_client]

    def __len__(self) -> int:
        return len(self._clients)

    def close(self) -> None:
        threads = [threading.Thread(target=c.close, daemon=True) for c in self._clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
