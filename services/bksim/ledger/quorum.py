"""Quorum arithmetic of the ledger protocol (PROTOCOL.md §0 and §4). Pure functions over ensemble indexes.

- write set of entry e: ensemble indexes (e + i) mod E for i in 0..Qw-1 (striping).
- an entry is complete at Qa acknowledgements from its write set.
- quorum coverage (fencing, LAC reads): in every window of Qw consecutive ensemble indexes, fewer than Qa
  bookies are still unknown. Then no writer can assemble Qa acks for any entry any more.
- absence (recovery read-forward): an entry is absent only when Qw - Qa + 1 bookies of its write set gave an
  explicit negative (NO_ENTRY / NO_LEDGER): then it cannot have reached Qa acks.
"""
from __future__ import annotations

from bksim.model.errors import BksimError


class QuorumError(BksimError):
    """Quorum sizes that break E >= Qw >= Qa >= 1."""


def check_quorum_sizes(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int) -> None:
    if not ensemble_size >= write_quorum_size >= ack_quorum_size >= 1:
        raise QuorumError(f"need ensemble >= write quorum >= ack quorum >= 1, got E={ensemble_size} "
                          f"Qw={write_quorum_size} Qa={ack_quorum_size}")


def write_set_indexes(entry_id: int, ensemble_size: int, write_quorum_size: int) -> list[int]:
    """Ensemble indexes that store `entry_id`, in the order the writer sends to them."""
    assert entry_id >= 0 and ensemble_size >= write_quorum_size >= 1
    return [(entry_id + i) % ensemble_size for i in range(write_quorum_size)]


def covered(ensemble_size: int, write_quorum_size: int, ack_quorum_size: int, unknown: set[int]) -> bool:
    """Quorum coverage: every window of Qw consecutive ensemble indexes has fewer than Qa unknown bookies.

    `unknown` = ensemble indexes without a reply, or whose reply was an error other than OK / NO_ENTRY /
    NO_LEDGER. (Windows wrap around: the window starting at index i is i, i+1, ... mod E.)
    """
    for start in range(ensemble_size):
        window = sum(1 for i in range(write_quorum_size) if (start + i) % ensemble_size in unknown)
        if window >= ack_quorum_size:
            return False
    return True


def negatives_needed_for_absence(write_quorum_size: int, ack_quorum_size: int) -> int:
    """How many explicit negatives from an entry's write set prove it was never acknowledged: Qw - Qa + 1."""
    return write_quorum_size - ack_quorum_size + 1
