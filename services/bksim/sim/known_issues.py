"""Engine issues the simulator found that are not fixed yet: invariant name -> what is wrong, where, and a
seed that shows it (`bksim sim --seed N`).

`bksim sim --tolerate-known` and the test sweep record violations of these invariants as TOLERATED instead
of stopping the run, so everything else in every run is still checked. tests/sim/test_known_issues.py pins
each one to its seed: when the engine is fixed, that test fails; then delete the entry here and its test.
Plain `bksim sim` / `make sim` / `make sim-sweep` tolerate nothing.
"""
from __future__ import annotations

KNOWN_ENGINE_ISSUES: dict[str, tuple[int, str]] = {
    "LacMonotonicAcrossRestarts": (4, (
        "bookie/engine.py: after a restart, _lac[L] is filled only from replayed journal records and from new "
        "adds (_note_lac), and _known_lac() consults the last stored entry only when _lac has no value for L; "
        "so a replayed or newly added older entry (a RECOVERY_ADD write-back, a resend) makes ReadLac/ReadEntry "
        "answer that entry's LAC, below the LAC of the last durable entry the bookie answered before the "
        "crash")),
    "CleanStopSucceeds": (24, (
        "bookie/engine.py close() cancels a running 'checkpoint-now' task; cancelled inside "
        "EntryLogger._start_log (bookie/entry_log.py) after create() and before _log_id is advanced, it "
        "leaves the new log file behind, so close()'s own checkpoint rolls into the same id and fails with "
        "FileExistsError: close() raises and the lastmark is not persisted. Any failure inside _start_log "
        "(e.g. an fsync error) leaves the same state: every later roll fails")),
    "LacFromDamagedEntry": (342, (
        "bookie/engine.py _known_lac(): when the engine holds no LAC in memory for a ledger (after a restart, "
        "or while every add carried LAC -1) it parses the LAC from the last stored entry, read back from the "
        "entry log without verifying its digest; a bit flip in that entry's LAC field is then served as the "
        "ledger's known LAC (ReadLac / ReadEntry), where PROTOCOL.md §2.1 wants IO_ERROR for what the bookie "
        "cannot trust (also seed 469, without a restart)")),
}

KNOWN_INVARIANTS = frozenset(KNOWN_ENGINE_ISSUES)
