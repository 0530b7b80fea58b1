"""`bksim entrylog dump` prints each log's live ratio from the bookie's own index (cli/dump_cmd.py "Live ratio"):
the same numbers as the engine's entry_log_stats, read beside a running engine (RocksDB opened read-only), with
where each number comes from; a log without a readable index beside it says why its ratio is unknown."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import uuid

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.bookie.gc import GarbageCollector
from bksim.cli.main import main
from bksim.formats import entry_log as log_fmt
from bksim.formats.entry import encode_entry
from bksim.model.config import BookieConfig
from bksim.model.status import StatusCode

KEY = b"k" * 32


class Source:
    def __init__(self, ids) -> None:
        self.ids = set(ids)

    async def ledger_ids(self):
        return set(self.ids)

    async def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self.ids


def dump_json(capsys, path: str) -> tuple[int, list[dict]]:
    code = main(["entrylog", "dump", "--json", path])
    out, err = capsys.readouterr()
    assert err == ""
    return code, [json.loads(line) for line in out.splitlines()]


def test_live_ratios_match_the_engine_and_are_read_beside_a_running_bookie(tmp_path, capsys):
    ledger_dir = str(tmp_path / "ledgers")
    copied = str(tmp_path / "copied.log")

    async def scenario():
        config = dataclasses.replace(BookieConfig(), entry_log_bytes_max=4096, compaction_rate_bytes_per_s=0)
        engine = BookieEngine(config, disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                              instance_id=str(uuid.uuid4()), journal_dir=str(tmp_path / "journal"),
                              ledger_dir=ledger_dir, log=lambda line: None)
        await engine.start()
        try:
            for ledger_id in (1, 2):
                entries = [(encode_entry(ledger_id, i, i - 1, 0, bytes([i]) * 500), KEY, 0) for i in range(20)]
                statuses, message = await engine.add_entries(entries)
                assert statuses == [StatusCode.OK] * 20, message
                await engine.checkpoint()
            report = await GarbageCollector(engine, Source({2}), config, SystemClock(), log=lambda line: None).run()
            assert report.ledgers_deleted == [1] and report.error is None
            stats = {s["log_id"]: s for s in engine.entry_log_stats()}
            code, objects = dump_json(capsys, ledger_dir)  # the engine holds its RocksDB stores open
            logs = os.path.join(ledger_dir, "entrylogs")
            shutil.copy(os.path.join(logs, sorted(os.listdir(logs))[0]), copied)
            return stats, code, objects
        finally:
            await engine.close()

    stats, code, objects = asyncio.run(scenario())
    assert code == 0
    live = {o["log_id"]: o for o in objects if o["kind"] == "live"}
    assert set(live) == set(stats)
    sealed = [log_id for log_id, s in stats.items() if not s["current"]]
    assert sealed
    for log_id in sealed:
        got, want = live[log_id], stats[log_id]
        assert (got["bytes"], got["live_bytes"], got["ledgers"], got["live_ledgers"]) == (
            want["bytes"], want["live_bytes"], want["ledgers"], want["live_ledgers"]), (got, want)
        assert got["source"] == "entry-log metadata" and got["index"] == os.path.join(ledger_dir, "index")
        assert abs(got["live_ratio"] - want["live_ratio"]) < 1e-9
    assert any(0 < live[i]["live_ratio"] < 1 for i in sealed)  # the log ledgers 1 and 2 shared
    [current] = [log_id for log_id, s in stats.items() if s["current"]]
    assert live[current]["source"] == "records" and live[current]["live_bytes"] == stats[current]["live_bytes"]

    main(["entrylog", "dump", ledger_dir])  # text: the numbers and where they come from
    text = capsys.readouterr().out
    partial = next(i for i in sealed if 0 < live[i]["live_ratio"] < 1)
    assert (f"  live: {live[partial]['live_bytes']} of {live[partial]['bytes']} bytes "
            f"({100.0 * live[partial]['live_ratio']:.1f}%), 1 of 2 ledgers in the bookie's ledger index "
            f"({ledger_dir}/index/ledgers); bytes per ledger from the bookie's entry-log metadata "
            f"({ledger_dir}/index/entrylogs)") in text

    code, objects = dump_json(capsys, copied)  # a log outside a ledger directory
    assert code == 0
    [unknown] = [o for o in objects if o["kind"] == "live"]
    assert unknown["live_ratio"] is None and "no bookie ledger index at" in unknown["message"]
    main(["entrylog", "dump", copied])
    assert "  live: unknown (no bookie ledger index at " in capsys.readouterr().out


def test_an_unreadable_index_makes_the_live_ratio_unknown_and_says_why(tmp_path, capsys):
    ledger_dir = tmp_path / "ledgers"
    (ledger_dir / "entrylogs").mkdir(parents=True)
    (ledger_dir / "index" / "ledgers").mkdir(parents=True)  # no RocksDB inside
    with open(ledger_dir / "entrylogs" / "1.log", "wb") as f:
        f.write(log_fmt.encode_header() + log_fmt.encode_record(encode_entry(5, 0, -1, 0, b"x")))
    code, objects = dump_json(capsys, str(ledger_dir))
    assert code == 0  # the live ratio never changes the exit code
    [unknown] = [o for o in objects if o["kind"] == "live"]
    assert unknown["live_ratio"] is None
    assert unknown["message"].startswith(f"the bookie's index at {ledger_dir / 'index'} is unreadable: ")
