"""CursorState (topics/cursor_state.py): the ack rules of PROTOCOL.md §5 over a FakeLayout, and the bitmap
helpers against a naive model."""
from __future__ import annotations

import random

import pytest

from bksim.model.invariants import InvariantError
from bksim.model.status import TopicStatus
from bksim.topics import cursor_state as cs
from bksim.topics.cursor_state import CursorState
from bksim.topics.errors import TopicError
from bksim.topics.positions import Position as P
from fakes.layout import FakeLayout
from helpers import checked

MUTATORS = ("__init__", "ack", "ack_cumulative", "expire_until", "seek", "rewind", "ack_batch_indexes",
            "increment_redelivery", "set_property", "restore")


@pytest.fixture(autouse=True)
def checked_after_each_operation(monkeypatch):
    """Every operation of every test here is followed by CursorState.check_invariants()."""
    for name in MUTATORS:
        monkeypatch.setattr(CursorState, name, checked(getattr(CursorState, name)))
    read_position = CursorState.read_position
    monkeypatch.setattr(CursorState, "read_position", property(read_position.fget, checked(read_position.fset)))


def state(ledgers=((10, 5), (11, 0), (12, 4), (13, 3)), md=None, **kw) -> tuple[CursorState, FakeLayout, list[str]]:
    layout = FakeLayout(list(ledgers))
    logs: list[str] = []
    s = CursorState(layout, md or layout.previous_position(layout.first_position()),
                    redelivery_counts_max=kw.pop("redelivery_counts_max", 100), log=logs.append, name="sub", **kw)
    return s, layout, logs


def check_invariants(s: CursorState) -> None:
    """CursorState.check_invariants(), and the same facts again bit by bit against the layout."""
    s.check_invariants()
    md = s.mark_delete
    total = 0
    for ledger in s.acked_ledgers():
        bits = s.ledger_bits(ledger)
        for e in range(len(bits) * 8):
            if bits[e >> 3] >> (e & 7) & 1:
                assert P(ledger, e) > md, f"bit {ledger}:{e} set at or below mark-delete {md}"
                assert s.layout.contains(P(ledger, e))
                total += 1
    assert total == s.acked_count
    nxt = s.layout.next_position(md)
    assert not (s.layout.contains(nxt) and s.is_acked(nxt) and nxt > md), f"did not slide over {nxt}"
    assert s.read_position > md


# ---------------------------------------------------------------------------------------------- individual acks
def test_individual_acks_leave_holes_until_the_first_gap_is_acked():
    s, _, _ = state()
    assert s.mark_delete == P(10, -1) and s.read_position == P(10, 0)
    assert s.ack([P(10, 1), P(10, 3)]) == 2
    assert s.mark_delete == P(10, -1) and s.acked_count == 2
    assert [(str(a), str(b)) for a, b in s.ranges()] == [("10:0", "10:1"), ("10:2", "10:3")]
    assert s.ack([P(10, 0)]) == 1  # the first unacked: slides over 10:1
    assert s.mark_delete == P(10, 1) and s.acked_count == 1
    check_invariants(s)
    assert s.ack([P(10, 2)]) == 1
    assert s.mark_delete == P(10, 3) and s.acked_count == 0
    assert s.ack([P(10, 2), P(10, 0)]) == 0  # at or below mark-delete: no-op
    check_invariants(s)


def test_sliding_crosses_ledger_boundaries_and_skips_empty_ledgers():
    s, _, _ = state()
    s.ack([P(12, 0), P(12, 1), P(12, 3), P(10, 1), P(10, 2), P(10, 3), P(10, 4)])
    assert s.mark_delete == P(10, -1)
    s.ack([P(10, 0)])
    # 10:0..10:4 acked, ledger 11 is empty, 12:0 and 12:1 acked, 12:2 is the first hole
    assert s.mark_delete == P(12, 1)
    assert s.acked_ledgers() == [12] and s.acked_count == 1
    s.ack([P(12, 2)])
    assert s.mark_delete == P(12, 3)
    check_invariants(s)


