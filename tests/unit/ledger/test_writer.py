"""The sans-I/O ledger writer: ordered acknowledgements, ensemble changes, fatal errors, close.

The last test drives the writer through many seeded random schedules (reordered replies, bookie errors,
timeouts) against in-memory bookies and checks the protocol invariants after every step.
"""
from __future__ import annotations

import random

import pytest

from bksim.formats.entry import decode_entry
from bksim.ledger.quorum import write_set_indexes
from bksim.ledger.writer import (Acknowledge, AddsFailed, CloseLedger, LedgerWriter, SendAdd, SendAdds,
                                 UpdateEnsemble, WriterError, WriterState)
from bksim.model.invariants import InvariantError
from bksim.model.status import StatusCode as S

B = [f"b{i}" for i in range(6)]


def writer(e=3, qw=3, qa=2, rng_seed=0, **kw) -> LedgerWriter:
    return LedgerWriter(7, ensemble=B[:e], segment_first_entry_id=0, write_quorum_size=qw, ack_quorum_size=qa,
                        rng=random.Random(rng_seed), **kw)


def sends(commands):
    return [(c.bookie, c.entry_id) for c in commands if isinstance(c, SendAdd)]


def acks(commands):
    return [c.entry_id for c in commands if isinstance(c, Acknowledge)]


def test_striped_write_sets():
    w = writer(e=3, qw=2, qa=2)
    assert sends(w.append(b"a")) == [("b0", 0), ("b1", 0)]
    assert sends(w.append(b"b")) == [("b1", 1), ("b2", 1)]
    assert sends(w.append(b"c")) == [("b2", 2), ("b0", 2)]


def test_entries_carry_the_piggybacked_lac_and_length():
    w = writer()
    first = w.append(b"hello")[0]
    w.on_add_result(0, "b0", S.OK)
    w.on_add_result(0, "b1", S.OK)
    second = w.append(b"world!")[0]
    e0, e1 = decode_entry(first.entry, ledger_id=7, entry_id=0), decode_entry(second.entry, ledger_id=7, entry_id=1)
    assert (e0.last_add_confirmed, e0.ledger_length, e0.payload) == (-1, 5, b"hello")
    assert (e1.last_add_confirmed, e1.ledger_length, e1.payload) == (0, 11, b"world!")


def test_acknowledgements_are_in_order_at_ack_quorum():
    w = writer()
    for p in (b"0", b"1", b"2"):
        w.append(p)
    assert acks(w.on_add_result(1, "b0", S.OK) + w.on_add_result(1, "b2", S.OK)) == []  # entry 0 not yet
    assert acks(w.on_add_result(0, "b1", S.OK)) == []  # one ack < Qa
    assert acks(w.on_add_result(0, "b2", S.OK)) == [0, 1]
    assert w.last_add_confirmed == 1
    assert acks(w.on_add_result(0, "b0", S.OK)) == []  # a late third ack changes nothing


def test_a_bookie_error_changes_the_ensemble_and_resends_what_it_held():
    w = writer(e=3, qw=2, qa=2, rng_seed=1)
    for p in (b"0", b"1", b"2"):
        w.append(p)
    w.on_add_result(0, "b0", S.OK)
    w.on_add_result(0, "b1", S.OK)  # entry 0 confirmed: LAC 0
    w.on_add_result(2, "b2", S.OK)
    w.on_add_result(2, "b0", S.OK)  # entry 2 complete, but entry 1 is not: no ack
    commands = w.on_add_result(1, "b1", S.IO_ERROR, writable_bookies=B)
    [change] = commands
    assert isinstance(change, UpdateEnsemble) and change.first_entry_id == 1
    assert change.replaced == ((1, "b1"),) and change.ensemble[1] in ("b3", "b4", "b5")
    assert change.ensemble[0] == "b0" and change.ensemble[2] == "b2"
    assert w.state is WriterState.CHANGING_ENSEMBLE
    assert acks(w.on_add_result(1, "b2", S.OK)) == []  # acknowledgements pause during the change
    assert sends(w.append(b"3")) == []  # held until the new ensemble is in place
    replacement = change.ensemble[1]
    commands = w.on_ensemble_changed(1, change.ensemble)
    # entry 1 (write set 1, 2) and entry 3 (write set 0, 1) go to the replacement; entry 2 (2, 0) does not
    assert sorted(sends(commands)) == sorted([(replacement, 1), ("b0", 3), (replacement, 3)])
    assert acks(w.on_add_result(1, replacement, S.OK)) == [1, 2]


