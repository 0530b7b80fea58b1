"""Every test here checks the invariants of the ledger state machines after each operation.

`checked_after_each_event` (autouse) wraps the constructor and every event method of LedgerWriter and
LedgerRecovery so that `check_invariants()` runs when the call returns (or raises): a state that breaks an
invariant of their docstrings fails the test that reached it, whatever that test asserts itself.
"""
from __future__ import annotations


import pytest

from bksim.ledger.recovery import LedgerRecovery
from bksim.ledger.writer import LedgerWriter
from helpers import checked

WRITER_EVENTS = ("__init__", "append", "append_existing", "on_add_result", "on_add_results", "on_ensemble_changed",
                 "on_ensemble_change_rejected", "close", "on_closed", "abort")
RECOVERY_EVENTS = ("__init__", "start_recovery", "on_read_result", "forward", "on_closed")


@pytest.fixture(autouse=True)
def checked_after_each_event(monkeypatch):
    for cls, events in ((LedgerWriter, WRITER_EVENTS), (LedgerRecovery, RECOVERY_EVENTS)):
        for name in events:
            monkeypatch.setattr(cls, name, checked(getattr(cls, name)))
