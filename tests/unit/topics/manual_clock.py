"""ManualClock: a NAMED FAKE of the Clock port for unit tests: time moves only when the test calls advance();
sleepers wake when their deadline has passed (so periodic tasks run exactly when the test says)."""
from __future__ import annotations

import asyncio


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    def monotonic_ms(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return 1_700_000_000_000 + int(self.now)

    async def sleep_ms(self, ms: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + ms, future))
        await future

    def advance(self, ms: float) -> None:
        self.now += ms
        for item in list(self._sleepers):
            if item[0] <= self.now and not item[1].done():
                item[1].set_result(None)
                self._sleepers.remove(item)

    @property
    def sleepers(self) -> int:
        return len(self._sleepers)
