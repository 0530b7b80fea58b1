"""Positions and message ids of the topic layer (PROTOCOL.md §5).

A *position* is (ledger id, entry id) inside one managed ledger. Ledger ids are global and not dense; entry
ids are dense per ledger from 0. Entry id -1 means "before the first entry of that ledger" and is used for
mark-delete positions. Positions order by (ledger, entry), which is the log order because a managed ledger's
ledgers are created in increasing id order.

A *message id* adds the partition index (-1 for a non-partitioned topic) and the batch index (-1 when the
entry holds a single message that is not a batch) — the same four fields as Pulsar's MessageIdData.
"""
from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    ledger: int
    entry: int

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}"

    @staticmethod
    def parse(text: str) -> "Position":
        """'12:7' -> Position(12, 7); ValueError naming the text otherwise."""
        try:
            ledger, entry = text.split(":")
            return Position(int(ledger), int(entry))
        except ValueError:
            raise ValueError(f"not a position 'LEDGER:ENTRY': {text!r}") from None


EARLIEST = Position(-1, -1)  # before everything


class MessageId(NamedTuple):
    ledger: int
    entry: int
    partition: int = -1
    batch_index: int = -1

    @property
    def position(self) -> Position:
        return Position(self.ledger, self.entry)

    def __str__(self) -> str:
        text = f"{self.ledger}:{self.entry}:{self.partition}"
        return text if self.batch_index < 0 else f"{text}:{self.batch_index}"
