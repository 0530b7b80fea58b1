"""ManualClock: a NAMED FAKE of the Clock port (ports/clock.py) for unit tests; time is virtual.

Two ways to let time pass:
- `ManualClock()`: time moves only when the test calls `advance(ms)`; a sleeper wakes once its deadline has
  passed, so periodic tasks run exactly when the test says.
- `ManualClock(sleeps_advance=True)`: a sleep moves the clock on by its length and returns at the next loop
  turn, so code that waits out timeouts and backoffs runs at once (for tests that do not steer time).
Monotonic time starts at 0; wall time is a fixed epoch plus monotonic time.
"""
from __future__ import annotations

import asyncio

WALL_EPOCH_MS = 1_700_000_000_000


class ManualClock:
    def __init__(self, *, sleeps_advance: bool = False) -> None:
        self.now = 0.0
        self.sleeps_advance = sleeps_advance
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    def monotonic_ms(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return WALL_EPOCH_MS + int(self.now)

    async def sleep_ms(self, ms: float) -> None:
        if self.sleeps_advance:
            self.advance(max(0.0, float(-(-ms // 1))))
            await asyncio.sleep(0)
            return
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
