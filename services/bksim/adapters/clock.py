"""The real clock (ports.clock.Clock)."""
from __future__ import annotations

import asyncio
import time


class SystemClock:
    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    def wall_ms(self) -> int:
        return int(time.time() * 1000)

    async def sleep_ms(self, ms: float) -> None:
        await asyncio.sleep(ms / 1000.0)
