"""`bksim bookie gc`, `bksim bookie gc-status` and `bksim entrylog dump` as a shell runs them (`python -m
bksim.cli.main`, no BKSIM_ variables, no configuration file) against a real `bksim bookie run` process: a ledger
whose metadata is deleted from ZooKeeper is freed by one `bookie gc --json` (its entries and its own entry logs
gone, the other ledger intact), `gc-status --json` shows that round, `entrylog dump` reads the running bookie's
live ratios; an unknown kind (asked through the client: the command's flags cannot spell one) and an address
where no bookie listens give their documented code and message. The periodic loop never runs here
(gc_wait_time_ms is 15 min): every round is one the commands asked for."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bksim.adapters.bookie_client import BookieAdminError, BookieClient
from bksim.formats.entry import encode_entry
from bksim.metadata.ledger_manager import delete_ledger_metadata
from bksim.model.status import StatusCode
from helpers import free_port, wait_until_async
from integration.bookie_harness import KEY, BookieProcess
from integration.test_bookie_gc import logs_by_ledgers, run
from integration.test_bookie_readonly import ledgers_with_metadata
from pty_run import assert_ends_clean, frames, run_on_tty

ENTRIES = 60
PAYLOAD = 1000


def bksim(cwd, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=60)


async def write(address: str, ledger_id: int) -> list[bytes]:
    entries = [encode_entry(ledger_id, i, i - 1, 0, bytes([i % 251]) * PAYLOAD) for i in range(ENTRIES)]
    async with BookieClient(address) as client:
        stream = client.add_stream()
        for i in range(0, ENTRIES, 20):
            result = await stream.add(i, [(e, KEY, 0) for e in entries[i:i + 20]])
            assert result.ok, result
        await stream.close()
    return entries


def test_bookie_gc_frees_a_deleted_ledger_and_gc_status_shows_the_round(zookeeper, tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path, env={
        "BKSIM_BOOKIE_FLUSH_INTERVAL_MS": "200", "BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX": str(32 * 1024)})
    entrylogs = os.path.join(bookie.ledger_dir, "entrylogs")

    async def scenario(zk, store):
        doomed, kept = await ledgers_with_metadata(zk, bookie.bookie_id, 2)
        written = {}
        for ledger_id in (doomed, kept):
            written[ledger_id] = await write(bookie.address, ledger_id)
            await wait_until_async(lambda: any(ledger_id in held for held in logs_by_ledgers(entrylogs).values()),
                                   10.0, message=f"ledger {ledger_id} checkpointed into an entry log")
        only_doomed = sorted(i for i, held in logs_by_ledgers(entrylogs).items() if held == {doomed})
        assert only_doomed, logs_by_ledgers(entrylogs)
        await delete_ledger_metadata(store, doomed)

        done = bksim(tmp_path, "bookie", "gc", "--json", "--bookie", bookie.address)
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        report = json.loads(done.stdout)
        assert report["bookie"] == bookie.address and report["kind"] == "gc" and report["error"] is None
        assert report["ledgers_deleted"] == [doomed] and report["candidates"] == 1
        assert set(only_doomed) <= set(report["logs_deleted"]) and report["bytes_freed"] >= ENTRIES * PAYLOAD // 2
        assert not set(report["logs_deleted"]) & set(logs_by_ledgers(entrylogs))  # the files are gone

        async with BookieClient(bookie.address) as client:
            assert (await client.read_entry(doomed, 0)).status == StatusCode.NO_LEDGER
            got = await client.read_entries(kept, list(range(ENTRIES)))
            assert [r.entry for r in got] == written[kept]
            with pytest.raises(BookieAdminError) as refused:
                await client.run_gc("full")
            assert refused.value.code == "INVALID_ARGUMENT"
            assert "garbage collection kind 'full': one of gc, minor, major" in refused.value.message

        status = bksim(tmp_path, "bookie", "gc-status", "--json", "--bookie", bookie.address)
        assert (status.returncode, status.stderr) == (0, ""), status.stderr
        objects = [json.loads(line) for line in status.stdout.splitlines()]
        assert objects[0]["kind"] == "status" and objects[0]["totals"]["rounds"] == 1  # the refused kind ran none
        assert objects[0]["totals"]["ledgers_deleted"] == 1 and objects[0]["schedule"]["gc_wait_time_ms"] == 900_000
        [last] = [o["report"] for o in objects if o["kind"] == "last"]
        assert (last["kind"], last["ledgers_deleted"], last["bytes_freed"]) == ("gc", [doomed], report["bytes_freed"])
        logs = {o["log_id"]: o for o in objects if o["kind"] == "entry_log"}
        assert set(logs) == set(logs_by_ledgers(entrylogs)) | {o["log_id"] for o in logs.values() if o["current"]}

        code, stdout, terminal = run_on_tty("bookie", "gc", "--bookie", bookie.address, cwd=str(tmp_path))
        assert code == 0 and stdout.startswith(f"bookie {bookie.address}: garbage collection (gc) done in "), terminal
        assert any(f.startswith(f"bookie {bookie.address}: garbage collection (gc)") and "round running (" in f
                   for f in frames(terminal)), terminal  # the spinner line while the round runs, then erased
        assert_ends_clean(terminal)

        dump = bksim(tmp_path, "entrylog", "dump", "--json", bookie.ledger_dir)  # beside the running bookie
        assert dump.returncode == 0, dump.stdout + dump.stderr
        live = {o["log_id"]: o for o in map(json.loads, dump.stdout.splitlines()) if o["kind"] == "live"}
        sealed = [log_id for log_id, o in logs.items() if not o["current"]]
        assert sealed and set(sealed) <= set(live)
        for log_id in sealed:
            assert (live[log_id]["live_bytes"], live[log_id]["bytes"]) == (logs[log_id]["live_bytes"],
                                                                           logs[log_id]["bytes"])
            assert live[log_id]["source"] == "entry-log metadata"

        port = free_port()
        nobody = bksim(tmp_path, "bookie", "gc", "--bookie", f"127.0.0.1:{port}")
        assert (nobody.returncode, nobody.stdout) == (2, "")
        assert nobody.stderr.startswith(f"bksim: error: bookie 127.0.0.1:{port}: UNAVAILABLE: ")
        assert nobody.stderr.rstrip().endswith("(is the bookie running? --bookie HOST:PORT names another)")

    run(zookeeper, bookie, scenario, "garbage collection (gc): 1 ledger(s) deleted")