def test_errors_from_an_old_segment_or_after_a_change_do_not_cascade():
    w = writer(e=3, qw=3, qa=2)
    w.append(b"0")
    [change] = w.on_add_result(0, "b1", None, writable_bookies=B)  # timeout
    assert w.on_add_result(0, "b2", S.IO_ERROR, writable_bookies=B) == []  # collected for the next change
    w.on_ensemble_changed(0, change.ensemble)
    assert w.state is WriterState.CHANGING_ENSEMBLE  # b2 is replaced next
    assert w.on_add_result(0, "b1", S.OK) == []  # the replaced bookie's late answer does not count


def test_an_error_after_ack_quorum_still_replaces_the_bookie():
    """Entry 0 reached Qa on b0 and b1 and was acknowledged before b2's failure came back: the entry stays
    under-replicated, but b2 must still leave the ensemble, or every later entry is written to a dead bookie
    and holds one copy fewer than Qw."""
    w = writer(e=3, qw=3, qa=2, rng_seed=2)
    w.append(b"0")
    w.on_add_result(0, "b0", S.OK)
    assert acks(w.on_add_result(0, "b1", S.OK)) == [0]
    [change] = w.on_add_result(0, "b2", None, writable_bookies=B)
    assert isinstance(change, UpdateEnsemble) and change.first_entry_id == 1 and change.replaced == ((2, "b2"),)
    assert change.ensemble[:2] == ("b0", "b1") and change.ensemble[2] in ("b3", "b4", "b5")
    assert w.on_ensemble_changed(1, change.ensemble) == []  # nothing pending: nothing to resend
    assert sorted(sends(w.append(b"1"))) == sorted([("b0", 1), ("b1", 1), (change.ensemble[2], 1)])


def test_an_error_after_ack_quorum_while_closing_changes_nothing():
    w = writer(e=3, qw=3, qa=2)
    w.append(b"0")
    w.on_add_result(0, "b0", S.OK)
    w.on_add_result(0, "b1", S.OK)
    assert w.close() == [CloseLedger(0, 1)]
    assert w.on_add_result(0, "b2", None, writable_bookies=B) == []
    assert w.state is WriterState.CLOSING


@pytest.mark.parametrize("status", [S.FENCED, S.UNAUTHORIZED])
def test_fenced_or_unauthorized_is_fatal(status):
    w = writer()
    w.append(b"0")
    w.append(b"1")
    w.on_add_result(0, "b0", S.OK)
    w.on_add_result(0, "b1", S.OK)
    [failed] = w.on_add_result(1, "b2", status)
    assert isinstance(failed, AddsFailed) and failed.entry_ids == (1,) and status.name in failed.reason
    assert w.state is WriterState.FAILED and w.last_add_confirmed == 0
    assert w.on_add_result(1, "b0", S.OK) == []
    with pytest.raises(WriterError, match="cannot append in state failed"):
        w.append(b"2")


def test_not_enough_bookies_fails_the_writer():
    w = writer(e=3, qw=3, qa=3)
    w.append(b"0")
    [failed] = w.on_add_result(0, "b0", S.IO_ERROR, writable_bookies=B[:3])
    assert isinstance(failed, AddsFailed) and failed.code == "NOT_ENOUGH_BOOKIES"


def test_a_rejected_ensemble_change_on_a_recovering_ledger_means_fenced():
    w = writer()
    w.append(b"0")
    w.on_add_result(0, "b0", S.IO_ERROR, writable_bookies=B)
    [failed] = w.on_ensemble_change_rejected("IN_RECOVERY", B[:3], B)
    assert isinstance(failed, AddsFailed) and "IN_RECOVERY" in failed.reason


def test_a_rejected_ensemble_change_on_an_open_ledger_is_decided_again():
    w = writer()
    w.append(b"0")
    w.on_add_result(0, "b0", S.IO_ERROR, writable_bookies=B)
    [retry] = w.on_ensemble_change_rejected("OPEN", B[:3], B)
    assert isinstance(retry, UpdateEnsemble) and retry.replaced == ((0, "b0"),)


def test_close_waits_for_pending_adds_then_closes_at_the_lac():
    w = writer()
    w.append(b"abc")
    w.append(b"de")
    assert w.close() == []
    with pytest.raises(WriterError, match="closing"):
        w.append(b"x")
    commands = []
    for entry_id, bookie in ((0, "b0"), (0, "b1"), (1, "b0"), (1, "b2")):
        commands += w.on_add_result(entry_id, bookie, S.OK)
    assert acks(commands) == [0, 1] and commands[-1] == CloseLedger(1, 5)
    w.on_closed()
    assert w.state is WriterState.CLOSED


def test_closing_an_empty_ledger():
    assert writer().close() == [CloseLedger(-1, 0)]


