"""recovery: how long a broker takes to recover (fence, read forward, write back, close) an open ledger whose
dying writer left a window of `entries` unconfirmed entries on its bookies.

The cluster is perf.ledger_write.LedgerCluster (real ZooKeeper, E bookie processes, one broker process).

Making the window, as a writer that dies would leave it: the ledger's metadata is created through the broker
(CreateLedger: state OPEN, one segment on E bookies); then this process writes the entries straight to the
bookies (adapters.bookie_client AddStreams, one per bookie, batches of `batch` entries): entry e goes to its
write set (ledger.quorum.write_set_indexes, striping over the ensemble), in the wire format of
formats.entry.encode_entry with the ledger's digest type and master key, its payload naming the ledger and
the entry. The LAC piggybacked in entry e is min(lac, e - 1) with `lac` fixed (default -1): the writer
never learnt of an acknowledgement, so the recovered LAC stays at `lac` and recovery must read forward and
write back every entry above it. Every add must be acknowledged OK (journal-synced) before the clock starts.

The figure: from the client's OpenLedger(recover=True) call to its answer, through the broker. Then the
metadata must be CLOSED at the last entry (entries - 1) with the ledger's whole length, OpenLedger's LAC must
be that entry, and a sample of entries (first, middle, last, and a few spread between) must read back
through the broker byte for byte.

The time split (approximate; the figure is the client's total):
- the broker logs "recovery started" (after the OPEN -> IN_RECOVERY CAS) and "recovered and CLOSED ...
  (recovered LAC L, N entries written back)"; the span between their timestamps is the broker's share;
- the broker does not log the boundaries between fencing, read-forward and write-back, but only the
  write-back writes entries to the bookies' journals (fencing and the read-forward, whose reads all fence,
  write nothing but a small FENCE record per read). `JournalWatch` samples the size of every bookie's
  journal files every JOURNAL_SAMPLE_S during the call: "before write-back" (CAS, fencing, read-forward)
  ends when some journal grows by several entries at once, the write-back ends when every journal has
  reached its final size, the rest is the close (CAS) and the answer;
- the fixed part (metadata CASes, fencing, one read past the end, the close) is also measured on its own: a
  reference ledger with the same entries but a piggybacked LAC that kept up (e - 1), whose recovery writes
  back one entry; the per-entry cost is (window time - reference time) / (entries - 1).
A warm-up recovery of a 1-entry ledger first opens the broker's connections to the bookies, so neither figure
pays for them.

Target: <= 1 s for a 10,000-entry window (E=3, Qw=3, Qa=2).
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import struct
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.broker_client import BrokerClient
from bksim.formats.entry import HEADER_BYTES, encode_entry, master_key
from bksim.ledger.quorum import write_set_indexes
from bksim.model.config import Config
from bksim.perf.ledger_write import CALL_DEADLINE_S, PASSWORD, CpuMeter, LedgerCluster, Shape
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

TARGET_S = 1.0
TARGET_ENTRIES = 10_000
WRITER_WINDOW = 8  # unanswered AddRequests per bookie stream of the dying writer
WRITER_RESPONSE_TIMEOUT_S = 30.0
RECOVER_DEADLINE_S = 120.0  # the OpenLedger(recover=True) call; a recovery slower than this fails the run
JOURNAL_SAMPLE_S = 0.005  # how often JournalWatch looks at the journals' sizes (the split's resolution)
SAMPLE_SPREAD = 10  # entries read back at random places, besides the first, middle and last ones
SAMPLE_RUN = 5  # consecutive entries read back at the start, the middle and the end
PAYLOAD_ID = struct.Struct(">qq")  # a payload starts with (ledger id, entry id)
LOG_STAMP = re.compile(r"^(\S+) broker \S+ ledger (\d+): (recovery started|recovered and CLOSED at last_entry_id "
                       r"(-?\d+) \(recovered LAC (-?\d+), (\d+) entries written back\))")


def payload(ledger_id: int, entry_id: int, entry_bytes: int) -> bytes:
    """The payload of entry `entry_id`: (ledger id, entry id) then filler, `entry_bytes` long (>= 16)."""
    head = PAYLOAD_ID.pack(ledger_id, entry_id)
    return head + bytes((entry_id + i) % 251 for i in range(entry_bytes - len(head)))


@dataclass
class Recovered:
    ledger_id: int
    seconds: float  # the client's OpenLedger(recover=True) call
    last_entry_id: int
    broker_span_s: float  # "recovery started" .. "recovered and CLOSED" in the broker log (-1: not found)
    recovered_lac: int  # from the broker log (-2: not found)
    written_back: int  # from the broker log (-1: not found)
    cpu: dict
    idle_before: float  # the machine's idle fraction before the call (-1: not measured)
    split: dict  # JournalWatch's phases (seconds), empty when the journals did not show a write-back


class JournalWatch:
    """Samples the total size of each journal directory's files every `interval_s` while running (a task on
    the caller's event loop; stat calls only, no reads)."""

    def __init__(self, dirs: list[str], interval_s: float = JOURNAL_SAMPLE_S) -> None:
        self.dirs = dirs
        self.interval_s = interval_s
        self.samples: list[tuple[float, tuple[int, ...]]] = []  # (perf_counter, bytes per dir)
        self._task: asyncio.Task | None = None

    @staticmethod
    def _bytes(path: str) -> int:
        total = 0
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
        except OSError:
            pass
        return total

    def sample(self) -> None:
        self.samples.append((time.perf_counter(), tuple(self._bytes(d) for d in self.dirs)))

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self.sample()

    def split(self, started: float, ended: float, entry_record_bytes: int, written_back: int) -> dict:
        """{"before_write_back_s", "write_back_s", "after_write_back_s"} of the call [started, ended], or {}
        when the journals show no write-back.

        Fencing reads journal small FENCE records too (every fenced read, 18 bytes each), so the write-back is
        recognised by its size: it begins in the first sampling interval in which some journal grew by at
        least min(8, written_back) entry records (reads cannot do that in one interval), and it has ended at
        the first sample at which every journal has its final size (the close journals nothing)."""
        if len(self.samples) < 2 or written_back <= 0:
            return {}
        step = min(8, written_back) * entry_record_bytes
        first = None
        for (t0, before), (_, after) in zip(self.samples, self.samples[1:]):
            if any(a - b >= step for a, b in zip(after, before)):
                first = t0
                break
        if first is None:
            return {}
        final = self.samples[-1][1]
        done = max(first, next(t for t, sizes in self.samples if sizes == final))
        return {"before_write_back_s": max(0.0, first - started), "write_back_s": max(0.0, done - first),
                "after_write_back_s": max(0.0, ended - done)}


