"""A real bookie process restarts after a power cut tore its last journal group.

After kill -9, the newest journal gets what a power cut inside one group write can leave behind it: a 4 KiB
page of zeros (the group's first page never reached the device) followed by one valid record (a later page
that did). None of it was acknowledged. The restart must succeed, report the truncation, and serve every
acknowledged entry.
"""
from __future__ import annotations

import asyncio
import os
import re

from bksim.adapters.bookie_client import BookieClient
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry
from integration.bookie_harness import BookieProcess, Workload, read_back, stream_until

PAGE = 4096


def test_a_zero_page_then_a_valid_record_after_kill9_is_truncated_and_every_ack_served(zookeeper, zk, bookies,
                                                                                        tmp_path):
    bookie = BookieProcess(zookeeper, tmp_path)
    bookies.append(bookie)
    owner = bookie.start(zk)
    workload = Workload(ledgers=(21, 22), seed=5)

    async def before_kill() -> int:
        async with BookieClient(bookie.address) as client:
            return await stream_until(client, workload, 300, 20, window_max=8, on_target=bookie.kill9)

    assert asyncio.run(before_kill()) >= 300
    assert not bookie.alive()
    names = sorted(n for n in os.listdir(bookie.journal_dir) if jfmt.parse_journal_file_name(n) is not None)
    newest = os.path.join(bookie.journal_dir, names[-1])
    size_before = os.path.getsize(newest)
    never_acked = jfmt.entry_record(encode_entry(21, 1_000_000, -1, 0, b"never acknowledged"), 0)
    with open(newest, "ab") as f:
        f.write(bytes(PAGE) + never_acked)
        f.flush()
        os.fsync(f.fileno())

    bookie.start(zk, previous_owner=owner)  # refused before: "corruption: invalid record length 0"
    log = bookie.last_start_log()
    truncated = re.search(r"journal replay: .*?: (torn [^;]*); truncating (\d+) bytes", log)
    assert truncated is not None, log
    assert int(truncated.group(2)) >= PAGE + len(never_acked)
    assert os.path.getsize(newest) <= size_before  # the appended bytes are gone from the file

    async def after_restart() -> list[str]:
        async with BookieClient(bookie.address) as client:
            return await read_back(client, workload.acked)

    problems = asyncio.run(after_restart())
    assert problems == [], f"{len(problems)} acknowledged entries not read back, e.g. {problems[:5]}"
