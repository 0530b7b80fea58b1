"""Compaction's copy in runs (bookie/compaction.py): the header walk stops exactly where EntryLogger.records() stops
and says the same about the log's end; runs copy every live record, byte for byte, and only those; the last check
of step 3 keeps the old log while the index still names it."""
from __future__ import annotations

import asyncio
import os

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.bookie import compaction
from bksim.bookie.gc import GarbageCollector
from bksim.formats import entry_log as log_fmt
from bksim.model.status import StatusCode as S

from .test_gc import Source, readable, write

LOG_BYTES = 16 * 1024


async def interleaved(e, ledgers, rounds: int) -> dict[int, dict[int, bytes]]:
    """Each round adds a few entries to every ledger and checkpoints: each log is a sequence of per-ledger runs."""
    written: dict[int, dict[int, bytes]] = {lid: {} for lid in ledgers}
    for r in range(rounds):
        for lid in ledgers:
            written[lid].update(await write(e, lid, range(r * 5, r * 5 + 5), size=300))
        await e.checkpoint()
    return written


def test_the_walk_stops_where_records_stops_on_a_sealed_a_torn_and_a_damaged_log(engines):
    async def scenario():
        e = await engines.started(entry_log_bytes_max=LOG_BYTES, compaction_rate_bytes_per_s=0)
        await interleaved(e, [1, 2, 3], 12)
        await e.refresh_log_meta()
        sealed = [s["log_id"] for s in e.entry_log_stats() if not s["current"]]
        assert sealed, "the writes should have rolled a log"
        path = e._entry_logger.path(sealed[0])
        raw = open(path, "rb").read()
        cases = {"sealed": raw}
        records = [off for off, *_ in e._entry_logger.records(path, None)]
        header = log_fmt.decode_header(raw[:log_fmt.HEADER_BYTES])
        unmapped = raw[:header.ledger_map_offset]  # records only, no map: ends exactly after a record
        cases["unmapped"] = unmapped
        cases["torn"] = unmapped[:-7]
        damaged = bytearray(unmapped)
        damaged[records[len(records) // 2]:records[len(records) // 2] + 4] = b"\xff\xff\xff\xff"
        cases["damaged"] = bytes(damaged)
        cases["short-length"] = unmapped + b"\x00\x00"
        await e.close()
        for name, data in cases.items():
            case_path = os.path.join(engines.ledger_dir, f"case-{name}")
            with open(case_path, "wb") as f:
                f.write(data)
            expected_outcome: dict = {}
            expected = [(off, lid, eid, length) for off, lid, eid, length, _ in
                        e._entry_logger.records(case_path, None, expected_outcome)]
            outcome: dict = {}
            walked = await compaction.live_records(LocalDisk(), case_path, {1, 2, 3}, outcome)
            assert walked == expected, name
            assert outcome["clean"] == expected_outcome["clean"], name
            assert outcome["clean"] == (name in ("sealed", "unmapped")), name
            only_two = await compaction.live_records(LocalDisk(), case_path, {2}, {})
            assert only_two == [r for r in expected if r[1] == 2], name

    asyncio.run(scenario())


def test_runs_copy_exactly_the_live_records_byte_for_byte(engines):
    async def scenario():
        e = await engines.started(entry_log_bytes_max=LOG_BYTES, compaction_rate_bytes_per_s=0)
        written = await interleaved(e, [1, 2, 3, 4], 10)
        gc = GarbageCollector(e, Source({1, 3}), e.config, SystemClock())
        assert sorted((await gc.run("gc")).ledgers_deleted) == [2, 4]
        stats = {s["log_id"]: s for s in e.entry_log_stats() if not s["current"]}
        runs: list[int] = []

        async def throttle(nbytes):
            runs.append(nbytes)

        for log_id, s in stats.items():
            if s["live_bytes"]:
                report = await e.compact_log(log_id, throttle)
                assert not report["kept_old"]
                assert report["bytes_copied"] == s["live_bytes"] == sum(
                    4 + len(written[lid][eid]) for lid in (1, 3) for eid in written[lid]
                    if e._locations.get(lid, eid).log_id == report["new_log_id"])
        assert runs and sum(runs) == sum(s["live_bytes"] for s in stats.values())
        assert len(runs) < sum(len(written[lid]) for lid in (1, 3))  # records went in runs, not one by one
        for lid in (1, 3):
            await readable(e, lid, written[lid])
        for lid in (2, 4):
            assert (await e.read_entry(lid, 0))[0] == S.NO_LEDGER
        await e.close()

    asyncio.run(scenario())


def test_the_old_log_stays_while_the_index_still_names_it(engines, monkeypatch):
    """BROKEN on purpose: step 3's batch moves nothing. The last check must see the index still naming the old log
    and keep it (deleting it would lose every live entry of it)."""
    async def nothing_moves(locations, copied):
        return []

    async def scenario():
        e = await engines.started(entry_log_bytes_max=LOG_BYTES, compaction_rate_bytes_per_s=0)
        written = await interleaved(e, [1, 2], 10)
        gc = GarbageCollector(e, Source({1}), e.config, SystemClock())
        assert (await gc.run("gc")).ledgers_deleted == [2]
        sealed = [s["log_id"] for s in e.entry_log_stats() if not s["current"] and s["live_bytes"]]
        monkeypatch.setattr(compaction, "index_moves", nothing_moves)
        report = await e.compact_log(sealed[0])
        assert report["kept_old"] and report["entries"] > 0
        assert os.path.exists(e._entry_logger.path(sealed[0]))
        await readable(e, 1, written[1])
        await e.close()

    asyncio.run(scenario())