def measure(workdir: str, shape: Shape, entries: int, entry_bytes: int, lac: int, batch: int,
            idle_guard: Callable[[str], float], config: Config, config_path: str | None = None,
            keep: bool = False) -> list[Result]:
    """Start a cluster, make the windows, recover (warm-up, reference, window), stop; the two Results
    ("recovery-reference", then "recovery")."""
    if entries < 2:
        raise ValueError(f"recovery needs at least 2 entries, got {entries}")
    if entry_bytes < PAYLOAD_ID.size:
        raise ValueError(f"entry size must be >= {PAYLOAD_ID.size} bytes (the payload names its entry), got {entry_bytes}")
    if not -1 <= lac < entries - 1:
        raise ValueError(f"the piggybacked LAC must be in -1..{entries - 2}, got {lac}")
    with LedgerCluster(workdir, shape.ensemble, config, config_path, keep) as cluster:
        return run_interruptible(_measure(cluster, shape, entries, entry_bytes, lac, batch, idle_guard))


async def _measure(cluster: LedgerCluster, shape: Shape, entries: int, entry_bytes: int, lac: int, batch: int,
                   idle_guard: Callable[[str], float]) -> list[Result]:
    async with BrokerClient(cluster.broker_address, deadline_s=CALL_DEADLINE_S,
                            recover_deadline_s=RECOVER_DEADLINE_S) as client:
        await cluster.wait_serving(client, shape.ensemble)
        warm = await _open_ledger_with_window(client, shape, 1, entry_bytes, lambda e: e - 1, batch)
        reference = await _open_ledger_with_window(client, shape, entries, entry_bytes, lambda e: e - 1, batch)
        window = await _open_ledger_with_window(client, shape, entries, entry_bytes, lambda e: min(lac, e - 1), batch)
        await _recover(cluster, client, warm, 1, entry_bytes, None)
        ref = await _recover(cluster, client, reference, entries, entry_bytes, idle_guard("recovery-reference"))
        idle = idle_guard("recovery")
        got = await _recover(cluster, client, window, entries, entry_bytes, idle)
    per_entry_ms = ((got.seconds - ref.seconds) / (entries - 1) * 1000.0) if entries > 1 else 0.0
    results = []
    for name, r, expect_written in (("recovery-reference", ref, 1), ("recovery", got, entries - 1 - lac)):
        if r.written_back >= 0 and r.written_back != expect_written:
            raise RuntimeError(f"ledger {r.ledger_id}: the broker wrote back {r.written_back} entries, expected "
                               f"{expect_written} (recovered LAC {r.recovered_lac})")
        latencies = LatencyRecorder()
        latencies.add(r.seconds, max(1, r.written_back))
        extra = {"recovery_s": r.seconds, "window_entries": entries - 1 - r.recovered_lac if r.recovered_lac > -2 else -1,
                 "recovered_lac": r.recovered_lac, "written_back": r.written_back, "last_entry_id": r.last_entry_id,
                 "broker_span_s": r.broker_span_s, "ensemble": shape.ensemble, "write_quorum": shape.write_quorum,
                 "ack_quorum": shape.ack_quorum, "ledger_id": r.ledger_id}
        extra.update(r.split)
        if name == "recovery":
            extra["fixed_s"] = ref.seconds
            extra["per_entry_ms"] = per_entry_ms
        extra.update(r.cpu)
        pids = cluster.pids()
        extra["broker_pid"], extra["zookeeper_pid"] = pids["broker_pid"], pids["zookeeper_pid"]
        results.append(make_result(name, entry_bytes, 1, r.seconds, latencies, r.idle_before, extra))
    return results


