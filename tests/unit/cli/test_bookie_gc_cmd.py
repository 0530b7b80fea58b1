"""`bksim bookie gc` and `bksim bookie gc-status` (cli/bookie_cmd.py) through cli.main.main: argument handling, the
bookie address (--bookie, else the configuration), the text and JSON output and the exit codes, against a real
BookieServer + BookieEngine + GarbageCollector served from an event loop in a background thread (the command runs
its own loop); the metadata store is an in-memory set that can fail its listing."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import uuid

import pytest

from bksim.adapters.bookie_server import BookieServer
from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.bookie.gc import GarbageCollector
from bksim.cli import bookie_cmd
from bksim.cli.main import main
from bksim.formats.entry import encode_entry
from bksim.model.config import BookieConfig
from bksim.model.errors import ConnectionLossError
from bksim.model.status import StatusCode

KEY = b"k" * 32


class Source:
    def __init__(self, ids) -> None:
        self.ids = set(ids)
        self.fail = False

    async def ledger_ids(self):
        if self.fail:
            raise ConnectionLossError("/ledgers", "connection lost")
        return set(self.ids)

    async def ledger_exists(self, ledger_id: int) -> bool:
        return ledger_id in self.ids


class ThreadedBookie:
    """A bookie (engine, collector, gRPC server on a free port) on an event loop of its own thread."""

    def __init__(self, tmp_path, source: Source) -> None:
        self.tmp_path, self.source = tmp_path, source
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.address = self.call(self._start())

    def call(self, coroutine, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    async def _start(self) -> str:
        config = dataclasses.replace(BookieConfig(), port=0, entry_log_bytes_max=4096, compaction_rate_bytes_per_s=0,
                                     gc_wait_time_ms=3_600_000, minor_compaction_interval_ms=3_600_000)
        self.engine = BookieEngine(config, disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                                   instance_id=str(uuid.uuid4()), journal_dir=str(self.tmp_path / "journal"),
                                   ledger_dir=str(self.tmp_path / "ledgers"), log=lambda line: None)
        await self.engine.start()
        gc = GarbageCollector(self.engine, self.source, config, SystemClock(), log=lambda line: None)
        self.server = BookieServer(self.engine, config, "cli-test", disk=LocalDisk(), clock=SystemClock(),
                                   journal_dir=self.engine.journal_dir, ledger_dir=self.engine.ledger_dir,
                                   log=lambda line: None, gc=gc)
        return f"127.0.0.1:{await self.server.start()}"

    async def write(self, ledger_id: int, n: int) -> None:
        entries = [(encode_entry(ledger_id, i, i - 1, 0, bytes([i]) * 500), KEY, 0) for i in range(n)]
        statuses, message = await self.engine.add_entries(entries)
        assert statuses == [StatusCode.OK] * n, message
        await self.engine.checkpoint()

    async def _stop(self) -> None:
        await self.server.stop(1000)
        await self.engine.close()

    def close(self) -> None:
        try:
            self.call(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10.0)
            self.loop.close()


@pytest.fixture
def bookie(tmp_path):
    b = ThreadedBookie(tmp_path, Source({2}))
    try:
        b.call(b.write(1, 20))
        b.call(b.write(2, 20))
        yield b
    finally:
        b.close()


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gc_prints_what_the_round_freed_and_gc_status_shows_it(bookie, capsys):
    code, out, err = run(capsys, "bookie", "gc", "--bookie", bookie.address)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"bookie {bookie.address}: garbage collection (gc) done in ")
    assert lines[1] == "  ledgers deleted:      1 (1)"
    assert lines[2].startswith("  entry logs deleted:   ") and not lines[2].endswith(" 0")
    assert lines[3] == "  entry logs compacted: 0"
    assert lines[4].startswith("  bytes freed:          ") and int(lines[4].split()[2]) > 0
    assert lines[6] == "  candidates:           1 local ledgers absent from the metadata, 0 kept (found when re-read)"

    code, out, err = run(capsys, "bookie", "gc", "--major", "--json", "--bookie", bookie.address)
    assert (code, err) == (0, "")
    [report] = [json.loads(line) for line in out.splitlines()]
    assert report["bookie"] == bookie.address and report["kind"] == "major" and report["error"] is None
    assert report["ledgers_deleted"] == [] and report["ledgers_deleted_count"] == 0
    # the log ledgers 1 and 2 shared is below the major threshold: compacted
    assert report["logs_compacted_count"] == len(report["logs_compacted"]) == 1 and report["bytes_copied"] > 0

    code, out, err = run(capsys, "bookie", "gc-status", "--json", "--bookie", bookie.address)
    assert (code, err) == (0, "")
    objects = [json.loads(line) for line in out.splitlines()]
    status = objects[0]
    assert status["kind"] == "status" and status["bookie"] == bookie.address and status["running"] is False
    assert status["totals"]["rounds"] == 2 and status["totals"]["ledgers_deleted"] == 1
    assert status["totals"]["logs_compacted"] == 1
    assert [(o["kind"], o["report"]["kind"]) for o in objects[1:3]] == [("last", "gc"), ("last", "major")]
    assert [o["report"]["ledgers_deleted"] for o in objects[1:3]] == [[1], []]
    logs = [o for o in objects if o["kind"] == "entry_log"]
    assert len(logs) == status["entry_logs_total"] and logs
    assert all(o["live_ratio"] == 1.0 for o in logs if not o["current"])  # compaction left only live data

    code, out, err = run(capsys, "bookie", "gc-status", "--bookie", bookie.address)
    assert (code, err) == (0, "")
    assert f"bookie {bookie.address}: garbage collection idle" in out
    assert "totals since start: 2 rounds (0 stopped early), 1 ledgers deleted" in out
    assert "last minor: none since the bookie started" in out
    assert "  minor compaction: logs below 0.2 live, every 1 h, next in " in out
    assert "schedule: a round every 1 h (gc_wait_time_ms=3600000), metadata re-read before deleting: on" in out
    assert "(being written)" in out and "100.0%" in out


def test_a_round_that_stops_early_exits_1_and_says_why(bookie, capsys):
    bookie.source.fail = True
    code, out, err = run(capsys, "bookie", "gc", "--bookie", bookie.address)
    assert (code, err) == (1, "")
    assert "garbage collection (gc) STOPPED EARLY after" in out and "connection lost" in out
    assert "  ledgers deleted:      0" in out
    code, out, _ = run(capsys, "bookie", "gc", "--json", "--bookie", bookie.address)
    assert code == 1 and "ConnectionLossError" in json.loads(out)["error"]
    assert bookie.call(bookie.engine.read_entry(1, 0))[0] == StatusCode.OK  # nothing deleted


def test_the_bookie_address_comes_from_the_configuration_unless_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no deploy/bksim.toml here
    for name in ("BKSIM_CONFIG", "BKSIM_BOOKIE_HOST", "BKSIM_BOOKIE_PORT"):
        monkeypatch.delenv(name, raising=False)
    parser = bookie_cmd_parser()
    assert bookie_cmd.bookie_address(parser.parse_args(["bookie", "gc"])) == "127.0.0.1:3181"
    monkeypatch.setenv("BKSIM_BOOKIE_PORT", "3999")
    assert bookie_cmd.bookie_address(parser.parse_args(["bookie", "gc-status"])) == "127.0.0.1:3999"
    assert bookie_cmd.bookie_address(parser.parse_args(["bookie", "gc", "--bookie", "10.0.0.1:5"])) == "10.0.0.1:5"
    assert parser.parse_args(["bookie", "gc"]).kind == "gc"
    assert parser.parse_args(["bookie", "gc", "--minor"]).kind == "minor"
    assert parser.parse_args(["bookie", "gc", "--major"]).kind == "major"


def bookie_cmd_parser():
    from bksim.cli.main import build_parser

    return build_parser()


@pytest.mark.parametrize("argv, message", [
    (["bookie", "gc", "--bookie", "localhost"], "bksim: error: --bookie 'localhost': expected HOST:PORT"),
    (["bookie", "gc-status", "--bookie", "h:0"], "bksim: error: --bookie 'h:0': expected HOST:PORT"),
    (["bookie", "gc", "--bookie", "127.0.0.1:1"],
     "bksim: error: bookie 127.0.0.1:1: UNAVAILABLE: "),
])
def test_operating_errors_exit_2_with_a_message(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(message) and err.endswith("\n")
    if "UNAVAILABLE" in message:
        assert "(is the bookie running? --bookie HOST:PORT names another)" in err


def test_minor_and_major_together_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bookie", "gc", "--minor", "--major"])
    assert exited.value.code == 2
    assert "argument --major: not allowed with argument --minor" in capsys.readouterr().err


def test_text_report_cuts_long_id_lists():
    report = {"kind": "gc", "duration_ms": 3.2, "error": None, "ledgers_deleted": list(range(30)),
              "ledgers_deleted_count": 1500, "logs_deleted": [], "logs_deleted_count": 0, "logs_compacted": [7],
              "logs_compacted_count": 1, "bytes_freed": 2048, "bytes_copied": 0, "entries_copied": 0,
              "candidates": 1500, "kept_by_verify": 0}
    lines = bookie_cmd.format_gc_report("b:1", report)
    assert lines[0] == "bookie b:1: garbage collection (gc) done in 3 ms"
    assert lines[1] == "  ledgers deleted:      1500 (" + ", ".join(map(str, range(20))) + ", ...)"
    assert lines[3] == "  entry logs compacted: 1 (7)"
    assert lines[4] == "  bytes freed:          2048 (2.0 KiB)"
