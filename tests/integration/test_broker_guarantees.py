"""The broker's guarantees on a real cluster (PROTOCOL.md §4 and §7): real ZooKeeper, real
`bksim bookie run` and `bksim broker run` processes, clients over gRPC.

- A bookie killed with -9 during an Append stream: writes go on after an ensemble change, the metadata has a
  new segment without it, every acknowledged entry reads back identical through the writer and another broker.
- Broker B recovers a ledger broker A is streaming to: A's stream ends FENCED, the CLOSED ledger holds every
  entry A acknowledged and nothing A acknowledged lies above last_entry_id (NoDivergenceBetweenClientAndMetaData,
  AllAckedEntriesAreReadable, NoOutOfOrderEntries).
- Broker A killed with -9 mid-stream; broker B recovers: the same.
- Bad input gets the documented gRPC code and LedgerStatus, and the broker keeps serving.

Payloads encode their append index (broker_harness.payload), so "identical bytes" and "the entry at id i is the
i-th append" are checked for every entry read. Acknowledged = named by an AppendResponse (first_entry_id, count).
The module shares one set of 4 bookies and 2 brokers; before each test `settle` replaces killed bookies with
fresh ones and waits until the writable registrations are exactly the live bookies.
"""
from __future__ import annotations

import pytest

from bksim.adapters.broker_client import BrokerCallError
from helpers import wait_until
from integration.broker_harness import (PAYLOAD_BYTES_MAX, Background, BrokerConn, check_ledger_contents, payload,
                                        stream_appends)

PASSWORD = b"guarantees"
BOOKIES = 4  # E=3 plus one spare, so an ensemble change has exactly one replacement to choose


@pytest.fixture
def cluster(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2)
    for b in broker_cluster.brokers[:2]:
        assert b.alive(), f"broker {b.broker_id} died:\n{b.log_tail()}"
    return broker_cluster


def recover(address: str, ledger_id: int):
    """OpenLedger(recover=True) on its own connection (it runs in a thread while a stream goes on)."""
    with BrokerConn(address) as conn:
        return conn.open(ledger_id, PASSWORD, recover=True)


@pytest.mark.parametrize("qw", [3, 2], ids=["E3-Qw3-Qa2", "E3-Qw2-Qa2"])
def test_bookie_kill9_mid_stream_ensemble_change_keeps_every_acked_entry(cluster, qw):
    a, b = cluster.brokers[:2]
    with BrokerConn(a.address) as ca, BrokerConn(b.address) as cb:
        md = ca.create(3, qw, 2, PASSWORD)
        lid = md.ledger_id
        ensemble = list(md.segments[0].ensemble)
        assert len(ensemble) == 3 and md.state == "OPEN"
        victim = cluster.bookie(ensemble[1])
        run = stream_appends(ca, lid, PASSWORD, target=200, on_target=victim.kill9, total=600)
        assert run.error is None, f"the stream failed after the kill: {run.error}\n{a.log_tail()}"
        assert not victim.alive()
        assert len(run.acked) == run.sent >= 600

        # the writer replaces the bookie once one add to it fails, even an add already acknowledged at Qa by
        # the live two: the change may still be in flight when the stream's last acknowledgement came back
        md = wait_until(lambda: m if len((m := ca.metadata(lid)).segments) > 1 else None, 15,
                        message=f"an ensemble change replacing the killed {victim.bookie_id}")
        assert md.state == "OPEN"
        assert len(md.segments) == 2, f"expected one ensemble change: {md.segments}"
        first, last = md.segments
        assert first.first_entry_id == 0 and list(first.ensemble) == ensemble
        assert 200 <= last.first_entry_id <= run.sent  # LAC + 1 when the change began; 200 were acked before the kill
        spare = {x.bookie_id for x in cluster.live_bookies()} - set(ensemble)
        assert list(last.ensemble) == [spare.pop() if x == victim.bookie_id else x for x in ensemble], \
            f"the killed bookie {victim.bookie_id} should be replaced in place by the spare"

        lac = ca.read_lac(lid, PASSWORD)
        assert lac == run.max_acked == run.sent - 1
        assert check_ledger_contents(lid, ca.read(lid, PASSWORD), lac, run.acked) == []

        lac_b = cb.read_lac(lid, PASSWORD)  # B learns the LAC from the bookies: it may lag the writer's
        assert 0 <= lac_b <= lac
        assert cb.read(lid, PASSWORD) == {i: run.acked[i] for i in range(lac_b + 1)}

        closed = ca.close_ledger(lid, PASSWORD)
        assert (closed.state, closed.last_entry_id) == ("CLOSED", lac)
        assert check_ledger_contents(lid, cb.read(lid, PASSWORD), lac, run.acked) == []


