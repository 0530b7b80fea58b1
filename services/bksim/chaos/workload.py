"""The chaos workload: ledger writers and a topic producer that record exactly what was acknowledged, and when.

Ledgers (`LedgerWriter`, asyncio): create a ledger of one shape (E/Qw/Qa) through a broker (round-robin over
the brokers, the next one when one fails), append batches of self-describing payloads on one Append stream at
a fixed rate (`ledger_payload(ledger, index)`: the index is the append order, so with one writer entry id ==
index), roll to a new ledger every `entries_per_ledger` entries (closing the old one). Every AppendResponse
is recorded: entry id -> index (`LedgerRecord.acked`); a response whose ids are not the expected ones is
counted (`ack_mismatch`). A stream that fails or stays silent for `response_timeout_s` ends that ledger: the
writer asks its broker to close it, and if that fails has another broker recover it (fence + close, as a
takeover would), then goes on with a new ledger. Appends without a response have an unknown outcome.
With `keep_closed` N > 0 (a deleting writer, for garbage collection under faults) a writer deletes, after each
ledger it closes, its closed ledgers beyond the newest N through a broker (`delete_ledger`: the metadata goes,
the bookies' garbage collection frees the rest); a deleted ledger moves from `ledgers` to `deleted` before the
call (a delete whose answer is lost may have happened: that ledger is never checked again), so the end checks
read exactly the ledgers a writer did not delete. At most one delete call per closed ledger, each with a
deadline.

Topic (`TopicWorkload`, the bksim.client thread): one topic in a namespace with dedup and infinite
retention, one named producer sending `topic_payload(seq)` at a fixed rate with send_async; every receipt
(seq -> MessageId) and every failure is recorded with its time.

`Recorder` keeps the acknowledgement times of both (per second buckets and the raw times for gaps) and the
timeline of events; it is thread-safe. Bounds: a stream has at most `window` requests unanswered; a producer
at most `max_pending` messages (then send_async blocks); every call has a deadline.
"""
from __future__ import annotations

import asyncio
import collections
import re
import threading
import time
from dataclasses import dataclass, field

from bksim.adapters.broker_client import BrokerCallError, BrokerClient
from bksim.client import Client, ClientError
from bksim.chaos.credentials import PLAIN, Credentials

LEDGER_PASSWORD = b"chaos-ledgers"
ENTRY_BYTES = 64
MESSAGE_BYTES = 48
CALL_DEADLINE_S = 5.0  # create / close
RECOVER_DEADLINE_S = 30.0  # a hand-over recovery by another broker
RETRY_DELAY_S = 0.25  # after a failed create
TENANT = "chaos"
NAMESPACE = "chaos/ns"
TOPIC = "persistent://chaos/ns/events"
PRODUCER_NAME = "chaos-producer"

_LEDGER_RE = re.compile(rb"^L(\d+):(\d{8})\|")
_TOPIC_RE = re.compile(rb"^M(\d{8})\|")


def ledger_payload(ledger_id: int, index: int) -> bytes:
    head = b"L%d:%08d|" % (ledger_id, index)
    return head + b"x" * max(0, ENTRY_BYTES - len(head))


def parse_ledger_payload(data: bytes) -> tuple[int, int] | None:
    m = _LEDGER_RE.match(data)
    return (int(m.group(1)), int(m.group(2))) if m else None


def topic_payload(seq: int) -> bytes:
    head = b"M%08d|" % seq
    return head + b"y" * max(0, MESSAGE_BYTES - len(head))


def parse_topic_payload(data: bytes) -> int | None:
    m = _TOPIC_RE.match(data)
    return int(m.group(1)) if m else None


