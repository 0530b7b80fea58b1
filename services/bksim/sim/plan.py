"""The plan of one bookie simulation: every knob, all drawn from the seed.

Owns the choice of sizes (tiny, so journals and entry logs roll and checkpoints happen often), the
workload mix and the fault plan (crash probability, torn tails, latencies, bit flips). `describe()` lists
every knob, so a run can print what it did and a failure can be understood from its output alone.

Invariant: `BookiePlan.from_seed(seed, steps)` is a pure function of its arguments.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from bksim.model.config import KiB, MiB, BookieConfig
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults

STEPS_DEFAULT = 200  # workload steps per seed: enough for several checkpoints, rolls and crashes
START_CRASHES_MAX = 3  # consecutive crashes during start-up (journal replay) before one is let finish
LARGE_DISK_BYTES = 1 << 30
SMALL_DISK_BYTES = 96 * KiB  # fills up within a run: the bookie goes read-only
# workload mix: relative weights of the operations a step may submit
OP_WEIGHTS = (("add", 40), ("recovery_add", 6), ("fence", 3), ("write_lac", 5), ("read", 18),
              ("read_lac", 8), ("checkpoint", 3))


def rng_for(seed: int, part: str) -> random.Random:
    """An independent random stream per part of the world, so a change in one part (say, the workload)
    does not shift the faults drawn by another."""
    return random.Random(f"bksim-sim:{seed}:{part}")


@dataclass(frozen=True, slots=True)
class BookiePlan:
    seed: int
    steps: int
    # workload
    ledgers: int
    batch_entries_max: int
    payload_bytes_max: int
    step_gap_ms_max: float  # virtual time between two submissions, drawn in [0, max]
    inflight_ops_max: int  # client operations waiting for an answer at once
    # faults
    crash_probability: float  # per step
    start_crash_probability: float  # a restart is crashed again during its start-up (replay)
    bit_flip_probability: float  # per step: one bit of a checkpointed entry's entry-log record
    disk: DiskFaults
    kv: KvFaults
    # engine sizes (BookieConfig overrides)
    write_cache_bytes_max: int
    write_cache_throttle_ms_max: int
    journal_file_bytes_max: int
    entry_log_bytes_max: int
    flush_interval_ms: int
    group_wait_ms_max: float
    journal_flush_when_idle: bool
    journal_sync_on_loop: bool
    journal_backups_max: int
    journal_archive: bool
    journal_queue_records_max: int
    recovery_add_reserve_bytes: int

    @classmethod
    def from_seed(cls, seed: int, steps: int = STEPS_DEFAULT) -> "BookiePlan":
        r = rng_for(seed, "plan")
        latency = r.choice([(0.0, 0.0), (0.0, 0.5), (0.1, 3.0)])
        kv_latency = r.choice([(0.0, 0.0), (0.0, 1.0)])
        return cls(
            seed=seed, steps=steps,
            ledgers=r.randint(1, 4),
            batch_entries_max=r.choice([1, 3, 8]),
            payload_bytes_max=r.choice([16, 200, 1500]),
            step_gap_ms_max=r.choice([0.2, 2.0, 10.0]),
            inflight_ops_max=r.choice([1, 4, 16]),
            crash_probability=r.choice([0.0, 0.01, 0.03, 0.06]),
            start_crash_probability=r.choice([0.0, 0.3]),
            bit_flip_probability=r.choice([0.0, 0.0, 0.02]),
            disk=DiskFaults(latency_ms_min=latency[0], latency_ms_max=latency[1],
                            torn_tail_probability=r.choice([0.0, 0.5, 1.0]), torn_zeros_probability=0.3,
                            capacity_bytes=SMALL_DISK_BYTES if r.random() < 0.1 else LARGE_DISK_BYTES),
            kv=KvFaults(latency_ms_min=kv_latency[0], latency_ms_max=kv_latency[1], unsynced_keep_probability=0.5),
            write_cache_bytes_max=r.choice([8 * KiB, 32 * KiB, 256 * KiB]),
            write_cache_throttle_ms_max=r.choice([20, 200]),
            journal_file_bytes_max=r.choice([2 * KiB, 8 * KiB, MiB]),
            entry_log_bytes_max=r.choice([2 * KiB, 16 * KiB, MiB]),
            flush_interval_ms=r.choice([5, 30, 200]),
            group_wait_ms_max=r.choice([0.0, 0.5, 2.0]),
            journal_flush_when_idle=r.random() < 0.3,
            journal_sync_on_loop=r.random() < 0.5,
            journal_backups_max=r.choice([0, 1, 3]),
            journal_archive=r.random() < 0.25,
            journal_queue_records_max=r.choice([8, 10_000]),
            recovery_add_reserve_bytes=4 * KiB,
        )

    def bookie_config(self, journal_archive_dir: str) -> BookieConfig:
        return dataclasses.replace(
            BookieConfig(), write_cache_bytes_max=self.write_cache_bytes_max,
            write_cache_throttle_ms_max=self.write_cache_throttle_ms_max,
            read_cache_bytes_max=self.write_cache_bytes_max,
            journal_file_bytes_max=self.journal_file_bytes_max, entry_log_bytes_max=self.entry_log_bytes_max,
            flush_interval_ms=self.flush_interval_ms, group_wait_ms_max=self.group_wait_ms_max,
            journal_flush_when_idle=self.journal_flush_when_idle, journal_sync_on_loop=self.journal_sync_on_loop,
            journal_backups_max=self.journal_backups_max,
            journal_archive_dir=journal_archive_dir if self.journal_archive else "",
            journal_queue_records_max=self.journal_queue_records_max,
            recovery_add_reserve_bytes=self.recovery_add_reserve_bytes)

    def describe(self) -> list[str]:
        """Every knob as `name = value`, in declaration order (the disk and kv faults flattened)."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                for sub in dataclasses.fields(value):
                    lines.append(f"{f.name}.{sub.name} = {getattr(value, sub.name)}")
            else:
                lines.append(f"{f.name} = {value}")
        return lines
