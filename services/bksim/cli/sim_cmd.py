"""`bksim sim`: the deterministic simulations, one seed at a time or in sweeps.

Five worlds (`--world`):
- `ledger` (the default): bookies, brokers, the simulated network and metadata store; ledgers written, read
  and recovered under network, disk, process and session faults (bksim.sim.ledger_scenario);
- `autorecovery`: the same seed's ledger world plus auditors and replication workers, bookies lost for good,
  workers crashed mid-copy, auditor sessions expired and locks lost; it settles until every closed ledger is
  fully replicated again or reported lost (bksim.sim.autorecovery_scenario);
- `bookie`: one bookie's storage engine under crashes, torn tails and bit flips (bksim.sim.bookie_scenario);
  `--steps K` sets its workload length (it applies to this world and the next only);
- `gc`: the bookie world plus a metadata store of ledgers that fails, breaks off and lags, ledgers deleted from
  it, garbage-collection and compaction rounds among the adds and reads, crashes at every step of both
  (bksim.sim.gc_scenario);
- `topics`: brokers running the real topic layer (TopicService, managed ledgers, cursors, subscriptions, dedup)
  over simulated bookies, network and metadata store; producers and consumers of the four subscription types
  under broker crashes and takeovers, session expiry, ZooKeeper connection loss, bookie crashes, lossy links,
  clean restarts, seeks and producer restarts (bksim.sim.topic_scenario).

`bksim sim --seed N [--trace]` prints the seed and every knob of its plan (for the ledger world, the fault
plan: every fault event with its time), runs it, and prints PASS (with the trace digest: the same seed always
gives the same one) or the violated invariant with the tail of the trace and the lines that replay it.
`bksim sim --sweep N [--from S]` runs N seeds and prints a summary that lists every failure with its replay
command; on a terminal a progress line (cli/progress.py: seeds done of N, rate, ETA, failures so far) is redrawn
on stderr, otherwise stderr gets a line every PROGRESS_EVERY_SEEDS seeds and after the last.

Exit status: 0 every run passed, 1 an invariant was violated, 2 bad arguments.
`--tolerate-known` (bookie and gc worlds) records violations of the known engine issues (bksim.sim.known_issues)
as TOLERATED instead of failing, so the rest of each run is still checked.
"""
from __future__ import annotations

import collections
import sys
import time

from bksim.cli.progress import Progress
from bksim.model.errors import ConfigError
from bksim.sim.autorecovery_scenario import run_autorecovery_sim
from bksim.sim.bookie_scenario import SimResult, run_bookie_sim
from bksim.sim.gc_scenario import gc_plans, run_gc_sim
from bksim.sim.known_issues import KNOWN_ENGINE_ISSUES, KNOWN_INVARIANTS
from bksim.sim.ledger_scenario import LedgerSimResult, run_ledger_sim
from bksim.sim.plan import STEPS_DEFAULT, AutorecoveryPlan, BookiePlan, LedgerPlan
from bksim.sim.topic_scenario import TopicPlan, run_topic_sim

WORLDS = ("ledger", "bookie", "autorecovery", "gc", "topics")

TRACE_TAIL_LINES = 40
PROGRESS_EVERY_SEEDS = 100  # when stderr is not a terminal: one progress line per this many seeds