def test_recovery_by_another_broker_fences_the_streaming_writer(cluster):
    a, b = cluster.brokers[:2]
    with BrokerConn(a.address) as ca, BrokerConn(b.address) as cb:
        lid = ca.create(3, 3, 2, PASSWORD).ledger_id
        recovery: list[Background] = []
        run = stream_appends(ca, lid, PASSWORD, target=300, until_error=True,
                             on_target=lambda: recovery.append(Background(lambda: recover(b.address, lid))))
        assert (run.error.grpc_code, run.error.status) == ("ABORTED", "FENCED"), run.error
        assert run.inband_error == "FENCED"  # the same reason in-band (it survives grpc.aio races)
        closed, lac = recovery[0].result()
        assert closed.state == "CLOSED" and lac == closed.last_entry_id
        assert len(run.acked) >= 300
        assert run.max_acked <= closed.last_entry_id < run.sent, \
            f"acknowledged up to {run.max_acked}, sent {run.sent}, closed at {closed.last_entry_id}"
        for conn in (cb, ca):
            assert check_ledger_contents(lid, conn.read(lid, PASSWORD), closed.last_entry_id, run.acked) == []

        for _ in range(2):  # the fenced writer never appends again, and says why
            refused(lambda: ca.append_once(lid, PASSWORD, [payload(lid, run.sent)]), "ABORTED", "FENCED", a)
        after = ca.metadata(lid)
        assert (after.state, after.last_entry_id, after.length) == ("CLOSED", closed.last_entry_id, closed.length)


def test_broker_kill9_mid_stream_then_another_broker_recovers(cluster):
    doomed, = cluster.start_brokers(1)
    b = cluster.brokers[1]
    with BrokerConn(doomed.address) as cd, BrokerConn(b.address) as cb:
        lid = cd.create(3, 2, 2, PASSWORD).ledger_id
        run = stream_appends(cd, lid, PASSWORD, target=300, on_target=doomed.kill9, until_error=True)
        assert not doomed.alive()
        assert run.error.grpc_code == "UNAVAILABLE", run.error
        assert len(run.acked) >= 300
        assert cb.metadata(lid).state == "OPEN"  # nobody closed it: the writer died

        closed, lac = cb.open(lid, PASSWORD, recover=True)
        assert closed.state == "CLOSED" and lac == closed.last_entry_id
        assert run.max_acked <= closed.last_entry_id < run.sent, \
            f"acknowledged up to {run.max_acked}, sent {run.sent}, closed at {closed.last_entry_id}"
        assert check_ledger_contents(lid, cb.read(lid, PASSWORD), closed.last_entry_id, run.acked) == []
        again, _ = cb.open(lid, PASSWORD, recover=True)  # a CLOSED ledger needs no recovery: same metadata
        assert (again.last_entry_id, again.version) == (closed.last_entry_id, closed.version)


def refused(call, grpc_code: str, status: str, broker) -> BrokerCallError:
    """`call()` fails with this gRPC code and LedgerStatus, and the broker keeps serving afterwards."""
    with pytest.raises(BrokerCallError) as info:
        call()
    assert (info.value.grpc_code, info.value.status) == (grpc_code, status), info.value
    assert broker.alive(), f"broker {broker.broker_id} died:\n{broker.log_tail()}"
    with BrokerConn(broker.address) as conn:
        assert conn.health() == "SERVING"
    return info.value


