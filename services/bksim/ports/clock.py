"""Time is an input: the storage engine and protocol code read time only through a Clock."""
from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def monotonic_ms(self) -> float:
        """Milliseconds on a clock that never goes backwards (for deadlines and intervals)."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch (for ctime-style facts only, never for ordering)."""

    async def sleep_ms(self, ms: float) -> None:
        """Suspend the calling task for `ms` milliseconds."""
