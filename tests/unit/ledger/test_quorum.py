"""Quorum arithmetic, checked against brute force over every small configuration."""
from __future__ import annotations

import itertools

import pytest

from bksim.ledger.quorum import (QuorumError, check_quorum_sizes, covered, negatives_needed_for_absence,
                                 write_set_indexes)

CONFIGS = [(e, w, a) for e in range(1, 6) for w in range(1, e + 1) for a in range(1, w + 1)]


def test_write_sets_stripe_round_robin():
    assert write_set_indexes(0, 3, 2) == [0, 1]
    assert write_set_indexes(2, 3, 2) == [2, 0]
    assert write_set_indexes(7, 5, 3) == [2, 3, 4]
    for e, w, _ in CONFIGS:  # every bookie holds the same share over E consecutive entries
        counts = [0] * e
        for entry_id in range(e):
            for i in write_set_indexes(entry_id, e, w):
                counts[i] += 1
        assert counts == [w] * e


@pytest.mark.parametrize("sizes", [(2, 3, 1), (3, 2, 3), (3, 3, 0), (0, 0, 0)])
def test_bad_quorum_sizes_are_rejected(sizes):
    with pytest.raises(QuorumError, match="ensemble >= write quorum >= ack quorum >= 1"):
        check_quorum_sizes(*sizes)


@pytest.mark.parametrize("e, w, a", CONFIGS)
def test_coverage_means_no_write_set_can_still_reach_ack_quorum(e, w, a):
    """Brute force: covered(unknown) iff no entry's write set has >= Qa bookies outside the known set."""
    for r in range(e + 1):
        for unknown in itertools.combinations(range(e), r):
            unknown = set(unknown)
            some_write_set_can_ack = any(
                len([i for i in write_set_indexes(entry_id, e, w) if i in unknown]) >= a for entry_id in range(e))
            assert covered(e, w, a, unknown) == (not some_write_set_can_ack), (e, w, a, unknown)


@pytest.mark.parametrize("e, w, a", CONFIGS)
def test_absence_threshold_leaves_fewer_than_qa_possible_acks(e, w, a):
    needed = negatives_needed_for_absence(w, a)
    assert w - needed < a  # the rest of the write set is too small to have acknowledged the entry
    assert w - (needed - 1) >= a  # one negative fewer would not prove absence