EXIT_PASS, EXIT_VIOLATION = 0, 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim", help="deterministic simulation: ledgers on brokers and bookies under faults (or one bookie's engine)",
        description="Run the real code on a simulated world driven by one seed. --world ledger (default): "
                    "brokers (the real ledger client) and bookies (the real BookieEngine on simulated disks) "
                    "over a simulated network and metadata store, with partitions (one-way too), loss, "
                    "duplication, reordering, slow bookies and disks, bookie crashes and restarts, broker "
                    "crashes with takeover, fencing recoveries, concurrent recoveries and session expiry; then "
                    "a liveness phase; the ledger invariants of PROTOCOL.md §7 are checked throughout. --world "
                    "bookie: one BookieEngine with crashes (also during replay), torn journal tails, latencies "
                    "and bit flips. --world gc: the bookie world with ledgers deleted from a simulated metadata "
                    "store that fails and lags, garbage collection and compaction among the adds, and crashes at "
                    "every step of both. --world topics: brokers running the real topic layer with producers and "
                    "consumers of every subscription type under broker, bookie, session and ZooKeeper faults. "
                    "The same seed always gives a byte-identical trace.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run this one seed")
    which.add_argument("--sweep", type=int, metavar="N", help="run N seeds (see --from)")
    p.add_argument("--from", dest="first", type=int, default=1, metavar="S", help="first seed of --sweep (default 1)")
    p.add_argument("--world", choices=WORLDS, default="ledger",
                   help="ledger (default): brokers + bookies + network; bookie: one bookie's storage engine; "
                        "autorecovery: the ledger world with bookies lost for good, auditors and replication "
                        "workers; gc: the bookie world with ledger deletions, garbage collection and compaction; "
                        "topics: brokers running the topic layer, producers and consumers of one topic")
    p.add_argument("--steps", type=int, default=None,
                   help=f"--world bookie or gc only: workload steps per seed (default {STEPS_DEFAULT})")
    p.add_argument("--trace", action="store_true", help="print the whole trace of --seed")
    p.add_argument("--tolerate-known", action="store_true",
                   help="record violations of known engine issues as TOLERATED and keep checking the rest")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args) -> int:
    if args.world in ("ledger", "autorecovery", "topics"):
        if args.steps is not None:
            raise ConfigError(f"--steps applies to --world bookie or gc only (the {args.world} world's length "
                              f"comes from its plan)")
        if args.seed is not None:
            return _one_ledger(args.seed, args.trace, args.world)
        if args.sweep < 1:
            raise ConfigError("--sweep needs at least one seed")
        return _sweep_ledger(args.first, args.sweep, args.world)
    steps = STEPS_DEFAULT if args.steps is None else args.steps
    if steps < 1:
        raise ConfigError("--steps must be >= 1")
    tolerated = KNOWN_INVARIANTS if args.tolerate_known else frozenset()
    if args.seed is not None:
        return _one(args.seed, steps, args.trace, tolerated, args.world)
    if args.sweep < 1:
        raise ConfigError("--sweep needs at least one seed")
    return _sweep(args.first, args.sweep, steps, tolerated, args.world)


