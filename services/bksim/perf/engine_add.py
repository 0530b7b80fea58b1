"""engine-add: the bookie's storage engine alone, in this process: bookie-add without gRPC.

A BookieEngine on real files (journal with fsync, write cache, entry logs, RocksDB index, checkpoints: the
bookie's configuration) takes the entries bookie-add sends, one ledger, `batch` entries per add, `inflight`
adds in flight, through `start_adds_compact` as the bookie's gRPC service calls it for a compact AddRequest.
This process is settled as a bookie's is (allocator, collector). Its CPU per entry (every thread: the
journal's and the checkpoint's too) is what a bookie spends on an entry besides receiving and answering it.

`bksim perf bookie-add --breakdown` runs it after grpc-baseline and bookie-add and splits the bookie's CPU per
entry into the engine's and the rest (gRPC, the service); with grpc-baseline's echo server as the cheapest a
gRPC server can receive and answer an entry, it bounds bookie-add: a bookie held to one core by the GIL takes
at most 1 / (engine + echo server) entries a second.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import time
import uuid

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import index_opener
from bksim.adapters.serving_process import settle_process
from bksim.bookie.engine import BookieEngine
from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.model.config import BookieConfig
from bksim.model.status import StatusCode
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

LEDGER_ID = 7
MASTER_KEY = b"engine-add".ljust(32, b"\0")
ENCODE_SAMPLE = 20_000  # entries encoded once, untimed by the run, to take the encoding's CPU out of its figure


def measure(workdir: str, record_bytes: int, batch: int, inflight: int, seconds: float, records_max: int,
            config: BookieConfig, cpu_idle_before: float) -> Result:
    """Drive a BookieEngine in this process for `seconds` (and/or `records_max` entries); return the figures."""
    if record_bytes < HEADER_BYTES:
        raise ValueError(f"record_bytes must be >= {HEADER_BYTES} (an entry's header), got {record_bytes}")
    if min(batch, inflight) <= 0:
        raise ValueError(f"batch and inflight must be > 0, got {batch}, {inflight}")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    settle_process()
    root = tempfile.mkdtemp(prefix="engine-add-", dir=workdir)
    try:
        return run_interruptible(_measure(root, record_bytes, batch, inflight, seconds, records_max, config,
                                          cpu_idle_before))
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _measure(root: str, record_bytes: int, batch: int, inflight: int, seconds: float, records_max: int,
                   config: BookieConfig, cpu_idle_before: float) -> Result:
    journal_dir, ledger_dir = os.path.join(root, "journal"), os.path.join(root, "ledgers")
    os.makedirs(journal_dir)
    os.makedirs(ledger_dir)
    config = dataclasses.replace(config, journal_dir=journal_dir, ledger_dir=ledger_dir)
    errors: list[str] = []
    engine = BookieEngine(config, disk=LocalDisk(), clock=SystemClock(),
                          open_kv=index_opener(config.index_write_buffer_bytes), instance_id=str(uuid.uuid4()),
                          journal_dir=journal_dir, ledger_dir=ledger_dir, log=errors.append)
    await engine.start()
    try:
        payload = os.urandom(record_bytes - HEADER_BYTES)
        encode_s = _encode_cost_s(payload)
        run = await _drive(engine, payload, batch, inflight, seconds, records_max)
        stats = engine.statistics()
    finally:
        await engine.close()
    failed = [line for line in errors if "failed" in line.lower()]
    if failed:
        raise RuntimeError(f"engine-add: the engine logged failures: {failed[:3]}")
    entries = run.latencies.records
    engine_cpu_s = max(0.0, run.cpu_s - entries * encode_s)
    return make_result("engine-add", record_bytes, batch, run.elapsed_s, run.latencies, cpu_idle_before, {
        "inflight_batches": inflight, "engine_cpu_us_per_entry": engine_cpu_s / entries * 1e6,
        "engine_cpu_cores": engine_cpu_s / run.elapsed_s if run.elapsed_s > 0 else 0.0,
        "entry_encode_us": encode_s * 1e6, "checkpoints": stats["checkpoints"],
        "journal_syncs": stats["journal"]["groups"],
    })


def _encode_cost_s(payload: bytes) -> float:
    """CPU seconds to encode one entry as the run does (the broker's work, not the engine's)."""
    started = time.process_time()
    for entry_id in range(ENCODE_SAMPLE):
        encode_entry(LEDGER_ID, entry_id, entry_id - 1, entry_id, payload)
    return (time.process_time() - started) / ENCODE_SAMPLE


@dataclasses.dataclass(frozen=True, slots=True)
class _Run:
    latencies: LatencyRecorder
    elapsed_s: float
    cpu_s: float  # this process's CPU (every thread) over the run, the entries' encoding included


async def _drive(engine: BookieEngine, payload: bytes, batch: int, inflight: int, seconds: float,
                 records_max: int) -> _Run:
    latencies = LatencyRecorder()
    state = {"next": 0, "last_ack": 0.0}
    start = time.perf_counter()
    deadline = start + seconds if seconds > 0 else float("inf")
    ledger_length = len(payload)

    async def adder() -> None:
        while time.perf_counter() < deadline:
            first = state["next"]
            n = batch if records_max <= 0 else min(batch, records_max - first)
            if n <= 0:
                return
            state["next"] = first + n
            entries = [encode_entry(LEDGER_ID, e, e - 1, (e + 1) * ledger_length, payload)
                       for e in range(first, first + n)]
            submitted = time.perf_counter()
            statuses, message = await engine.start_adds_compact(entries, MASTER_KEY, 0).result()
            if any(s is not StatusCode.OK for s in statuses):
                raise RuntimeError(f"engine-add: entries {first}..{first + n - 1} not added: {message}")
            acked = time.perf_counter()
            latencies.add(acked - submitted, n)
            state["last_ack"] = max(state["last_ack"], acked)

    cpu_start = time.process_time()
    async with asyncio.TaskGroup() as tasks:
        for _ in range(inflight):
            tasks.create_task(adder())
    return _Run(latencies, state["last_ack"] - start, time.process_time() - cpu_start)


def ceiling(baseline: Result, bookie: Result, engine: Result) -> dict:
    """The target-style line of `--breakdown`: the bookie's CPU per entry split into the engine's and the rest, and
    the most a bookie on one core could add when it pays the engine's and the echo server's CPU per entry."""
    engine_us = engine.extra["engine_cpu_us_per_entry"]
    echo_us = baseline.extra["server_cpu_cores"] / baseline.records_per_s * 1e6
    bookie_us = bookie.extra["server_cpu_cores"] / bookie.records_per_s * 1e6
    most = 1e6 / (engine_us + echo_us)
    return {"target": "bookie-add breakdown: a bookie's CPU per entry, and the most one core could add",
            "value": f"bookie {bookie_us:.1f} us = engine {engine_us:.1f} us (engine-add) + {bookie_us - engine_us:.1f} "
                     f"us gRPC and service (grpc-baseline's echo server: {echo_us:.1f} us); at one core and engine + "
                     f"echo server per entry at most {most:,.0f} entries/s = {most / baseline.records_per_s:.2f}x "
                     f"grpc-baseline", "met": None}