async def _open_ledger_with_window(client: BrokerClient, shape: Shape, entries: int, entry_bytes: int,
                                   lac_of: Callable[[int], int], batch: int) -> int:
    """Create a ledger through the broker, then write `entries` entries to its bookies as its writer would
    have, entry e piggybacking LAC lac_of(e); returns the ledger id (the ledger stays OPEN)."""
    info = await client.create_ledger(shape.ensemble, shape.write_quorum, shape.ack_quorum, password=PASSWORD)
    ledger_id = info.ledger_id
    [segment] = info.segments
    key = master_key(PASSWORD)
    per_bookie: dict[str, list[tuple[bytes, bytes, int]]] = {b: [] for b in segment.ensemble}
    length = 0
    for e in range(entries):
        data = payload(ledger_id, e, entry_bytes)
        length += len(data)
        entry = encode_entry(ledger_id, e, lac_of(e), length, data, info.digest_type or "crc32c")
        for i in write_set_indexes(e, len(segment.ensemble), shape.write_quorum):
            per_bookie[segment.ensemble[i]].append((entry, key, 0))
    await asyncio.gather(*(_write_to_bookie(bookie, items, batch) for bookie, items in per_bookie.items()))
    return ledger_id


async def _write_to_bookie(bookie_id: str, items: list[tuple[bytes, bytes, int]], batch: int) -> None:
    """Add `items` to one bookie (its id is its address) in batches; every status must be OK."""
    async with BookieClient(bookie_id, deadline_s=WRITER_RESPONSE_TIMEOUT_S) as bookie:
        stream = bookie.add_stream(window_max=WRITER_WINDOW, response_timeout_s=WRITER_RESPONSE_TIMEOUT_S)
        futures = []
        try:
            for batch_id, start in enumerate(range(0, len(items), batch)):
                futures.append(await stream.send(batch_id, items[start:start + batch]))
            for future in futures:
                result = await stream.result(future)
                if not result.ok:
                    raise RuntimeError(f"bookie {bookie_id} refused adds of batch {result.batch_id}: statuses "
                                       f"{sorted(set(result.statuses))} {result.message}")
        finally:
            await stream.close()