class Recorder:
    """Acknowledgement times per stream ("ledger", "topic") and the run's event timeline (seconds since t0)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._lock = threading.Lock()
        self.acks: dict[str, list[float]] = {"ledger": [], "topic": []}  # one time per acknowledged batch/receipt
        self.counts: dict[str, collections.Counter] = {"ledger": collections.Counter(), "topic": collections.Counter()}
        self.events: list[dict] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def ack(self, stream: str, n: int) -> None:
        t = self.now()
        with self._lock:
            self.acks[stream].append(t)
            self.counts[stream][int(t)] += n

    def event(self, kind: str, what: str, **extra) -> dict:
        e = {"t": round(self.now(), 3), "kind": kind, "what": what, **extra}
        with self._lock:
            self.events.append(e)
        return e


@dataclass
class LedgerRecord:
    ledger_id: int
    writer: str
    shape: tuple[int, int, int]
    broker: str
    acked: dict[int, int] = field(default_factory=dict)  # entry id -> append index
    ack_mismatch: int = 0
    sent: int = 0
    end: str = "writing"  # closed | handed-over | left-open
    end_detail: str = ""
    created_t: float = 0.0  # recorder time (seconds since t0) when its create returned
    closed_t: float | None = None  # recorder time when its writer closed it


class LedgerWriter:
    def __init__(self, name: str, shape: tuple[int, int, int], brokers: list[str], recorder: Recorder,
                 stop: threading.Event, *, rate: float = 200.0, batch: int = 10, window: int = 8,
                 entries_per_ledger: int = 1000, response_timeout_s: float = 4.0, keep_closed: int = 0,
                 credentials: Credentials = PLAIN) -> None:
        self.name = name
        self.credentials = credentials
        self.shape = shape
        self.brokers = list(brokers)
        self.recorder = recorder
        self.stop = stop
        self.rate = rate
        self.batch = batch
        self.window = window
        self.entries_per_ledger = entries_per_ledger
        self.response_timeout_s = response_timeout_s
        self.keep_closed = keep_closed
        self.ledgers: list[LedgerRecord] = []
        self.deleted: list[LedgerRecord] = []  # deleted by this writer (or a delete was tried: outcome unknown)
        self.create_failures = 0
        self.delete_failures = 0
        self._turn = 0

    def _next_broker(self) -> str:
        address = self.brokers[self._turn % len(self.brokers)]
        self._turn += 1
        return address

    async def run(self) -> None:
        while not self.stop.is_set():
            address = self._next_broker()
            client = self.credentials.broker(address, deadline_s=CALL_DEADLINE_S,
                                             recover_deadline_s=RECOVER_DEADLINE_S)
            try:
                try:
                    info = await client.create_ledger(*self.shape, password=LEDGER_PASSWORD)
                except BrokerCallError as e:
                    self.create_failures += 1
                    if self.create_failures == 1 or self.create_failures % 20 == 0:
                        self.recorder.event("workload", f"{self.name}: create on {address} failed: {e.status}",
                                            failures=self.create_failures)
                    await asyncio.sleep(RETRY_DELAY_S)
                    continue
                record = LedgerRecord(info.ledger_id, self.name, self.shape, address, created_t=self.recorder.now())
                self.ledgers.append(record)
                await self._write(client, record)
                if record.end != "closed":
                    await asyncio.sleep(RETRY_DELAY_S)  # the ledger failed: do not spin through new ones
                elif self.keep_closed > 0:
                    await self._delete_old(client)
            finally:
                await client.close()

    async def _write(self, client: BrokerClient, record: LedgerRecord) -> None:
        loop = asyncio.get_running_loop()
        stream = client.append_stream(record.ledger_id, password=LEDGER_PASSWORD, window_max=self.window,
                                      response_timeout_s=self.response_timeout_s)
        queue: asyncio.Queue = asyncio.Queue(2 * self.window + 1)

        async def collect() -> None:
            while True:
                item = await queue.get()
                if item is None:
                    return
                future, first, n = item
                r = await stream.result(future)
                for j in range(r.count):
                    record.acked[r.first_entry_id + j] = first + j
                if (r.first_entry_id, r.count) != (first, n):
                    record.ack_mismatch += 1
                self.recorder.ack("ledger", r.count)

        collector = loop.create_task(collect())
        interval = self.batch / self.rate
        due = loop.time()
        try:
            while not self.stop.is_set() and record.sent < self.entries_per_ledger and not collector.done():
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                due = max(due + interval, loop.time() - 1.0)  # behind schedule: do not burst more than 1 s
                first = record.sent
                payloads = [ledger_payload(record.ledger_id, first + j) for j in range(self.batch)]
                future = await asyncio.wait_for(stream.send(payloads), self.response_timeout_s)
                record.sent += self.batch
                await asyncio.wait_for(queue.put((future, first, self.batch)), self.response_timeout_s)
            if not collector.done():
                await asyncio.wait_for(queue.put(None), self.response_timeout_s)
            await asyncio.wait_for(collector, self.response_timeout_s * (2 * self.window + 2))
            await stream.close(self.response_timeout_s)
            closed = await client.close_ledger(record.ledger_id, password=LEDGER_PASSWORD)
            record.end = "closed"
            record.closed_t = self.recorder.now()
            record.end_detail = f"closed by its writer at last entry {closed.last_entry_id}"
        except (BrokerCallError, TimeoutError) as e:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)
            await stream.close(0.5)
            why = f"{type(e).__name__}: {e}" if isinstance(e, TimeoutError) else f"{e.status}: {e}"
            self.recorder.event("workload", f"{self.name}: ledger {record.ledger_id} on {record.broker} failed "
                                f"({why[:160]})", ledger_id=record.ledger_id)
            await self._hand_over(client, record)

    async def _delete_old(self, client: BrokerClient) -> None:
        """Delete this writer's closed ledgers beyond the newest `keep_closed` (the module docstring)."""
        closed = [r for r in self.ledgers if r.end == "closed"]
        for record in closed[:-self.keep_closed]:
            self.ledgers.remove(record)
            self.deleted.append(record)
            try:
                await asyncio.wait_for(client.delete_ledger(record.ledger_id, password=LEDGER_PASSWORD),
                                       CALL_DEADLINE_S)
                self.recorder.event("workload", f"{self.name}: deleted ledger {record.ledger_id} "
                                    f"({len(record.acked)} acknowledged entries)", ledger_id=record.ledger_id)
            except (BrokerCallError, TimeoutError) as e:
                self.delete_failures += 1
                record.end_detail = f"delete failed (it may have happened): {str(e)[:120]}"
                self.recorder.event("workload", f"{self.name}: delete of ledger {record.ledger_id} failed "
                                    f"({str(e)[:120]}); not checked", ledger_id=record.ledger_id)

    async def _hand_over(self, client: BrokerClient, record: LedgerRecord) -> None:
        """The writer gave up on a ledger: close it through its broker, else have another broker recover it."""
        try:
            await asyncio.wait_for(client.close_ledger(record.ledger_id, password=LEDGER_PASSWORD), CALL_DEADLINE_S)
            record.end, record.end_detail = "closed", "closed by its writer after a failed append"
            return
        except (BrokerCallError, TimeoutError) as e:
            first_error = str(e)[:120]
        for address in self.brokers:
            if address == record.broker:
                continue
            other = self.credentials.broker(address, deadline_s=CALL_DEADLINE_S,
                                            recover_deadline_s=RECOVER_DEADLINE_S)
            try:
                t = time.monotonic()
                info, _ = await other.open_ledger(record.ledger_id, password=LEDGER_PASSWORD, recover=True)
                record.end = "handed-over"
                record.end_detail = (f"close failed ({first_error}); recovered by {address} in "
                                     f"{time.monotonic() - t:.2f} s, last entry {info.last_entry_id}")
                self.recorder.event("recovery", f"{self.name}: ledger {record.ledger_id} recovered by {address}",
                                    ledger_id=record.ledger_id, seconds=round(time.monotonic() - t, 3))
                return
            except BrokerCallError as e:
                first_error = f"{first_error}; recover on {address}: {e.status}"
            finally:
                await other.close()
        record.end, record.end_detail = "left-open", first_error


