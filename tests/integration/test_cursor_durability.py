"""Durable cursors on a real ZooKeeper and real bookie processes: a topic of 10,000,000 entries with
every other one acked keeps all 5,000,000 holes across a kill (the cursor dropped without closing after a
persist; the next broker recovery-opens its cursor ledger) and a clean close + reopen; the figures are printed.

The broker side runs in this process as `bksim broker run` wires it (perf.cursor_holes.InProcessBroker: a kazoo
session, ZkMetadataStore, GrpcBookieTransport, LedgerService; one per "broker"); the message ledgers are a
FixedLayout (the cursor never reads them), the cursor ledger and the znode are real. The steps and the
bit-for-bit comparison are perf.cursor_holes.roundtrip's, the same code `bksim perf cursor-holes` runs.
"""
from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import replace

import pytest

from bksim.model.config import Config
from bksim.perf import cursor_holes
from bksim.perf.cursor_holes import FixedLayout, InProcessBroker

BOOKIES = 2  # the topic's default E=Qw=Qa=2


@pytest.fixture(scope="module")
def bookies_up(broker_cluster):
    broker_cluster.settle(BOOKIES)
    return broker_cluster


def run_roundtrip(zookeeper, layout, pattern, topic, logs):
    """cursor_holes.roundtrip under a managed-ledger path of this run's own (the ZooKeeper is the session's)."""
    config = Config()
    ml_path = f"/managed-ledgers/t{uuid.uuid4().hex[:12]}/cursor-holes/persistent/topic"

    async def main():
        return await cursor_holes.roundtrip(lambda: InProcessBroker.connect(zookeeper.connect, config, logs.append),
                                            layout, topic, pattern, log=logs.append, ml_path=ml_path)
    return asyncio.run(main())


def print_figures(r: cursor_holes.Report) -> None:
    print(f"\ncursor holes: {r.entries:,} entries, {r.pattern}: {r.acked:,} acked, {r.holes:,} holes, "
          f"{r.ranges:,} ranges; ack {r.ack_us:.3f} us/message, state {r.state_bytes:,} B in memory\n"
          f"  snapshot {r.snapshot_bytes:,} B compressed ({r.snapshot_payload_bytes:,} B payload) in "
          f"{r.snapshot_entries} entries; persist {r.persist_s * 1000:.1f} ms\n"
          f"  recover after kill {r.recover_kill_s * 1000:.1f} ms ({r.holes_after_kill:,} holes back); clean close "
          f"{r.close_s * 1000:.1f} ms; recover after clean close {r.recover_clean_s * 1000:.1f} ms "
          f"({r.holes_after_clean:,} holes back)")


def test_ten_million_entries_every_other_acked_keep_all_holes_across_kill_and_clean_restart(bookies_up, zookeeper):
    layout = FixedLayout(10_000_000, 50_000)
    logs: list[str] = []
    r = run_roundtrip(zookeeper, layout, "alternate", Config().topic, logs)
    print_figures(r)
    assert (r.acked, r.holes, r.ranges) == (5_000_000, 5_000_000, 5_000_000)
    assert r.holes_after_kill == r.holes_after_clean == 5_000_000
    for stats in (r.recovered_kill, r.recovered_clean):
        assert stats["recovery"]["source"] == "ledger"
        assert stats["individuallyDeletedEntries"] == 5_000_000
        assert stats["totalNonContiguousDeletedMessagesRange"] == 5_000_000
        assert stats["markDeletePosition"] == "1000:-1"
    # the kill left the cursor ledger OPEN: the next broker recovered it (fencing), it did not just read it
    killed_ledger = r.recovered_kill["recovery"]["cursorLedger"]
    assert any(re.search(rf"ledger {killed_ledger}: recovery started", line) for line in logs), logs
    assert any(re.search(rf"ledger {killed_ledger}: recovered and CLOSED", line) for line in logs)
    # the clean close had too many ranges for the znode: a final snapshot in a new, closed cursor ledger
    clean_ledger = r.recovered_clean["recovery"]["cursorLedger"]
    assert clean_ledger not in (-1, killed_ledger)
    assert not any(re.search(rf"ledger {clean_ledger}: recovery started", line) for line in logs)
    assert 0 < r.snapshot_bytes < 100_000 and r.snapshot_entries == 1  # every-other compresses to a few KB


def test_a_random_ack_pattern_is_chunked_and_recovered_bit_for_bit(bookies_up, zookeeper):
    layout = FixedLayout(1_000_000, 50_000)
    topic = replace(Config().topic, cursor_snapshot_chunk_bytes=32 * 1024)
    logs: list[str] = []
    r = run_roundtrip(zookeeper, layout, "random", topic, logs)
    print_figures(r)
    # a random bitmap does not compress: ~125 KB of payload in 32 KB chunks plus the marker
    assert r.snapshot_bytes > 100_000 and r.snapshot_entries == (r.snapshot_bytes + 32 * 1024 - 1) // (32 * 1024) + 1
    assert r.recovered_kill["recovery"]["entriesRead"] == r.snapshot_entries
    assert r.holes_after_kill == r.holes_after_clean == r.holes and 450_000 < r.holes < 550_000
