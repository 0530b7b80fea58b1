"""`bksim sim`: the deterministic simulation of one bookie's storage engine (bksim.sim.bookie_scenario).

`bksim sim --seed N [--steps K] [--trace]` prints the seed and every knob of its plan, runs it, and prints
PASS (with the trace digest: the same seed always gives the same one) or the violated invariant with the
tail of the trace and the lines that replay it. `bksim sim --sweep N [--from S]` runs N seeds with a
progress line and a summary that lists every failure with its replay command.

Exit status: 0 every run passed, 1 an invariant was violated, 2 bad arguments.
`--tolerate-known` records violations of the known engine issues (bksim.sim.known_issues) as TOLERATED
instead of failing, so the rest of each run is still checked.
"""
from __future__ import annotations

import collections
import sys
import time

from bksim.model.errors import ConfigError
from bksim.sim.bookie_scenario import SimResult, run_bookie_sim
from bksim.sim.known_issues import KNOWN_ENGINE_ISSUES, KNOWN_INVARIANTS
from bksim.sim.plan import STEPS_DEFAULT, BookiePlan

TRACE_TAIL_LINES = 40
PROGRESS_EVERY_SEEDS = 100  # when stderr is not a terminal: one progress line per this many seeds

EXIT_PASS, EXIT_VIOLATION = 0, 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim", help="deterministic simulation of a bookie's storage engine (crashes, torn tails, bit flips)",
        description="Run the real BookieEngine on a simulated disk, key-value store and clock, driven by one "
                    "seed: a workload of adds, RECOVERY_ADDs, fences, explicit LACs, reads and checkpoints, "
                    "with crashes (also during replay), torn journal tails, latencies and bit flips, checking "
                    "the invariants after every answer, every restart and at the end. The same seed always "
                    "gives a byte-identical trace.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run this one seed")
    which.add_argument("--sweep", type=int, metavar="N", help="run N seeds (see --from)")
    p.add_argument("--from", dest="first", type=int, default=1, metavar="S", help="first seed of --sweep (default 1)")
    p.add_argument("--steps", type=int, default=STEPS_DEFAULT,
                   help=f"workload steps per seed (default {STEPS_DEFAULT})")
    p.add_argument("--trace", action="store_true", help="print the whole trace of --seed")
    p.add_argument("--tolerate-known", action="store_true",
                   help="record violations of known engine issues as TOLERATED and keep checking the rest")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args) -> int:
    if args.steps < 1:
        raise ConfigError("--steps must be >= 1")
    tolerated = KNOWN_INVARIANTS if args.tolerate_known else frozenset()
    if args.seed is not None:
        return _one(args.seed, args.steps, args.trace, tolerated)
    if args.sweep < 1:
        raise ConfigError("--sweep needs at least one seed")
    return _sweep(args.first, args.sweep, args.steps, tolerated)


def replay_commands(seed: int, steps: int, tolerate_known: bool) -> str:
    make_extra = (f" STEPS={steps}" if steps != STEPS_DEFAULT else "") + \
                 (" SIM_ARGS=--tolerate-known" if tolerate_known else "")
    cli_extra = (f" --steps {steps}" if steps != STEPS_DEFAULT else "") + \
                (" --tolerate-known" if tolerate_known else "")
    return f"make sim SEED={seed}{make_extra}   |   bksim sim --seed {seed}{cli_extra} --trace"


def _one(seed: int, steps: int, print_trace: bool, tolerated: frozenset[str]) -> int:
    plan = BookiePlan.from_seed(seed, steps)
    print(f"bksim sim: seed {seed}; replay: {replay_commands(seed, steps, bool(tolerated))}")
    print("plan (every knob, drawn from the seed):")
    for line in plan.describe():
        print(f"  {line}")
    if tolerated:
        print(f"tolerated known engine issues: {', '.join(sorted(tolerated))}")
    started = time.perf_counter()
    result = run_bookie_sim(seed, tolerated=tolerated, plan=plan)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    if print_trace:
        print("trace:")
        for line in result.trace:
            print(f"  {line}")
    stats = ", ".join(f"{k}={v}" for k, v in result.stats.items())
    if result.passed:
        print(f"PASS seed={seed} in {elapsed_ms:.0f} ms: {stats}")
        for violation in result.tolerated[:10]:
            print(f"  tolerated: {violation}")
        if len(result.tolerated) > 10:
            print(f"  ... and {len(result.tolerated) - 10} more tolerated")
        print(f"trace: {len(result.trace)} lines, sha256 {result.digest}")
        return EXIT_PASS
    _print_failure(result, steps, bool(tolerated), print_trace)
    return EXIT_VIOLATION


def _print_failure(result: SimResult, steps: int, tolerate_known: bool, printed_trace: bool) -> None:
    v = result.violation
    print(f"FAIL seed={result.seed}: {v.invariant} violated: {v.detail}")
    known = KNOWN_ENGINE_ISSUES.get(v.invariant)
    if known is not None:
        print(f"  known engine issue (first seen with seed {known[0]}): {known[1]}")
    if result.error:
        print("  the exception that escaped:")
        for line in result.error.rstrip().splitlines():
            print(f"    {line}")
    if not printed_trace:
        print(f"trace tail (last {TRACE_TAIL_LINES} of {len(result.trace)} lines):")
        for line in result.trace[-TRACE_TAIL_LINES:]:
            print(f"  {line}")
    print(f"replay: {replay_commands(result.seed, steps, tolerate_known)}")


def _sweep(first: int, count: int, steps: int, tolerated: frozenset[str]) -> int:
    print(f"bksim sim --sweep: seeds {first}..{first + count - 1}, {steps} steps each"
          + (f"; tolerating known engine issues: {', '.join(sorted(tolerated))}" if tolerated else ""))
    tty = sys.stderr.isatty()
    started = time.perf_counter()
    failures: list[SimResult] = []
    tolerated_counts: collections.Counter[str] = collections.Counter()
    for i, seed in enumerate(range(first, first + count), start=1):
        result = run_bookie_sim(seed, steps, tolerated=tolerated)
        for violation in result.tolerated:
            tolerated_counts[violation.split(":", 1)[0]] += 1
        if not result.passed:
            failures.append(result)
        if tty or i % PROGRESS_EVERY_SEEDS == 0 or i == count:
            line = (f"  {i}/{count} seeds (last {seed}), {len(failures)} failed, "
                    f"{time.perf_counter() - started:.1f} s")
            print(f"\r{line}" if tty else line, end="" if tty and i < count else "\n", file=sys.stderr, flush=True)
    elapsed_s = time.perf_counter() - started
    by_invariant = collections.Counter(r.violation.invariant for r in failures)
    print(f"{count - len(failures)} passed, {len(failures)} failed in {elapsed_s:.1f} s "
          f"({elapsed_s * 1000.0 / count:.0f} ms per seed)")
    if by_invariant:
        print("failures by invariant: " + ", ".join(f"{name} {n}" for name, n in sorted(by_invariant.items())))
    if tolerated_counts:
        print("tolerated (known engine issues): " + ", ".join(f"{name} {n}" for name, n in
                                                               sorted(tolerated_counts.items())))
    for result in failures:
        known = " (known engine issue)" if result.violation.invariant in KNOWN_ENGINE_ISSUES else ""
        print(f"  seed {result.seed}: {result.violation.invariant}{known}: {result.violation.detail}")
        print(f"    replay: {replay_commands(result.seed, steps, bool(tolerated))}")
    return EXIT_VIOLATION if failures else EXIT_PASS
