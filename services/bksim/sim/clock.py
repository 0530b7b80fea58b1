"""SimClock (ports.clock.Clock) over the virtual time of the running SimLoop.

monotonic_ms is the loop's virtual time; wall_ms is a fixed epoch plus it (so a run's wall times are the
same for every run of a seed); sleep_ms is asyncio.sleep on the virtual loop (it costs no real time).
"""
from __future__ import annotations

import asyncio

from bksim.sim.loop import SimLoop, SimulationError

# 2024-01-01T00:00:00Z: the wall time at virtual time 0 (any fixed value works; fixed keeps traces equal)
WALL_EPOCH_MS = 1_704_067_200_000


class SimClock:
    def __init__(self, loop: SimLoop | None = None) -> None:
        self._loop = loop

    def _sim_loop(self) -> SimLoop:
        loop = self._loop or asyncio.get_running_loop()
        if not isinstance(loop, SimLoop):
            raise SimulationError("SimClock needs a SimLoop (run the code with bksim.sim.loop.run)")
        return loop

    def monotonic_ms(self) -> float:
        return self._sim_loop().time() * 1000.0

    def wall_ms(self) -> int:
        return WALL_EPOCH_MS + int(self._sim_loop().time() * 1000.0)

    async def sleep_ms(self, ms: float) -> None:
        await asyncio.sleep(max(0.0, ms) / 1000.0)
