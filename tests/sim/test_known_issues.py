"""Known engine issues (bksim.sim.known_issues) and the tolerance mechanism.

Each known issue must still reproduce with its seed when nothing is tolerated (when bookie/ is fixed, this
fails: move the seed to test_regressions.py and delete the entry). The mechanism itself is checked with a
deliberately broken engine: a tolerated invariant is recorded and the run goes on; an untolerated one ends it.
"""
from __future__ import annotations

from bksim.formats import journal as jfmt
from bksim.sim.bookie_scenario import run_bookie_sim
from bksim.sim.known_issues import KNOWN_ENGINE_ISSUES, KNOWN_INVARIANTS


def test_every_known_issue_still_reproduces_with_its_seed():
    assert KNOWN_INVARIANTS == frozenset(KNOWN_ENGINE_ISSUES)
    for invariant, (seed, what) in sorted(KNOWN_ENGINE_ISSUES.items()):
        strict = run_bookie_sim(seed)
        assert strict.violation is not None and strict.violation.invariant == invariant, (
            f"seed {seed} no longer shows {invariant} ({strict.violation}): if bookie/ was fixed, move the seed "
            f"to tests/sim/test_regressions.py and delete the entry from KNOWN_ENGINE_ISSUES")


def test_a_tolerated_invariant_is_recorded_and_the_run_goes_on(monkeypatch):
    # a deliberately broken engine: the FENCE record is journaled as padding, which replay skips
    monkeypatch.setattr(jfmt, "fence_record", lambda ledger_id: jfmt.encode_record(
        jfmt.RecordType.PADDING, 0, jfmt.LEDGER_ID.pack(ledger_id)))
    strict = run_bookie_sim(1)
    assert strict.violation is not None and strict.violation.invariant == "AcknowledgedFenceHolds"
    assert strict.trace[-1].endswith(f"VIOLATION {strict.violation}")
    tolerant = run_bookie_sim(1, tolerated=frozenset({"AcknowledgedFenceHolds"}))
    assert tolerant.passed and tolerant.tolerated
    assert all(v.startswith("AcknowledgedFenceHolds: ") for v in tolerant.tolerated)
    assert any(line.endswith("TOLERATED (known engine issue) " + tolerant.tolerated[0]) for line in tolerant.trace)
    assert tolerant.trace[-1].endswith(f"PASS with {len(tolerant.tolerated)} tolerated violations of known "
                                       f"engine issues")
    assert len(tolerant.trace) > len(strict.trace)  # the tolerant run went on to its end
