"""EntryLogger.append_sorted on real files: where each entry lands, what the returned index pairs say, where
the synced 1 MiB steps end and where the log rolls, against a plain entry-by-entry statement of its rules:
- an entry starts a new log when it would end past `bytes_max` and its log already holds an entry;
- a step is written and synced right after the first entry whose end reaches the step's end, and the next step
  ends 1 MiB after it (a new log starts a new step);
- the index pair of an entry names its log, its record's offset and its length."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.adapters.localdisk import LocalDisk, LocalFile
from bksim.bookie import entry_log
from bksim.bookie.entry_log import EntryLogger
from bksim.formats import entry_log as fmt
from bksim.formats.index import decode_location, decode_location_key

from .conftest import entry

MiB = 1024 * 1024


def expected_layout(runs, bytes_max: int, first_log: int, start: int):
    """(log id, offset) of every entry and the (log id, end) of every synced step, entry by entry."""
    log, position, step_end = first_log, start, start + entry_log._STEP_BYTES
    where, steps = [], []
    for _ledger_id, entries in runs:
        for _entry_id, blob in entries:
            if position + 4 + len(blob) > bytes_max and position > fmt.HEADER_BYTES:
                log += 1
                position = fmt.HEADER_BYTES
                step_end = position + entry_log._STEP_BYTES
            where.append((log, position))
            position += 4 + len(blob)
            if position >= step_end:
                steps.append((log, position))
                step_end = position + entry_log._STEP_BYTES
    return where, steps


def random_runs(rng: random.Random, ledgers: int):
    runs = []
    for ledger_id in sorted(rng.sample(range(1, 1000), ledgers)):
        first = rng.randrange(0, 50)
        ids = sorted(rng.sample(range(first, first + 400), rng.randrange(1, 120)))
        runs.append((ledger_id, [(i, entry(ledger_id, i, rng.randbytes(rng.choice((10, 100, 3000, 40_000)))))
                                 for i in ids]))
    return runs


def exact_runs(_rng: random.Random, _ledgers: int):
    """Records of 128 KiB: step ends and the log's end fall exactly on record ends."""
    size = MiB // 8 - 4
    return [(3, [(i, entry(3, i, b"x" * (size - len(entry(3, i, b"x")) + 1))) for i in range(20)]),
            (4, [(i, entry(4, i, b"y" * (size - len(entry(4, i, b"y")) + 1))) for i in range(30)])]


@pytest.mark.parametrize("seed, make_runs, bytes_max", [(seed, random_runs, None) for seed in range(8)]
                         + [(0, exact_runs, 1 << 30), (0, exact_runs, fmt.HEADER_BYTES + 3 * MiB)])
def test_entries_steps_and_rolls_land_where_the_entry_by_entry_rules_put_them(tmp_path, monkeypatch, seed, make_runs,
                                                                             bytes_max):
    rng = random.Random(seed)
    bytes_max = bytes_max or rng.choice((2 * MiB, 3 * MiB, 1 << 30))
    synced: list[tuple[str, int]] = []
    write_chunks_synced = LocalFile.write_chunks_synced

    async def spy(self, chunks):
        await write_chunks_synced(self, chunks)
        synced.append((self.path, self.size))

    monkeypatch.setattr(LocalFile, "write_chunks_synced", spy)

    async def main():
        logger = EntryLogger(LocalDisk(), str(tmp_path), bytes_max)
        await logger.open()
        runs = make_runs(rng, rng.randrange(1, 6))
        first_log, start = logger.current_log_id, logger._file.size
        pairs = await logger.append_sorted(runs)
        await logger.flush()
        where, steps = expected_layout(runs, bytes_max, first_log, start)
        flat = [(ledger_id, entry_id, blob) for ledger_id, entries in runs for entry_id, blob in entries]
        assert len(pairs) == len(flat)
        for (key, value), (ledger_id, entry_id, blob), (log_id, offset) in zip(pairs, flat, where):
            location = decode_location(value)
            assert decode_location_key(key) == (ledger_id, entry_id)
            assert (location.log_id, location.offset, location.length) == (log_id, offset, len(blob))
            assert logger.read(location, ledger_id, entry_id) == blob
        log_of = {logger.path(log_id): log_id for log_id in range(first_log, where[-1][0] + 1)}
        assert [(log_of[path], end) for path, end in synced] == steps
        logger.close()
    asyncio.run(main())