async def run_writers(writers: list[LedgerWriter]) -> None:
    await asyncio.gather(*(w.run() for w in writers))


class TopicWorkload:
    """One producer on TOPIC through every broker address, at `rate` messages/s (send_async)."""

    def __init__(self, brokers: list[str], recorder: Recorder, stop: threading.Event, *, rate: float = 200.0,
                 send_timeout_ms: int = 60_000, max_pending: int = 20_000, credentials: Credentials = PLAIN) -> None:
        self.brokers = list(brokers)
        self.credentials = credentials
        self.recorder = recorder
        self.stop = stop
        self.rate = rate
        self.send_timeout_ms = send_timeout_ms
        self.max_pending = max_pending
        self.sent = 0
        self.receipts: dict[int, tuple[int, int, int]] = {}  # seq -> (ledger, entry, batch index)
        self.duplicate_receipts: set[int] = set()  # seqs the broker's dedup answered as duplicates
        self.failed: dict[int, str] = {}
        self._lock = threading.Lock()
        self.client: Client | None = None
        self.producer = None

    def setup(self) -> None:
        self.client = self.credentials.topic(self.brokers, operation_timeout_ms=30_000)
        self.client.create_tenant(TENANT)
        self.client.create_namespace(NAMESPACE, retention_ms=-1, dedup=True)
        self.client.create_topic(TOPIC)
        self.producer = self.client.create_producer(
            TOPIC, producer_name=PRODUCER_NAME, batching_max_publish_delay_ms=5, send_timeout_ms=self.send_timeout_ms,
            max_pending_messages=self.max_pending, block_if_queue_full=True)

    def _callback(self, seq: int):
        def done(error, message_id) -> None:
            with self._lock:
                if error is not None or message_id is None:
                    self.failed[seq] = str(error)[:200]
                elif message_id.ledger < 0:
                    self.duplicate_receipts.add(seq)
                else:
                    self.receipts[seq] = (message_id.ledger, message_id.entry, message_id.batch_index)
            if error is None and message_id is not None:
                self.recorder.ack("topic", 1)
        return done

    def run(self) -> None:
        """Send until `stop` is set (the producer thread's body)."""
        interval = 1.0 / self.rate
        start = time.monotonic()
        while not self.stop.is_set():
            due_count = int((time.monotonic() - start) / interval) + 1
            while self.sent < due_count and not self.stop.is_set():
                try:
                    self.producer.send_async(topic_payload(self.sent), self._callback(self.sent))
                except ClientError as e:
                    with self._lock:
                        self.failed[self.sent] = f"send_async: {e}"[:200]
                self.sent += 1
            self.stop.wait(min(0.01, interval))

    def finish(self, timeout_s: float) -> None:
        """Wait (bounded) for every receipt, then close the producer."""
        try:
            self.producer.flush(timeout_s)
        except ClientError as e:
            self.recorder.event("workload", f"topic producer flush: {e}")
        try:
            self.producer.close()
        except ClientError:
            pass

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def snapshot(self) -> tuple[dict, set, dict]:
        with self._lock:
            return dict(self.receipts), set(self.duplicate_receipts), dict(self.failed)
