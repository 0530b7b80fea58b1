"""Bookie status codes (PROTOCOL.md §2.1). Values match proto/bookie.proto's StatusCode enum."""
from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    OK = 0
    NO_LEDGER = 1  # explicit negative: this bookie never durably held the ledger
    NO_ENTRY = 2  # explicit negative: this bookie never durably held the entry
    FENCED = 3
    UNAUTHORIZED = 4
    READ_ONLY = 5
    TOO_MANY_REQUESTS = 6
    IO_ERROR = 7  # the truth is unknown (corrupt or unreadable storage): never a "no"
    BAD_REQUEST = 8
    UNKNOWN_STATE = 9  # the bookie cannot say: a ledger that may predate its format (limbo): never a "no"


# Explicit negatives: the only answers that count toward "this entry does not exist" (PROTOCOL.md §4 step 4).
EXPLICIT_NEGATIVES = frozenset({StatusCode.NO_LEDGER, StatusCode.NO_ENTRY})
# Answers to a fencing read that mean the fence is durable on the bookie. UNKNOWN_STATE is among them: a
# bookie fences a limbo ledger like any other and only declines to say whether it lacks the entry asked for.
FENCE_CONFIRMED = frozenset({StatusCode.OK, StatusCode.NO_ENTRY, StatusCode.NO_LEDGER, StatusCode.UNKNOWN_STATE})


# Add flags and read flags (bit values, shared by wire and journal).
FLAG_RECOVERY_ADD = 0x1
FLAG_FENCE = 0x1
