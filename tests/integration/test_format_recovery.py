"""A bookie wiped and re-initialised with `bksim bookie format` must not let a recovery truncate acknowledged
entries, on real processes: real ZooKeeper, two `bksim bookie run` and two `bksim broker run` processes, default
settings.

E = Qw = Qa = 2 on the two bookies: 20,000 entries are written and acknowledged through one broker, the ledger
is left OPEN; that broker and one bookie are killed -9, the bookie's directories are wiped and
`bksim bookie format --force --delete-cookie` is run, the bookie starts again (a new incarnation with the same
id) and the other broker recovers the ledger. Every acknowledged entry is still on the surviving bookie, so the
ledger must close at or above the highest acknowledged entry and read back byte for byte. With Qw = Qa one
explicit negative proves an entry absent: a formatted bookie answering NO_ENTRY / NO_LEDGER for its earlier
incarnation's ledger closed it early (at 18,962 in one run, at -1 in another); in limbo it answers UNKNOWN_STATE.
"""
from __future__ import annotations

import asyncio

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.chaos.wipe import wipe_bookie
from bksim.model.status import StatusCode
from helpers import wait_until
from integration.bookie_harness import SESSION_TIMEOUT_MS
from integration.broker_harness import BrokerConn, check_ledger_contents, stream_appends
from integration.test_bookie_format import run_format, zk_cookie

PASSWORD = b"format"
ENTRIES = 20_000


@pytest.fixture
def cluster(broker_cluster):
    broker_cluster.settle(2)
    broker_cluster.start_brokers(2)
    return broker_cluster


def test_recovery_after_a_bookie_format_keeps_every_acknowledged_entry(cluster):
    writer, recoverer = cluster.brokers[-2:]
    with BrokerConn(writer.address) as conn:
        md = conn.create(2, 2, 2, PASSWORD)
        lid = md.ledger_id
        run = stream_appends(conn, lid, PASSWORD, batch=50, window=16, target=ENTRIES, total=ENTRIES)
    assert run.error is None and len(run.acked) >= ENTRIES and sorted(run.acked) == list(range(len(run.acked))), \
        run.error
    writer.kill9()  # the ledger stays OPEN
    wiped = cluster.bookie(md.segments[0].ensemble[1])
    wiped.kill9()
    wipe_bookie(wiped.base_dir)
    wait_until(lambda: wiped.owner(cluster.zk) is None, 3 * SESSION_TIMEOUT_MS / 1000 + 5, interval_s=0.05,
               message=f"the killed bookie {wiped.bookie_id}'s registration to expire")
    formatted = run_format(wiped, "--force", "--delete-cookie", "--json")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    wiped.start(cluster.zk)

    with BrokerConn(recoverer.address) as conn:
        info, _ = conn.open(lid, PASSWORD, recover=True)
        assert info.state == "CLOSED" and info.last_entry_id >= run.max_acked, \
            (f"ledger {lid} CLOSED at {info.last_entry_id}: {run.max_acked - info.last_entry_id} acknowledged "
             f"entries lost")
        entries = conn.read(lid, PASSWORD, 0, info.last_entry_id)
    assert check_ledger_contents(lid, entries, info.last_entry_id, run.acked) == []

    async def formatted_answers():  # what the new incarnation says of an entry below the written-back tail
        async with BookieClient(wiped.address) as client:
            return (await client.read_entry(lid, 0)).status
    assert asyncio.run(formatted_answers()) == StatusCode.UNKNOWN_STATE
    cookie = zk_cookie(cluster.zk, wiped.bookie_id)
    assert cookie.incarnation == 2 and cookie.in_limbo(lid), cookie
