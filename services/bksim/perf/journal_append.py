"""journal-append: the bookie's Journal class (bookie/journal.py) in-process, fsync on, no network.

Closed loop: `depth * group / per_append` producer tasks each frame `per_append` ENTRY records as the engine
does for an add (a 10-byte prefix chunk with the CRC32C, then the entry bytes), call
`Journal.append_many(chunks, nrecords)`, await the future (resolved after the fsync that covers the records)
and go again. A record's latency is from its framing (just before append_many) to that future.

Group size: so that one fsync covers `group` records, as in fsync-baseline, the journal's byte threshold
(`group_bytes_max`) is set to exactly `group` framed records: the group is written as soon as every
producer has re-submitted. With `depth` > 1, `depth` groups are outstanding: the next group is already
queued while one syncs (what a loaded bookie sees). `--flush-when-idle` instead lets the journal's idle
flush form the groups (the measured mean group size is reported either way). Every other journal option
is the bookie default. The journal files go to a fresh directory that is removed afterwards.

Compared, in the same run, with fsync-baseline at the same record size and group (target >= 0.5x).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.bookie.journal import Journal
from bksim.formats import journal as journal_format
from bksim.formats.crc import crc32c
from bksim.model.config import BookieConfig
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

TARGET_RATIO = 0.5


def run(directory: str, record_bytes: int, group: int, seconds: float, records_max: int = 0,
        per_append: int = 1, flush_when_idle: bool = False, depth: int = 1, cpu_idle_before: float = 1.0) -> Result:
    """Drive a real Journal for `seconds` (and/or `records_max` records, when > 0); return the figures."""
    if min(record_bytes, group, per_append, depth) <= 0:
        raise ValueError(f"record_bytes, group, per_append and depth must be > 0, "
                         f"got {record_bytes}, {group}, {per_append}, {depth}")
    if group % per_append:
        raise ValueError(f"group ({group}) must be a multiple of per_append ({per_append})")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    return run_interruptible(_run(directory, record_bytes, group, seconds, records_max, per_append,
                                  flush_when_idle, depth, cpu_idle_before))


async def _run(directory: str, record_bytes: int, group: int, seconds: float, records_max: int, per_append: int,
               flush_when_idle: bool, depth: int, cpu_idle_before: float) -> Result:
    defaults = BookieConfig()
    framed_bytes = record_bytes + journal_format.RECORD_PREFIX_BYTES
    journal_dir = tempfile.mkdtemp(prefix="journal-", dir=directory)  # fresh per run, removed at the end
    journal = Journal(LocalDisk(), SystemClock(), journal_dir, str(uuid.uuid4()),
                      group_wait_ms_max=defaults.group_wait_ms_max,
                      group_bytes_max=defaults.group_bytes_max if flush_when_idle else group * framed_bytes,
                      flush_when_idle=flush_when_idle, file_bytes_max=defaults.journal_file_bytes_max,
                      queue_records_max=defaults.journal_queue_records_max,
                      sync_on_loop=defaults.journal_sync_on_loop, log=lambda line: None,
                      remove_from_page_cache=defaults.journal_remove_from_page_cache)
    try:
        return await _drive(journal, record_bytes, group, seconds, records_max, per_append, flush_when_idle, depth,
                            cpu_idle_before, framed_bytes)
    finally:
        shutil.rmtree(journal_dir, ignore_errors=True)


async def _drive(journal: Journal, record_bytes: int, group: int, seconds: float, records_max: int,
                 per_append: int, flush_when_idle: bool, depth: int, cpu_idle_before: float,
                 framed_bytes: int) -> Result:
    producers = depth * group // per_append
    await journal.open(0)
    journal.start()
    body = os.urandom(record_bytes)
    prefix_pack = journal_format.RECORD_PREFIX.pack
    entry_type = journal_format.RecordType.ENTRY
    frame_length = record_bytes + journal_format.LENGTH_MIN
    crc_seed = crc32c(bytes((entry_type, 0)))
    append = journal.append_many
    latencies = LatencyRecorder()
    state = {"submitted": 0, "last_ack": 0.0}
    start = time.perf_counter()
    deadline = start + seconds if seconds > 0 else float("inf")

    async def producer() -> None:
        while time.perf_counter() < deadline:
            n = per_append
            if records_max > 0:
                n = min(n, records_max - state["submitted"])
                if n <= 0:
                    return
            state["submitted"] += n
            submitted_at = time.perf_counter()
            chunks = []
            for _ in range(n):  # as the engine frames an add: a 10-byte prefix chunk, then the entry itself
                chunks.append(prefix_pack(frame_length, crc32c(body, crc_seed), entry_type, 0))
                chunks.append(body)
            await append(chunks, n)
            acked_at = time.perf_counter()
            latencies.add(acked_at - submitted_at, n)
            state["last_ack"] = max(state["last_ack"], acked_at)

    try:
        async with asyncio.TaskGroup() as tasks:
            for _ in range(producers):
                tasks.create_task(producer())
    finally:
        await journal.stop()
    stats = journal.statistics()
    elapsed_s = state["last_ack"] - start
    groups = stats.get("groups", 0)
    return make_result("journal-append", record_bytes, group, elapsed_s, latencies, cpu_idle_before, {
        "producers": producers, "per_append": per_append, "depth_groups": depth,
        "group_formed_by": "idle flush" if flush_when_idle else f"group_bytes_max={group * framed_bytes}",
        "syncs": groups, "mean_group_records": stats["records"] / groups if groups else 0.0,
        "syncs_per_s": groups / elapsed_s if elapsed_s > 0 else 0.0, "journal_rolls": stats.get("rolls", 0),
    })

