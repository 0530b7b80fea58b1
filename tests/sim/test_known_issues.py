"""Each known engine issue (bksim.sim.known_issues) pinned to the seed that shows it: a strict run of that
seed (nothing tolerated) must violate exactly that invariant.

When bookie/ is fixed, the matching test here fails: then delete the entry in KNOWN_ENGINE_ISSUES and
its test, and the sweeps check the invariant strictly again.
"""
from __future__ import annotations

import pytest

from bksim.sim.bookie_scenario import run_bookie_sim
from bksim.sim.known_issues import KNOWN_ENGINE_ISSUES


@pytest.mark.parametrize("invariant", sorted(KNOWN_ENGINE_ISSUES))
def test_the_known_issue_still_reproduces_with_its_seed(invariant):
    seed, what = KNOWN_ENGINE_ISSUES[invariant]
    strict = run_bookie_sim(seed)
    assert strict.violation is not None and strict.violation.invariant == invariant, (
        f"seed {seed} no longer shows {invariant} ({strict.violation}): if bookie/ was fixed, remove the "
        f"entry from bksim.sim.known_issues.KNOWN_ENGINE_ISSUES and this parameter")
    tolerant = run_bookie_sim(seed, tolerated=frozenset({invariant}))
    assert any(v.startswith(invariant) for v in tolerant.tolerated)
    assert tolerant.violation is None or tolerant.violation.invariant != invariant