def test_bad_input_is_refused_with_its_status_and_the_broker_stays_up(cluster):
    a, b = cluster.brokers[:2]
    with BrokerConn(a.address) as ca, BrokerConn(b.address) as cb:
        ledgers_before = ca.list_ledgers()
        for e, qw, qa in [(2, 3, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0)]:  # E < Qw, Qa > Qw, Qa < 1, nothing
            refused(lambda: ca.create(e, qw, qa, PASSWORD), "INVALID_ARGUMENT", "BAD_REQUEST", a)
        refused(lambda: ca.create(BOOKIES + 1, 2, 2, PASSWORD), "UNAVAILABLE", "NOT_ENOUGH_BOOKIES", a)
        assert ca.list_ledgers() == ledgers_before, \
            "a refused create left a ledger behind"

        lid = ca.create(3, 2, 2, PASSWORD).ledger_id
        r = ca.append_once(lid, PASSWORD, [payload(lid, i) for i in range(5)])
        assert (r.first_entry_id, r.count, r.last_add_confirmed) == (0, 5, 4)

        # wrong password: every call that names the ledger, on the writer and on another broker
        bad = b"not-" + PASSWORD
        for broker, conn in ((a, ca), (b, cb)):
            refused(lambda: conn.read_lac(lid, bad), "PERMISSION_DENIED", "UNAUTHORIZED", broker)
            refused(lambda: conn.read(lid, bad, 0, 0), "PERMISSION_DENIED", "UNAUTHORIZED", broker)
            refused(lambda: conn.open(lid, bad, recover=False), "PERMISSION_DENIED", "UNAUTHORIZED", broker)
            refused(lambda: conn.open(lid, bad, recover=True), "PERMISSION_DENIED", "UNAUTHORIZED", broker)
            refused(lambda: conn.close_ledger(lid, bad), "PERMISSION_DENIED", "UNAUTHORIZED", broker)
        refused(lambda: ca.append_once(lid, bad, [payload(lid, 5)]), "PERMISSION_DENIED", "UNAUTHORIZED", a)
        assert ca.metadata(lid).state == "OPEN", "a recovery with the wrong password must not fence the writer"

        # reading past the LAC, through the writer and through a reader
        refused(lambda: ca.read(lid, PASSWORD, 0, 5), "OUT_OF_RANGE", "READ_BEYOND_LAC", a)
        lac_b = cb.read_lac(lid, PASSWORD)
        refused(lambda: cb.read(lid, PASSWORD, 0, lac_b + 1), "OUT_OF_RANGE", "READ_BEYOND_LAC", b)
        refused(lambda: ca.read(lid, PASSWORD, 3, 1), "INVALID_ARGUMENT", "BAD_REQUEST", a)

        # a payload over payload_bytes_max: the whole request is refused, nothing of it appended
        oversize = [payload(lid, 5), b"x" * (PAYLOAD_BYTES_MAX + 1)]
        refused(lambda: ca.append_once(lid, PASSWORD, oversize), "INVALID_ARGUMENT", "BAD_REQUEST", a)
        assert ca.read_lac(lid, PASSWORD) == 4
        r = ca.append_once(lid, PASSWORD, [payload(lid, 5)])  # the ledger still takes appends, at the next id
        assert (r.first_entry_id, r.count) == (5, 1)

        # appending to (or closing) a ledger another broker writes
        refused(lambda: cb.append_once(lid, PASSWORD, [payload(lid, 6)]), "FAILED_PRECONDITION", "NOT_WRITER", b)
        refused(lambda: cb.close_ledger(lid, PASSWORD), "FAILED_PRECONDITION", "NOT_WRITER", b)
        assert ca.read_lac(lid, PASSWORD) == 5

        # unknown ledger
        unknown = max(ledgers_before | {lid}) + 1_000_000
        for broker, conn in ((a, ca), (b, cb)):
            refused(lambda: conn.metadata(unknown), "NOT_FOUND", "NO_SUCH_LEDGER", broker)
            refused(lambda: conn.read(unknown, PASSWORD), "NOT_FOUND", "NO_SUCH_LEDGER", broker)
            refused(lambda: conn.read_lac(unknown, PASSWORD), "NOT_FOUND", "NO_SUCH_LEDGER", broker)
            refused(lambda: conn.open(unknown, PASSWORD, recover=True), "NOT_FOUND", "NO_SUCH_LEDGER", broker)
            refused(lambda: conn.close_ledger(unknown, PASSWORD), "NOT_FOUND", "NO_SUCH_LEDGER", broker)

        # a closed ledger: no append lands, reads stop at last_entry_id
        closed = ca.close_ledger(lid, PASSWORD)
        assert (closed.state, closed.last_entry_id) == ("CLOSED", 5)
        refused(lambda: ca.append_once(lid, PASSWORD, [payload(lid, 6)]), "FAILED_PRECONDITION", "LEDGER_CLOSED", a)
        with pytest.raises(BrokerCallError) as info:  # B never wrote it: NOT_WRITER is as true as LEDGER_CLOSED
            cb.append_once(lid, PASSWORD, [payload(lid, 6)])
        assert (info.value.grpc_code, info.value.status) in {("FAILED_PRECONDITION", "NOT_WRITER"),
                                                             ("FAILED_PRECONDITION", "LEDGER_CLOSED")}, info.value
        for broker, conn in ((a, ca), (b, cb)):
            refused(lambda: conn.read(lid, PASSWORD, 0, 6), "OUT_OF_RANGE", "READ_BEYOND_LAC", broker)
            assert check_ledger_contents(lid, conn.read(lid, PASSWORD), 5, {}) == []
        assert ca.close_ledger(lid, PASSWORD).last_entry_id == 5  # closing a closed ledger: the same metadata
        assert ca.metadata(lid).version == closed.version
        for broker in (a, b):
            assert broker.alive(), broker.log_tail()