def test_sliding_stops_at_the_end_of_the_current_ledger_and_resumes_when_it_grows():
    s, layout, _ = state([(10, 3)])
    s.ack([P(10, 0), P(10, 1), P(10, 2)])
    assert s.mark_delete == P(10, 2) and s.read_position == P(10, 3)
    layout.add_entries(2)
    with pytest.raises(TopicError):
        s.ack([P(10, 5)])
    s.ack([P(10, 4)])
    assert s.mark_delete == P(10, 2)
    s.ack([P(10, 3)])
    assert s.mark_delete == P(10, 4)
    layout.add_ledger(20, 2)
    s.ack([P(20, 0)])
    assert s.mark_delete == P(20, 0)


def test_invalid_ack_names_the_position_and_changes_nothing():
    s, _, _ = state()
    for bad in (P(10, 5), P(11, 0), P(99, 0), P(10, -1)):
        with pytest.raises(TopicError) as info:
            s.ack([P(10, 1), bad])
        assert info.value.status is TopicStatus.INVALID_ACK and str(bad) in info.value.message
    assert s.acked_count == 0 and not s.is_acked(P(10, 1))
    with pytest.raises(TopicError) as info:
        s.ack(["nonsense"])
    assert info.value.status is TopicStatus.INVALID_ACK


def test_acks_at_or_before_the_mark_delete_change_nothing_even_when_their_ledger_was_trimmed():
    s, layout, _ = state()
    assert s.ack_cumulative(P(10, 3))
    layout.trim(1)  # ledger 10 gone
    assert s.ack([P(10, 1), P(10, 3)]) == 0 and not s.ack_cumulative(P(10, 2))
    assert s.ack_batch_indexes(P(10, 0), [1], 4)
    assert s.mark_delete == P(10, 3) and s.acked_count == 0 and s.batch_count == 0
    for bad in (P(10, 4), P(10, -1)):  # after the mark-delete, or not a message: refused as before
        with pytest.raises(TopicError) as info:
            s.ack([bad])
        assert info.value.status is TopicStatus.INVALID_ACK
    check_invariants(s)


def test_backlog_counts_unacked_entries_up_to_the_last_confirmed():
    s, layout, _ = state()
    assert s.backlog() == 12
    s.ack([P(10, 2), P(12, 3), P(13, 0)])
    assert s.backlog() == 9
    s.ack_cumulative(P(12, 0))
    assert s.backlog() == 12 - 6 - 2  # 10:0..12:0 (6) and 12:3, 13:0
    layout.add_entries(4)
    assert s.backlog() == 8


# ---------------------------------------------------------------------------------------------- cumulative
def test_cumulative_ack_moves_forward_never_back_and_drops_state_below():
    s, _, _ = state()
    s.ack([P(10, 3), P(12, 1), P(12, 2)])
    s.increment_redelivery(P(10, 4))
    s.ack_batch_indexes(P(12, 0), [0], 3)
    assert s.ack_cumulative(P(12, 0)) is True
    # 12:0 acked cumulatively; 12:1, 12:2 were acked: slides to 12:2
    assert s.mark_delete == P(12, 2)
    assert s.acked_count == 0 and s.batch_count == 0 and s.redelivery_tracked == 0
    assert s.redelivery_count(P(10, 4)) == 0 and s.acked_batch_indexes(P(12, 0)) == []
    assert s.ack_cumulative(P(10, 1)) is False  # older: no-op
    assert s.mark_delete == P(12, 2)
    check_invariants(s)


def test_cumulative_ack_inside_a_ledger_keeps_later_acks_of_the_same_ledger():
    s, _, _ = state([(10, 40)])
    s.ack([P(10, e) for e in (5, 17, 18, 30)])
    s.increment_redelivery(P(10, 20))
    s.increment_redelivery(P(10, 3))
    s.ack_cumulative(P(10, 16))
    assert s.mark_delete == P(10, 18)
    assert s.acked_count == 1 and s.is_acked(P(10, 30)) and not s.is_acked(P(10, 29))
    assert s.redelivery_count(P(10, 20)) == 1 and s.redelivery_count(P(10, 3)) == 0
    check_invariants(s)