async def _recover(cluster: LedgerCluster, client: BrokerClient, ledger_id: int, entries: int, entry_bytes: int,
                   idle: float | None) -> Recovered:
    """Recover `ledger_id` through the broker (timed), check the result, read a sample back."""
    meter = CpuMeter(cluster)
    watch = JournalWatch(cluster.journal_dirs)
    meter.start()
    watch.start()
    started = time.perf_counter()
    info, lac = await client.open_ledger(ledger_id, password=PASSWORD, recover=True)
    ended = time.perf_counter()
    seconds = ended - started
    await watch.stop()
    cpu = meter.stop(seconds)
    span, recovered_lac, written_back = broker_log_span(cluster.broker.log_path, ledger_id)
    split = watch.split(started, ended, entry_bytes + HEADER_BYTES, written_back)
    last = entries - 1
    if info.state != "CLOSED" or info.last_entry_id != last or lac != last:
        raise RuntimeError(f"ledger {ledger_id}: recovery gave state {info.state}, last_entry_id "
                           f"{info.last_entry_id}, LAC {lac}; expected CLOSED at {last}")
    if info.length != entries * entry_bytes:
        raise RuntimeError(f"ledger {ledger_id}: closed with length {info.length}, expected {entries * entry_bytes}")
    await _check_sample(client, ledger_id, entries, entry_bytes)
    return Recovered(ledger_id, seconds, info.last_entry_id, span, recovered_lac, written_back, cpu,
                     idle if idle is not None else -1.0, split)


def sample_ids(entries: int, seed: int) -> list[int]:
    """Entry ids to read back: runs at the start, middle and end, and SAMPLE_SPREAD spread between."""
    mid = entries // 2
    ids = set(range(min(SAMPLE_RUN, entries)))
    ids |= set(range(max(0, mid - SAMPLE_RUN // 2), min(entries, mid + SAMPLE_RUN - SAMPLE_RUN // 2)))
    ids |= set(range(max(0, entries - SAMPLE_RUN), entries))
    ids |= set(random.Random(seed).sample(range(entries), min(SAMPLE_SPREAD, entries)))
    return sorted(ids)


async def _check_sample(client: BrokerClient, ledger_id: int, entries: int, entry_bytes: int) -> None:
    for entry_id in sample_ids(entries, ledger_id):
        got = [e async for e in client.read_entries(ledger_id, entry_id, entry_id, password=PASSWORD)]
        if got != [(entry_id, payload(ledger_id, entry_id, entry_bytes))]:
            shown = [(e, p[:24]) for e, p in got]
            raise RuntimeError(f"ledger {ledger_id}: entry {entry_id} reads back as {shown}, not as written")


def broker_log_span(log_path: str, ledger_id: int) -> tuple[float, int, int]:
    """(seconds from "recovery started" to "recovered and CLOSED", recovered LAC, entries written back) of
    `ledger_id` from the broker's log; (-1.0, -2, -1) for what is not there."""
    started = closed = None
    recovered_lac, written_back = -2, -1
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = LOG_STAMP.match(line)
                if not m or int(m.group(2)) != ledger_id:
                    continue
                stamp = datetime.fromisoformat(m.group(1))
                if m.group(3) == "recovery started":
                    started = stamp
                else:
                    closed = stamp
                    recovered_lac, written_back = int(m.group(5)), int(m.group(6))
    except OSError:
        pass
    span = (closed - started).total_seconds() if started and closed else -1.0
    return span, recovered_lac, written_back


def targets(results: list[Result]) -> list[dict]:
    """The recovery target judged on these results (met None: the window is not the target's)."""
    out = []
    for r in results:
        if r.name != "recovery":
            continue
        window = r.extra.get("window_entries", -1)
        value = f"{r.extra['recovery_s']:.3f} s for a {window:,}-entry window"
        shape = (r.extra["ensemble"], r.extra["write_quorum"], r.extra["ack_quorum"])
        applies = window == TARGET_ENTRIES and shape == (3, 3, 2)
        out.append({"target": f"recovery of a {TARGET_ENTRIES:,}-entry window (E=3 Qw=3 Qa=2) <= {TARGET_S:g} s",
                    "value": value + ("" if applies else " (not the target's window/shape)"),
                    "met": (r.extra["recovery_s"] <= TARGET_S) if applies else None})
    return out
