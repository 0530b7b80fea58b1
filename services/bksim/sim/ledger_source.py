"""SimLedgerSource: a simulator fake of the metadata store's ledger listing (bookie/gc.py LedgerSource), the
one the garbage collector compares the bookie's ledgers against in the garbage-collection world.

Owns the set of ledgers the metadata store holds (the workload creates a ledger here before writing it and
deletes ledgers here; ids are never reused) and the store's faults, drawn from the rng it is given:
- a listing that fails before answering (a connection loss);
- a listing that breaks off midway, after some pages (a connection loss in the middle of the walk);
- a listing that lags: it answers up to `lag_ms_max` later with the ledgers the store held when it was asked,
  so a ledger created (and written) while it runs is missing from the answer, and a ledger deleted meanwhile
  is still in it;
- a stale listing (only with `stale_ms_max` > 0, which the plan sets only when the collector verifies its
  candidates): half the listings answer with the state the store had up to `stale_ms_max` before they were asked
  (a ZooKeeper server behind the leader). The garbage collector reads its local ledgers and its generation right
  before it lists, so a ledger created and written before the round began and missing from such an answer is a
  candidate the generation rule does not protect: only verification (a fresh read of each candidate) does;
- a verification read (`ledger_exists`) that fails; when it answers, it answers the state now.
Every failure raises ConnectionLossError ("simulated" in its message): never an empty or short answer.

`on_listing()` is called at the start of each listing, synchronously with the garbage collector's generation
read, and `on_absent(ledger_id)` when a verification read answers that a ledger is gone; the world records both
(gc_checks: which rounds could delete what).

Must not: answer a failure as an absence, or use randomness from anything but its rng.
"""
from __future__ import annotations

import collections
import random
from typing import Callable

from bksim.model.errors import ConnectionLossError
from bksim.ports.clock import Clock

READ_MS_MAX = 0.5  # one metadata read (a verification, a failed listing's round trip): uniform in [0, this]
STATES_KEPT = 1024  # past states a stale listing may answer from (each create or delete adds one)
STALE_PROBABILITY = 0.5  # of a listing, when stale answers are on
FAILURE_MARK = "simulated"


class SimLedgerSource:
    def __init__(self, rng: random.Random, clock: Clock, note: Callable[[str], None],
                 on_listing: Callable[[], int], *, on_absent: Callable[[int], None] = lambda ledger_id: None,
                 failure_probability: float, partial_probability: float,
                 page_ledgers: int, lag_ms_max: float, exists_failure_probability: float,
                 stale_ms_max: float = 0.0) -> None:
        self._rng, self._clock, self._note, self._on_listing, self._on_absent = rng, clock, note, on_listing, on_absent
        self._failure_probability, self._partial_probability = failure_probability, partial_probability
        self._page_ledgers, self._lag_ms_max = page_ledgers, lag_ms_max
        self._exists_failure_probability = exists_failure_probability
        self._stale_ms_max = stale_ms_max
        self.present: set[int] = set()
        self._states: collections.deque[tuple[float, frozenset[int]]] = collections.deque(
            [(clock.monotonic_ms(), frozenset())], maxlen=STATES_KEPT)  # (since, ledgers), oldest first
        self.faults = True  # False in the liveness phase: every answer complete and on time
        self.listings = 0
        self.failures = 0

    # -- the workload's side (the ledger writers and deleters) -------------------------------------------
    def create(self, ledger_id: int) -> None:
        assert ledger_id not in self.present, f"ledger {ledger_id} created twice"
        self.present.add(ledger_id)
        self._states.append((self._clock.monotonic_ms(), frozenset(self.present)))

    def delete(self, ledger_id: int) -> None:
        self.present.discard(ledger_id)
        self._states.append((self._clock.monotonic_ms(), frozenset(self.present)))

    def _state_at(self, at_ms: float) -> frozenset[int]:
        found = self._states[0][1]
        for since, ledgers in self._states:
            if since > at_ms:
                break
            found = ledgers
        return found

    # -- LedgerSource -------------------------------------------------------------------------------------
    async def ledger_ids(self) -> list[int]:
        self.listings += 1
        n = self.listings
        tick = self._on_listing()
        snapshot = sorted(self.present)  # the store's state when asked: the answer lags behind what follows
        r = self._rng
        stale_ms = 0.0
        if self.faults and self._stale_ms_max > 0 and r.random() < STALE_PROBABILITY:
            stale_ms = r.uniform(0.0, self._stale_ms_max)
            snapshot = sorted(self._state_at(self._clock.monotonic_ms() - stale_ms))
        if self.faults and r.random() < self._failure_probability:
            await self._clock.sleep_ms(r.uniform(0.0, READ_MS_MAX))
            self._fail(f"listing #{n} (tick {tick}) failed before answering")
        cut = r.randrange(len(snapshot) + 1) if self.faults and r.random() < self._partial_probability else None
        lag_ms = r.uniform(0.0, self._lag_ms_max) if self.faults else 0.0
        pages = max(1, -(-len(snapshot) // self._page_ledgers))
        for page in range(pages):
            if cut is not None and page * self._page_ledgers >= cut:
                self._fail(f"listing #{n} (tick {tick}) broke off after {page * self._page_ledgers} of "
                           f"{len(snapshot)} ledgers")
            await self._clock.sleep_ms(lag_ms / pages)
        self._note(f"metadata: listing #{n} (tick {tick}) answers {len(snapshot)} ledgers as of "
                   + (f"{stale_ms:.2f} ms before then" if stale_ms else "then") + f", {lag_ms:.2f} ms later")
        return snapshot

    async def ledger_exists(self, ledger_id: int) -> bool:
        r = self._rng
        await self._clock.sleep_ms(r.uniform(0.0, READ_MS_MAX))
        if self.faults and r.random() < self._exists_failure_probability:
            self._fail(f"verification read of ledger {ledger_id} failed")
        if ledger_id in self.present:
            return True
        self._on_absent(ledger_id)
        return False

    def _fail(self, what: str) -> None:
        self.failures += 1
        self._note(f"metadata: {what}")
        raise ConnectionLossError("/ledgers", f"{FAILURE_MARK}: {what}")
