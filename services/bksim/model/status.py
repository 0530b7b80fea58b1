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
    UNKNOWN_STATE = 9


# Add flags and read flags (bit values, shared by wire and journal).
FLAG_RECOVERY_ADD = 0x1
FLAG_FENCE = 0x1
