"""A token bucket over the Clock port: the byte-rate limits of background copies (autorecovery's re-replication,
the bookie's compaction) so that foreground traffic keeps its latency."""
from __future__ import annotations

from bksim.ports.clock import Clock


class TokenBucket:
    """At most `rate_per_s` units a second on average, bursts of up to `burst`: `take(n)` returns at once while
    tokens last and otherwise sleeps (on the Clock) until the debt it leaves is paid; one sleep per take."""

    def __init__(self, clock: Clock, rate_per_s: float, burst: float) -> None:
        assert rate_per_s > 0 and burst > 0
        self._clock = clock
        self._rate_per_ms = rate_per_s / 1000.0
        self._burst = burst
        self._tokens = burst
        self._at_ms = clock.monotonic_ms()
        self.slept_ms = 0.0  # total time spent waiting (statistics, tests)

    async def take(self, amount: float) -> None:
        now = self._clock.monotonic_ms()
        self._tokens = min(self._burst, self._tokens + (now - self._at_ms) * self._rate_per_ms)
        self._at_ms = now
        self._tokens -= amount
        if self._tokens < 0:
            wait_ms = -self._tokens / self._rate_per_ms
            self.slept_ms += wait_ms
            await self._clock.sleep_ms(wait_ms)
