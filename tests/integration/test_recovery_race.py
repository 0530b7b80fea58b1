"""Two brokers recover one ledger at once while a bookie of its ensemble is dead (what a topic takeover does: the
old owner's failed-add path and the new owner's open), on real processes: real ZooKeeper, five `bksim bookie run`
and three `bksim broker run` processes.

The writer broker is killed -9 mid-stream (a tail of entries above the piggybacked LAC for recovery to write
back), then one bookie of the ensemble, then both other brokers are asked to recover the ledger at the same
moment; as soon as the ledger shows CLOSED one of them is killed -9 (the one whose recovery has not returned, if
only one has: its write-back dies mid-way). The CLOSED metadata must hold every acknowledged entry, and every entry up to last_entry_id must
be on at least Qa bookies of its write set in that metadata, asked directly (AllCommittedEntriesReachAckQuorum;
the dead bookie, killed and not wiped, counts for the segments the writer left, where it acknowledged adds).
"""
from __future__ import annotations

import asyncio

import pytest

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.broker_client import BrokerCallError
from bksim.metadata import ledger_metadata
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.paths import ledger_path
from bksim.model.status import StatusCode
from helpers import wait_until
from integration.broker_harness import Background, BrokerConn, check_ledger_contents, stream_appends

PASSWORD = b"race"
BOOKIES = 5  # E=3, the dead one, and one spare for each recovery to pick
READ_BATCH = 512


@pytest.fixture
def cluster(broker_cluster):
    broker_cluster.settle(BOOKIES)
    broker_cluster.start_brokers(3)
    return broker_cluster


def recover(address: str, ledger_id: int):
    with BrokerConn(address) as conn:
        return conn.open(ledger_id, PASSWORD, recover=True)


async def _held_by(address: str, ledger_id: int, last_entry_id: int) -> set[int]:
    """The entry ids 0..last_entry_id the bookie at `address` answers OK for (no fence)."""
    held = set()
    async with BookieClient(address) as client:
        for first in range(0, last_entry_id + 1, READ_BATCH):
            ids = list(range(first, min(first + READ_BATCH, last_entry_id + 1)))
            for entry_id, r in zip(ids, await client.read_entries(ledger_id, ids)):
                if r.status is StatusCode.OK:
                    held.add(entry_id)
    return held


def test_two_recoveries_at_once_with_a_dead_bookie_leave_every_entry_on_ack_quorum(cluster):
    writer, first, second = cluster.brokers[-3:]
    with BrokerConn(writer.address) as cw:
        md = cw.create(3, 2, 2, PASSWORD)
        lid = md.ledger_id
        ensemble = list(md.segments[0].ensemble)
        run = stream_appends(cw, lid, PASSWORD, target=2000, on_target=writer.kill9, until_error=True, window=64)
    assert not writer.alive() and len(run.acked) >= 2000
    dead = cluster.bookie(ensemble[run.sent % 3])  # in the write set of the tail's entries
    dead.kill9()

    def stored():
        data, _ = cluster.zk.get(ledger_path(lid))
        return ledger_metadata.decode(data)
    before = stored()  # the segments the writer left; the dead bookie keeps (on its disk) what it acknowledged there
    recoveries = {first: Background(lambda: recover(first.address, lid)),
                  second: Background(lambda: recover(second.address, lid))}
    wait_until(lambda: stored().state is LedgerState.CLOSED, 60, interval_s=0.01,
               message=f"ledger {lid} CLOSED by one of the recoveries")
    # one broker dies: the one whose recovery has not returned (its write-back dies mid-way), else the second
    doomed = first if recoveries[second].done() and not recoveries[first].done() else second
    doomed.kill9()
    closed = stored()
    assert closed.state is LedgerState.CLOSED and run.max_acked <= closed.last_entry_id < run.sent, \
        (run.max_acked, closed.last_entry_id, run.sent)
    assert all(a.ensemble != b.ensemble for a, b in zip(closed.segments, closed.segments[1:])), closed.segments

    live = {b.bookie_id for b in cluster.live_bookies()}
    named = {b for s in closed.segments for b in s.ensemble}
    held = {b: asyncio.run(_held_by(b, lid, closed.last_entry_id)) for b in sorted(named & live)}
    below = []
    firsts = [s.first_entry_id for s in closed.segments] + [closed.last_entry_id + 1]
    for segment, end in zip(closed.segments, firsts[1:]):
        e = len(segment.ensemble)
        for entry_id in range(segment.first_entry_id, end):
            write_set = [segment.ensemble[(entry_id + i) % e] for i in range(2)]
            holders = [b for b in write_set if entry_id in held.get(b, ())
                       or (b == dead.bookie_id and segment in before.segments)]
            if len(holders) < 2:
                below.append((entry_id, write_set, holders))
    assert not below, f"{len(below)} entries below Qa=2 in the CLOSED metadata {closed.segments}: {below[:5]}"

    for broker, recovery in recoveries.items():  # each returns that CLOSED metadata, unless its broker was killed first
        try:
            got, _ = recovery.result()
        except BrokerCallError as e:
            assert broker is doomed and e.grpc_code == "UNAVAILABLE", e
            continue
        assert (got.last_entry_id, got.length) == (closed.last_entry_id, closed.length)
        assert [(x.first_entry_id, tuple(x.ensemble)) for x in got.segments] == \
            [(x.first_entry_id, x.ensemble) for x in closed.segments]
    survivor = second if doomed is first else first
    with BrokerConn(survivor.address) as conn:
        assert check_ledger_contents(lid, conn.read(lid, PASSWORD), closed.last_entry_id, run.acked) == []
