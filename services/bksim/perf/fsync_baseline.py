"""fsync baseline: the raw limit of append + fdatasync on this disk, from plain Python.

Loop: append `group` records of `record_bytes` to a new file as one os.write (what a journal's group commit
does), then one os.fdatasync. Every record of the group is acknowledged by that sync, so each record's
latency is the time from its group's start to the end of the sync. Nothing else runs: no event loop, no
threads, no framing, no CRC. This is the denominator of `perf journal-append`'s ratio.

The file is created under `directory` (O_APPEND, new file per run) and removed afterwards.
"""
from __future__ import annotations

import os
import time

from bksim.perf.stats import LatencyRecorder, Result, make_result

SWEEP_RECORD_BYTES = (1024, 65536)
SWEEP_GROUPS = (1, 16, 256)


def run(directory: str, record_bytes: int, group: int, seconds: float, records_max: int = 0,
        cpu_idle_before: float = 1.0) -> Result:
    """Append+fdatasync for `seconds` (and/or until `records_max` records, when > 0); return the figures."""
    if record_bytes <= 0 or group <= 0:
        raise ValueError(f"record_bytes and group must be > 0, got {record_bytes} and {group}")
    if seconds <= 0 and records_max <= 0:
        raise ValueError("need a bound: seconds > 0 or records_max > 0")
    record = os.urandom(record_bytes)
    full_group = record * group
    path = os.path.join(directory, f"fsync-baseline-{record_bytes}x{group}-{os.getpid()}.dat")
    latencies = LatencyRecorder()
    syncs = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        deadline = start + seconds if seconds > 0 else float("inf")
        now = start
        while now < deadline and (records_max <= 0 or latencies.records < records_max):
            n = group if records_max <= 0 else min(group, records_max - latencies.records)
            data = full_group if n == group else record * n
            group_start = now
            written = os.write(fd, data)
            assert written == len(data), f"short write: {written} of {len(data)} bytes"
            os.fdatasync(fd)
            now = time.perf_counter()
            latencies.add(now - group_start, n)
            syncs += 1
        elapsed_s = now - start
    finally:
        os.close(fd)
        os.unlink(path)
    return make_result("fsync-baseline", record_bytes, group, elapsed_s, latencies, cpu_idle_before,
                       {"syncs": syncs, "syncs_per_s": syncs / elapsed_s if elapsed_s > 0 else 0.0})