@pytest.mark.parametrize("seed", range(300))
def test_random_schedules_keep_the_invariants(seed):
    """Reordered replies, errors and timeouts; the shell applies ensemble changes at random later times."""
    rng = random.Random(seed)
    e = rng.randint(1, 4)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    bookies = [f"b{i}" for i in range(e + rng.randint(0, 3))]
    w = LedgerWriter(1, ensemble=bookies[:e], segment_first_entry_id=0, write_quorum_size=qw, ack_quorum_size=qa,
                     rng=rng)
    segments = [(0, tuple(bookies[:e]))]  # the metadata as the shell would store it
    stored: dict[str, set[int]] = {b: set() for b in bookies}
    inflight: list[SendAdd] = []
    change: UpdateEnsemble | None = None
    acknowledged: list[int] = []
    failed: set[int] = set()

    def run(commands):
        nonlocal change
        for c in commands:
            if isinstance(c, SendAdd):
                inflight.append(c)
            elif isinstance(c, SendAdds):
                inflight.extend(SendAdd(c.bookie, i, entry, c.recovery) for i, entry in zip(c.entry_ids, c.entries))
            elif isinstance(c, Acknowledge):
                acknowledged.append(c.entry_id)
            elif isinstance(c, AddsFailed):
                failed.update(c.entry_ids)
            elif isinstance(c, UpdateEnsemble):
                assert c.first_entry_id == w.last_add_confirmed + 1
                assert len(set(c.ensemble)) == e
                change = c

    for step in range(200):
        if w.state is WriterState.FAILED:
            break
        roll = rng.random()
        if roll < 0.2 and w.state is not WriterState.CLOSING:
            run(w.append(bytes([step % 256])))
        elif roll < 0.3 and w.state is not WriterState.CLOSING:
            run(w.append_many([bytes([step % 256, k]) for k in range(rng.randint(1, 4))]))
        elif roll < 0.4 and change is not None:
            if segments[-1][0] == change.first_entry_id:
                segments[-1] = (change.first_entry_id, change.ensemble)
            else:
                segments.append((change.first_entry_id, change.ensemble))
            c, change = change, None
            run(w.on_ensemble_changed(c.first_entry_id, c.ensemble))
        elif inflight:
            send = inflight.pop(rng.randrange(len(inflight)))
            fault = rng.random()
            if fault < 0.05:
                run(w.on_add_result(send.entry_id, send.bookie, None, writable_bookies=bookies))
            elif fault < 0.08:
                run(w.on_add_result(send.entry_id, send.bookie, S.IO_ERROR, writable_bookies=bookies))
            else:
                stored[send.bookie].add(send.entry_id)
                run(w.on_add_result(send.entry_id, send.bookie, S.OK))
        # invariants after every step
        assert acknowledged == list(range(len(acknowledged)))  # in order, no gaps
        assert w.last_add_confirmed == len(acknowledged) - 1
        assert not failed & set(acknowledged)
        for entry_id in acknowledged:  # every acknowledged entry sits on >= Qa bookies of its segment
            first, ensemble = max((s for s in segments if s[0] <= entry_id), key=lambda s: s[0])
            holders = [ensemble[i] for i in write_set_indexes(entry_id, e, qw) if entry_id in stored[ensemble[i]]]
            assert len(holders) >= qa, (seed, entry_id, segments, holders)


@pytest.mark.parametrize("seed", range(40))
def test_batched_answers_give_the_same_commands_as_one_by_one(seed):
    """on_add_results(bookie, ids, statuses) == on_add_result for each in turn (the broker's fast path)."""
    rng = random.Random(seed)
    e = rng.randint(3, 5)
    qw = rng.randint(2, e)
    qa = rng.randint(1, qw)
    one, many = writer(e, qw, qa, rng_seed=seed), writer(e, qw, qa, rng_seed=seed)
    outbox: dict[str, list[int]] = {}
    for _ in range(30):
        for c in one.append(b"p"):
            outbox.setdefault(c.bookie, []).append(c.entry_id)
        many.append(b"p")
    writable = B
    for bookie in sorted(outbox):
        ids = outbox[bookie]
        statuses = [rng.choice([S.OK] * 8 + [S.IO_ERROR, None]) for _ in ids]
        singles = []
        for entry_id, status in zip(ids, statuses):
            singles += one.on_add_result(entry_id, bookie, status, writable)
        assert many.on_add_results(bookie, ids, statuses, writable) == singles
        assert (one.state, one.last_add_confirmed) == (many.state, many.last_add_confirmed)
        if one.state is not WriterState.WRITING:
            break


