"""InvariantError: a state machine found itself in a state its own docstring rules out.

Raised by the `check_invariants()` methods of the pure state machines (the ledger writer and recovery, the
cursor state). It is an AssertionError, not a BksimError: it is a bug in the code, never an answer to a
caller, so no handler of domain errors swallows it. The message names the owner, the invariant and the
values that break it.
"""
from __future__ import annotations


class InvariantError(AssertionError):
    def __init__(self, owner: str, invariant: str, detail: str) -> None:
        super().__init__(f"{owner}: invariant {invariant} broken: {detail}")
        self.owner, self.invariant, self.detail = owner, invariant, detail
