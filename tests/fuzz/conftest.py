"""Hypothesis profiles of the fuzz tests (tests/fuzz/), chosen by BKSIM_FUZZ_PROFILE (default `ci`).

- `ci` (what `make test` runs): derandomize=True, so every run draws the same examples (a failure replays
  as is); FUZZ_CI_EXAMPLES examples per test, sized so the whole directory takes well under a minute on
  2 cores; no example database (nothing is written outside the tree); the too_slow health check off,
  because a loaded CI machine is slow, not the parser.
- `long` (`make fuzz`): random seeds, FUZZ_EXAMPLES examples per test (default 20,000), no example database
  either; a failure prints its `@reproduce_failure` blob, and the example it shrank to becomes an `@example`
  of its test once the parser is fixed.

Both keep a per-example deadline: a parser that loops or backtracks on hostile bytes fails the test instead
of hanging it (DEADLINE_MS is far above any parser's time on these sizes, so load does not trip it).
"""
from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

FUZZ_CI_EXAMPLES = 400
FUZZ_LONG_EXAMPLES_DEFAULT = 20_000
DEADLINE_MS = 2_000

settings.register_profile("ci", max_examples=FUZZ_CI_EXAMPLES, derandomize=True, database=None,
                          deadline=timedelta(milliseconds=DEADLINE_MS), print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", FUZZ_LONG_EXAMPLES_DEFAULT))
settings.register_profile("long", max_examples=FUZZ_EXAMPLES, derandomize=False, database=None,
                          deadline=timedelta(milliseconds=DEADLINE_MS), print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("BKSIM_FUZZ_PROFILE", "ci"))