def test_cumulative_ack_with_properties_merges_them():
    s, _, _ = state()
    s.set_property("a", 1)
    s.ack_cumulative(P(10, 0), {"b": 2})
    s.ack_cumulative(P(10, 0), {"a": 3})  # no move, properties still merged
    assert s.properties == {"a": 3, "b": 2}
    with pytest.raises(TopicError):
        s.set_property("c", "x")
    with pytest.raises(TopicError):
        s.set_property("c", 1 << 63)


def test_expire_until_clamps_to_the_last_confirmed_entry():
    s, _, _ = state()
    assert s.expire_until(P(99, 7)) is True
    assert s.mark_delete == P(13, 2) and s.backlog() == 0
    assert s.expire_until(P(10, 0)) is False


def test_read_position_is_settable_never_at_or_below_mark_delete_and_rewinds():
    s, _, _ = state()
    s.read_position = P(12, 2)
    assert s.read_position == P(12, 2)
    s.ack_cumulative(P(10, 2))
    assert s.read_position == P(12, 2)
    s.read_position = P(10, 1)
    assert s.read_position == P(10, 3)
    s.read_position = P(12, 3)
    s.rewind()
    assert s.read_position == P(10, 3)
    s.ack_cumulative(P(12, 3))
    assert s.read_position == P(13, 0)  # moved along with mark-delete


# ---------------------------------------------------------------------------------------------- batches
def test_batch_index_acks_ack_the_entry_when_every_index_is_acked():
    s, _, _ = state()
    assert s.ack_batch_indexes(P(10, 0), [0, 2], 4) is False
    assert s.acked_batch_indexes(P(10, 0)) == [0, 2] and s.batch_count == 1
    assert not s.is_acked(P(10, 0))
    assert s.ack_batch_indexes(P(10, 0), [2], 4) is False
    assert s.ack_batch_indexes(P(10, 0), [1, 3], 4) is True
    assert s.is_acked(P(10, 0)) and s.mark_delete == P(10, 0) and s.batch_count == 0
    assert s.ack_batch_indexes(P(10, 0), [1], 4) is True  # already acked
    s.ack_batch_indexes(P(10, 2), [1], 2)
    s.ack([P(10, 2)])  # a whole-entry ack drops the partial mask
    assert s.batch_count == 0 and s.is_acked(P(10, 2))


def test_batch_index_acks_are_validated():
    s, _, _ = state()
    for indexes, size in (([4], 4), ([-1], 4), ([0], 0)):
        with pytest.raises(TopicError) as info:
            s.ack_batch_indexes(P(10, 1), indexes, size)
        assert info.value.status is TopicStatus.INVALID_ACK
    s.ack_batch_indexes(P(10, 1), [0], 4)
    with pytest.raises(TopicError) as info:
        s.ack_batch_indexes(P(10, 1), [1], 5)
    assert "batch of 4" in info.value.message
    with pytest.raises(TopicError):
        s.ack_batch_indexes(P(99, 1), [0], 4)


# ---------------------------------------------------------------------------------------------- redeliveries
def test_redelivery_counts_grow_and_vanish_with_the_ack():
    s, _, _ = state()
    assert [s.increment_redelivery(P(10, 1)) for _ in range(3)] == [1, 2, 3]
    assert s.redelivery_count(P(10, 1)) == 3 and s.redelivery_tracked == 1
    s.ack([P(10, 1)])
    assert s.redelivery_count(P(10, 1)) == 0 and s.redelivery_tracked == 0
    assert s.increment_redelivery(P(10, 1)) == 0  # acked: not counted