def _report_seed(status: Progress, i: int, count: int, seed: int, failed: int, started: float) -> None:
    """After seed `i` of `count`: on a terminal the progress line (seeds done, rate, ETA, violations so far);
    otherwise a line on stderr every PROGRESS_EVERY_SEEDS seeds and after the last."""
    if status.enabled:
        status.update(i, note=f"last seed {seed}, {failed} failed")
    elif i % PROGRESS_EVERY_SEEDS == 0 or i == count:
        print(f"  {i}/{count} seeds (last {seed}), {failed} failed, {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)


def replay_commands(seed: int, steps: int, tolerate_known: bool, world: str = "bookie") -> str:
    """The bookie (or gc) world's replay lines."""
    make_args = [f"--world {world}"] + (["--tolerate-known"] if tolerate_known else [])
    make_extra = (f" STEPS={steps}" if steps != STEPS_DEFAULT else "") + f" SIM_ARGS='{' '.join(make_args)}'"
    cli_extra = (f" --steps {steps}" if steps != STEPS_DEFAULT else "") + \
                (" --tolerate-known" if tolerate_known else "")
    return f"make sim SEED={seed}{make_extra}   |   bksim sim --world {world} --seed {seed}{cli_extra} --trace"


def ledger_replay_commands(seed: int, world: str = "ledger") -> str:
    if world in ("autorecovery", "topics"):
        return f"bksim sim --world {world} --seed {seed} --trace"
    return f"make sim SEED={seed}   |   bksim sim --seed {seed} --trace"


RUNS = {"ledger": run_ledger_sim, "autorecovery": run_autorecovery_sim, "topics": run_topic_sim}


def _one(seed: int, steps: int, print_trace: bool, tolerated: frozenset[str], world: str = "bookie") -> int:
    if world == "gc":
        plans = gc_plans(seed, steps)
        lines = plans[0].describe() + plans[1].describe()
    else:
        plan = BookiePlan.from_seed(seed, steps)
        lines = plan.describe()
    print(f"bksim sim --world {world}: seed {seed}; replay: {replay_commands(seed, steps, bool(tolerated), world)}")
    print("plan (every knob, drawn from the seed):")
    for line in lines:
        print(f"  {line}")
    if tolerated:
        print(f"tolerated known engine issues: {', '.join(sorted(tolerated))}")
    started = time.perf_counter()
    if world == "gc":
        result = run_gc_sim(seed, tolerated=tolerated, plans=plans)
    else:
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
    _print_failure(result, steps, bool(tolerated), print_trace, world=world)
    return EXIT_VIOLATION


def _print_failure(result: SimResult | LedgerSimResult, steps: int, tolerate_known: bool, printed_trace: bool,
                   replay: str | None = None, world: str = "bookie") -> None:
    v = result.violation
    print(f"FAIL seed={result.seed}: {v.invariant} violated: {v.detail}")
    known = KNOWN_ENGINE_ISSUES.get(v.invariant) if replay is None else None  # bookie world only
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
    print(f"replay: {replay or replay_commands(result.seed, steps, tolerate_known, world)}")


def _sweep(first: int, count: int, steps: int, tolerated: frozenset[str], world: str = "bookie") -> int:
    run = run_gc_sim if world == "gc" else run_bookie_sim
    print(f"bksim sim --world {world} --sweep: seeds {first}..{first + count - 1}, {steps} steps each"
          + (f"; tolerating known engine issues: {', '.join(sorted(tolerated))}" if tolerated else ""))
    started = time.perf_counter()
    failures: list[SimResult] = []
    tolerated_counts: collections.Counter[str] = collections.Counter()
    with Progress(f"sim --world {world} --sweep", count, "seeds") as status:
        for i, seed in enumerate(range(first, first + count), start=1):
            result = run(seed, steps, tolerated=tolerated)
            for violation in result.tolerated:
                tolerated_counts[violation.split(":", 1)[0]] += 1
            if not result.passed:
                failures.append(result)
            _report_seed(status, i, count, seed, len(failures), started)
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
        print(f"    replay: {replay_commands(result.seed, steps, bool(tolerated), world)}")
    return EXIT_VIOLATION if failures else EXIT_PASS


# -- the ledger world ----------------------------------------------------------------------------------------
def _one_ledger(seed: int, print_trace: bool, world: str = "ledger") -> int:
    plan = TopicPlan.from_seed(seed) if world == "topics" else LedgerPlan.from_seed(seed)
    print(f"bksim sim --world {world}: seed {seed}; replay: {ledger_replay_commands(seed, world)}")
    print("plan (every knob and the fault plan, drawn from the seed):")
    lines = plan.describe()
    if world == "autorecovery":
        lines = lines + AutorecoveryPlan.from_seed(seed, plan).describe()
    for line in lines:
        print(f"  {line}")
    started = time.perf_counter()
    result = RUNS[world](seed, plan=plan)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    if print_trace:
        print("trace:")
        for line in result.trace:
            print(f"  {line}")
    if result.passed:
        stats = ", ".join(f"{k}={v}" for k, v in result.stats.items())
        print(f"PASS seed={seed} in {elapsed_ms:.0f} ms: {stats}")
        print(f"trace: {len(result.trace)} lines, sha256 {result.digest}")
        return EXIT_PASS
    _print_failure(result, STEPS_DEFAULT, False, print_trace, replay=ledger_replay_commands(seed, world))
    return EXIT_VIOLATION


def _sweep_ledger(first: int, count: int, world: str = "ledger") -> int:
    print(f"bksim sim --sweep ({world} world): seeds {first}..{first + count - 1}")
    started = time.perf_counter()
    failures: list[LedgerSimResult] = []
    with Progress(f"sim --world {world} --sweep", count, "seeds") as status:
        for i, seed in enumerate(range(first, first + count), start=1):
            result = RUNS[world](seed)
            if not result.passed:
                failures.append(result)
            _report_seed(status, i, count, seed, len(failures), started)
    elapsed_s = time.perf_counter() - started
    by_invariant = collections.Counter(r.violation.invariant for r in failures)
    print(f"{count - len(failures)} passed, {len(failures)} failed in {elapsed_s:.1f} s "
          f"({elapsed_s * 1000.0 / count:.0f} ms per seed)")
    if by_invariant:
        print("failures by invariant: " + ", ".join(f"{name} {n}" for name, n in sorted(by_invariant.items())))
    for result in failures:
        print(f"  seed {result.seed}: {result.violation.invariant}: {result.violation.detail}")
        print(f"    replay: {ledger_replay_commands(result.seed, world)}")
    return EXIT_VIOLATION if failures else EXIT_PASS
