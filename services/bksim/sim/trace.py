"""The trace of a simulation run: one text line per operation, fault and outcome, stamped with virtual time.

Invariant: a trace holds only what the seed decides (virtual times, ids, statuses, byte counts, messages
built from those), never addresses, wall times or garbage-collection timing, so one seed gives one
byte-identical trace and `digest()` can compare runs.
"""
from __future__ import annotations

import hashlib
from typing import Callable


class Trace:
    def __init__(self, now_ms: Callable[[], float]) -> None:
        self._now_ms = now_ms
        self.lines: list[str] = []

    def add(self, text: str) -> None:
        self.lines.append(f"{self._now_ms():12.3f} {text}")

    def note(self, text: str) -> None:
        """A line without a time stamp (the plan, headings)."""
        self.lines.append(text)

    def digest(self) -> str:
        """SHA-256 of the whole trace (hex)."""
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode())
            h.update(b"\n")
        return h.hexdigest()

    def tail(self, n: int) -> list[str]:
        return self.lines[-n:]