def test_redelivery_counts_at_the_bound_are_counted_and_logged_never_silent():
    s, _, logs = state([(10, 100)], redelivery_counts_max=3)
    for e in range(3):
        s.increment_redelivery(P(10, e))
    assert s.increment_redelivery(P(10, 0)) == 2  # tracked ones keep counting
    assert s.increment_redelivery(P(10, 50)) == 0
    assert s.redelivery_counts_untracked == 1 and s.redelivery_tracked == 3
    assert len(logs) == 1 and "topic.redelivery_counts_max" in logs[0] and "10:50" in logs[0]
    for e in range(51, 70):
        s.increment_redelivery(P(10, e))
    assert s.redelivery_counts_untracked == 20
    assert len(logs) == 2 and "10 redeliveries not counted" in logs[1]
    s.ack([P(10, 1)])  # room again
    assert s.increment_redelivery(P(10, 50)) == 1


# ---------------------------------------------------------------------------------------------- seek, restore
def test_seek_resets_everything_after_the_position():
    s, _, _ = state()
    s.ack([P(10, 0), P(10, 1), P(12, 2)])
    s.increment_redelivery(P(12, 3))
    s.ack_batch_indexes(P(13, 0), [0], 2)
    s.seek(P(10, 1))
    assert s.mark_delete == P(10, 0) and s.read_position == P(10, 1)
    assert s.acked_count == 0 and s.batch_count == 0 and s.redelivery_tracked == 0
    s.seek(P(12, 2))
    assert s.mark_delete == P(12, 1) and s.read_position == P(12, 2)
    s.seek(P(99, 0))  # beyond the end: latest
    assert s.mark_delete == P(13, 2) and s.backlog() == 0
    s.seek(P(1, 0))  # before the beginning: earliest
    assert s.mark_delete == P(10, -1) and s.backlog() == 12


def test_restore_drops_what_the_layout_no_longer_has_and_says_so():
    s, layout, _ = state()
    layout.trim(1)  # ledger 10 gone
    notes = s.restore(mark_delete=P(10, 2), acked={10: bytearray(b"\x18"), 12: bytearray(b"\x0a"),
                                                    77: bytearray(b"\x01"), 13: bytearray(b"\xf0")},
                      batches=[(P(12, 0), 3, 1)], redeliveries=[(P(12, 0), 4), (P(10, 4), 1)],
                      properties={"x": 1}, last_active=5)
    assert any("below the topic's first entry" in n for n in notes)
    assert any("ledger 77" in n for n in notes)
    assert any("beyond the 3 entries of ledger 13" in n for n in notes)
    assert s.mark_delete == P(12, -1)
    assert s.is_acked(P(12, 1)) and s.is_acked(P(12, 3)) and not s.is_acked(P(12, 2)) and not s.is_acked(P(13, 0))
    assert s.acked_batch_indexes(P(12, 0)) == [0] and s.redelivery_count(P(12, 0)) == 4
    assert s.properties == {"x": 1} and s.last_active == 5
    check_invariants(s)


# ---------------------------------------------------------------------------------------------- a model check
def test_random_acks_match_a_naive_model():
    rng = random.Random(4)
    for _ in range(30):
        ledgers = [(10 + i, rng.choice([0, 1, 7, 8, 9, 17, 40])) for i in range(rng.randint(1, 5))]
        s, layout, _ = state(ledgers)
        all_pos = [P(lg, e) for lg, n in ledgers for e in range(n)]
        acked: set = set()
        md_index = -1
        initial = s.mark_delete
        assert initial == layout.previous_position(layout.first_position())
        for _ in range(rng.randint(1, 80)):
            if not all_pos:
                break
            pos = rng.choice(all_pos)
            if rng.random() < 0.15:
                s.ack_cumulative(pos)
                md_index = max(md_index, all_pos.index(pos))
            else:
                s.ack([pos])
                acked.add(pos)
            while md_index + 1 < len(all_pos) and all_pos[md_index + 1] in acked:
                md_index += 1
            expected_md = all_pos[md_index] if md_index >= 0 else initial
            assert s.mark_delete == expected_md, (ledgers, s.mark_delete, expected_md)
            expected_after = {p for p in acked if all_pos.index(p) > md_index}
            assert s.acked_count == len(expected_after)
            assert all(s.is_acked(p) == (p in expected_after or all_pos.index(p) <= md_index) for p in all_pos)
            assert s.backlog() == len(all_pos) - md_index - 1 - len(expected_after)
            check_invariants(s)