def expand(commands):
    """(bookie, entry id, entry bytes, recovery) of every SendAdd, and of every entry of every SendAdds."""
    out = []
    for c in commands:
        if isinstance(c, SendAdd):
            out.append((c.bookie, c.entry_id, c.entry, c.recovery))
        elif isinstance(c, SendAdds):
            assert len(c.entry_ids) == len(c.entries) and c.entry_ids == sorted(c.entry_ids)
            out += [(c.bookie, i, entry, c.recovery) for i, entry in zip(c.entry_ids, c.entries)]
    return out


def state_of(w):
    return (w.state, w.last_add_confirmed, w.last_add_pushed, w.length, w.confirmed_length, w.ensemble,
            [(p.entry_id, p.entry, p.length, p.sent, sorted(p.acked)) for p in w._pending.values()])


@pytest.mark.parametrize("seed", range(60))
def test_appending_a_batch_sends_the_same_entries_and_leaves_the_same_state_as_one_by_one(seed):
    """append_many(payloads) == append() of each in turn: the same entries (bytes, ids, LAC and length
    piggybacked) to the same bookies in the same order per bookie, and the same writer state; also while an
    ensemble change is pending (nothing sent then; the change's end sends both writers' waiting entries alike)."""
    rng = random.Random(seed)
    e = rng.randint(1, 5)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    one, many = writer(e, qw, qa, rng_seed=seed), writer(e, qw, qa, rng_seed=seed)
    pending_change: UpdateEnsemble | None = None
    for step in range(12):
        payloads = [bytes([step, k]) * rng.randint(1, 3) for k in range(rng.randint(1, 6))]
        singles = []
        for payload in payloads:
            singles += one.append(payload)
        batched = many.append_many(payloads)
        for bookie in B:
            assert [x for x in expand(batched) if x[0] == bookie] == [x for x in expand(singles) if x[0] == bookie]
        assert not [c for c in batched if not isinstance(c, SendAdds)]
        assert state_of(many) == state_of(one)
        many.check_invariants()
        if one.state is WriterState.WRITING and rng.random() < 0.5:  # acknowledge the oldest entry everywhere
            head = one.last_add_confirmed + 1
            for bookie in B[:e]:
                assert acks(one.on_add_result(head, bookie, S.OK)) == acks(many.on_add_result(head, bookie, S.OK))
        elif one.state is WriterState.WRITING and e < len(B) and rng.random() < 0.3:  # a bookie fails: a change
            bookie = rng.choice(one.ensemble)
            change = one.on_add_result(one.last_add_pushed, bookie, S.IO_ERROR, B)
            assert change == many.on_add_result(many.last_add_pushed, bookie, S.IO_ERROR, B)
            pending_change = next((c for c in change if isinstance(c, UpdateEnsemble)), None)
        elif pending_change is not None and rng.random() < 0.5:
            first, ensemble, pending_change = pending_change.first_entry_id, pending_change.ensemble, None
            assert expand(one.on_ensemble_changed(first, ensemble)) == expand(many.on_ensemble_changed(first, ensemble))
        assert state_of(many) == state_of(one)
        many.check_invariants()


def _corrupt_lac_above_lap(w):
    w.last_add_confirmed = w.last_add_pushed + 1


def _corrupt_lac_backwards(w):
    w.check_invariants()
    w.last_add_confirmed -= 1
    w._pending.clear()  # LAC - 1 .. LAP would be pending: only the step backwards is wrong


def _corrupt_lost_pending_add(w):
    del w._pending[w.last_add_pushed]


def _corrupt_ack_outside_write_set(w):
    w._pending[w.last_add_confirmed + 1].acked.add(2)  # entry 1's write set is {1} with E=3, Qw=1


def _corrupt_head_complete_but_held(w):
    w._pending[w.last_add_confirmed + 1].acked.add(1)


def _corrupt_duplicate_bookie(w):
    w.ensemble = ("b0", "b0", "b2")


@pytest.mark.parametrize("corrupt, invariant", [
    (_corrupt_lac_above_lap, "LacBelowLap"), (_corrupt_lac_backwards, "LacOnlyAdvances"),
    (_corrupt_lost_pending_add, "PendingInOrder"), (_corrupt_ack_outside_write_set, "AcksFromWriteSet"),
    (_corrupt_head_complete_but_held, "AcknowledgeAtQuorum"), (_corrupt_duplicate_bookie, "EnsembleShape")])
def test_check_invariants_catches_a_corrupted_writer(corrupt, invariant):
    w = writer(e=3, qw=1, qa=1)
    for p in (b"0", b"1", b"2"):
        w.append(p)
    w.on_add_result(0, "b0", S.OK)  # LAC 0; entries 1 and 2 pending
    w.check_invariants()
    corrupt(w)
    with pytest.raises(InvariantError, match=f"invariant {invariant} broken") as caught:
        w.check_invariants()
    assert caught.value.invariant == invariant and "ledger 7 writer" in str(caught.value)