def test_bitmap_helpers_match_a_naive_model():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 90)
        bits = bytearray(rng.getrandbits(8) if rng.random() < 0.7 else rng.choice([0, 255]) for _ in range((n + 7) // 8))
        model = [bool(bits[i >> 3] >> (i & 7) & 1) for i in range(len(bits) * 8)]
        i = rng.randint(0, len(bits) * 8 + 3)
        assert cs.first_zero(bits, i) == next((k for k in range(i, len(model)) if not model[k]), max(i, len(model)))
        assert cs.first_one(bits, i) == next((k for k in range(i, len(model)) if model[k]), -1)
        a, b = sorted(rng.randint(0, len(bits) * 8 + 2) for _ in range(2))
        assert cs.count_range(bits, a, b) == sum(model[a:b])
        runs = []
        k = 0
        while k < len(model):
            if model[k]:
                start = k
                while k < len(model) and model[k]:
                    k += 1
                runs.append((start, k))
            k += 1
        assert list(cs.runs(bits)) == runs and cs.run_count(bits) == len(runs)
        copy = bytearray(bits)
        assert cs.clear_range(copy, a, b) == sum(model[a:b])
        assert [bool(copy[i >> 3] >> (i & 7) & 1) for i in range(len(model))] == \
               [False if a <= k < b else m for k, m in enumerate(model)]
        grown = bytearray(bits)
        cs.set_range(grown, a, b + 5)
        assert all(grown[k >> 3] >> (k & 7) & 1 for k in range(a, b + 5))
        assert cs.count_range(grown, 0, a) == sum(model[:a])


# ---------------------------------------------------------------------------------------------- corrupted state
@pytest.mark.parametrize("corrupt, invariant", [
    (lambda s: s._bits[10].__setitem__(0, s._bits[10][0] | 1), "NothingAtOrBelowMarkDelete"),
    (lambda s: setattr(s, "_acked", s._acked + 1), "CountsConsistent"),
    (lambda s: s._bits[10].__setitem__(0, s._bits[10][0] | 0x04) or setattr(s, "_acked", s._acked + 1),
     "MarkDeleteSlid"),
    (lambda s: s._bits.setdefault(13, bytearray(1)).__setitem__(0, 0x80) or setattr(s, "_acked", s._acked + 1),
     "AcksInsideLedgers"),
    (lambda s: setattr(s, "_md", P(10, 0)), "MarkDeleteOnlyAdvances"),
    (lambda s: setattr(s, "_read", P(10, 1)), "ReadAfterMarkDelete"),
    (lambda s: s._batches[12].__setitem__(0, (3, 0b111)), "BatchMasksPartial"),
    (lambda s: s._redeliveries.setdefault(10, {}).__setitem__(3, 1) or setattr(s, "_redelivery_total", 2),
     "RedeliveriesUnacked")])
def test_check_invariants_catches_a_corrupted_state(corrupt, invariant):
    s, _, _ = state()
    s.ack([P(10, 0), P(10, 1), P(10, 3), P(12, 1)])  # mark-delete 10:1, 10:3 and 12:1 acked, 10:2 a hole
    s.ack_batch_indexes(P(12, 0), [0], 3)
    s.increment_redelivery(P(12, 2))
    assert s.mark_delete == P(10, 1)
    s.check_invariants()
    corrupt(s)
    with pytest.raises(InvariantError, match=f"invariant {invariant} broken") as caught:
        s.check_invariants()
    assert caught.value.invariant == invariant and "cursor sub" in str(caught.value)
