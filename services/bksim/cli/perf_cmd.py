"""`bksim perf ...`: the benchmarks (fsync-baseline, journal-append, grpc-baseline, bookie-add).

Each prints a header with the machine facts, the CPU idle fraction before every measurement, and a table of
records/s, MB/s and per-record p50/p99/p99.9 latency; `--json` prints one JSON object instead (the human
lines go to stderr). The bookie figures run their baseline first, in the same run and with the same record
and group/batch size, and print the ratio. Every run is bounded by --seconds and/or --records; all files go
to a fresh temp dir under --dir that is removed at the end, and every child process is stopped by pid,
also on Ctrl-C, SIGTERM or an error.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from typing import Callable

from bksim.perf import machine
from bksim.perf.stats import Ratio, Result, format_table, median_ratio, ratio

SECONDS_DEFAULT = 5.0
DIR_DEFAULT = os.path.join(".run", "perf")


def register(subparsers) -> None:
    perf = subparsers.add_parser("perf", help="benchmarks: raw baselines and the bookie measured against them")
    sub = perf.add_subparsers(dest="perf_command", required=True)

    p = sub.add_parser("fsync-baseline", help="raw append of GROUP records + one fdatasync, in a new file")
    _common(p, group_name="--group", group_default=16, group_help="records per fdatasync")
    p.add_argument("--sweep", action="store_true",
                   help="measure every (record bytes, group) of 1024,65536 x 1,16,256 instead of one combination")
    p.set_defaults(func=cmd_fsync_baseline)

    p = sub.add_parser("journal-append", help="the bookie's Journal in-process vs fsync-baseline (same run)")
    _common(p, group_name="--group", group_default=16, group_help="records per fsync (= concurrent records)")
    p.add_argument("--per-append", type=int, default=1, help="records per append_many call (default 1); "
                   "GROUP/PER_APPEND producers run concurrently")
    p.add_argument("--flush-when-idle", action="store_true",
                   help="let the journal's idle flush form the groups instead of a byte threshold of GROUP records")
    p.add_argument("--depth", type=int, default=1, help="groups outstanding (default 1: each group's producers "
                   "wait for its sync; 2: the next group is queued while one syncs)")
    p.set_defaults(func=cmd_journal_append)

    p = sub.add_parser("grpc-baseline", help="bare grpc.aio bidi echo stream, server in a separate process")
    _common(p, group_name="--batch", group_default=100, group_help="records per gRPC message")
    _inflight(p)
    p.set_defaults(func=cmd_grpc_baseline)

    p = sub.add_parser("bookie-add", help="a real bookie process over gRPC vs grpc-baseline (same run)")
    _common(p, group_name="--batch", group_default=100, group_help="records per AddRequest")
    _inflight(p)
    p.add_argument("--py-spy", metavar="OUT", help="sample the bookie's GIL-holding threads with py-spy "
                   "(installed by hand) during the measurement; write collapsed stacks to OUT")
    p.set_defaults(func=cmd_bookie_add)


def _common(p: argparse.ArgumentParser, group_name: str, group_default: int, group_help: str) -> None:
    p.add_argument("--record-bytes", type=int, default=1024, help="bytes per record (default 1024)")
    p.add_argument(group_name, dest="group", metavar=group_name.lstrip("-").upper(), type=int,
                   default=group_default, help=f"{group_help} (default {group_default})")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"time bound per measurement (default {SECONDS_DEFAULT:g}; 0 = only --records)")
    p.add_argument("--records", type=int, default=0, help="record bound per measurement (default 0 = none)")
    p.add_argument("--dir", default=DIR_DEFAULT, help=f"a temp dir is made (and removed) under this "
                   f"(default {DIR_DEFAULT})")
    p.add_argument("--idle-min", type=float, default=machine.IDLE_MIN_DEFAULT,
                   help=f"wait for this CPU idle fraction before measuring (default {machine.IDLE_MIN_DEFAULT})")
    p.add_argument("--idle-wait-s", type=float, default=machine.IDLE_WAIT_S_DEFAULT,
                   help=f"longest wait for idle CPUs; then measure anyway (default {machine.IDLE_WAIT_S_DEFAULT:g})")
    p.add_argument("--repeat", type=int, default=1, help="repeat the measurement(s) N times (default 1); "
                   "with a baseline, the ratio of each pair and their median are printed")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data) for inspection")
    p.add_argument("--json", action="store_true", help="print one JSON object (human lines go to stderr)")


def _inflight(p: argparse.ArgumentParser) -> None:
    from bksim.perf.grpc_baseline import INFLIGHT_DEFAULT

    p.add_argument("--inflight", type=int, default=INFLIGHT_DEFAULT,
                   help=f"unacknowledged batches per stream (default {INFLIGHT_DEFAULT})")


# ---------------------------------------------------------------------------------------------- commands
def cmd_fsync_baseline(args) -> int:
    from bksim.perf import fsync_baseline

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        combos = ([(r, g) for r in fsync_baseline.SWEEP_RECORD_BYTES for g in fsync_baseline.SWEEP_GROUPS]
                  if args.sweep else [(args.record_bytes, args.group)])
        results = []
        for record_bytes, group in combos:
            label = f"fsync-baseline {record_bytes} B x {group}"
            results.append(fsync_baseline.run(workdir, record_bytes, group, args.seconds, args.records, idle(label)))
        return results, []

    return _run("fsync-baseline", args, measure)


def cmd_journal_append(args) -> int:
    from bksim.perf import fsync_baseline, journal_append

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        base = fsync_baseline.run(workdir, args.record_bytes, args.group, args.seconds, args.records,
                                  idle("fsync-baseline"))
        subject = journal_append.run(workdir, args.record_bytes, args.group, args.seconds, args.records,
                                     per_append=args.per_append, flush_when_idle=args.flush_when_idle, depth=args.depth,
                                     cpu_idle_before=idle("journal-append"))
        return [base, subject], [ratio(subject, base, journal_append.TARGET_RATIO)]

    return _run("journal-append", args, measure)


def cmd_grpc_baseline(args) -> int:
    from bksim.perf import grpc_baseline

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        return [grpc_baseline.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                      args.records, idle)], []

    return _run("grpc-baseline", args, measure)


def cmd_bookie_add(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.perf import bookie_add, grpc_baseline

    config = cfgload.load(args.config)  # the bookie process loads the same file (and environment) itself

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        base = grpc_baseline.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                     args.records, idle)
        subject = bookie_add.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                     args.records, idle, config, config_path=args.config,
                                     py_spy_out=args.py_spy, keep=args.keep)
        return [base, subject], [ratio(subject, base, bookie_add.TARGET_RATIO)]

    return _run("bookie-add", args, measure)


# ---------------------------------------------------------------------------------------------- shared
def _run(name: str, args, measure: Callable[[str, Callable[[str], float]], tuple[list[Result], list[Ratio]]]) -> int:
    """Make the temp dir, print the header, measure, print the report; clean up whatever happens."""
    _check_bounds(args)
    human = sys.stderr if args.json else sys.stdout
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=f"{name}-", dir=args.dir)
    facts = machine.facts(workdir)
    header = machine.header_lines(facts)
    shape = ("sweep of record bytes x group" if getattr(args, "sweep", False)
             else f"record {args.record_bytes} B, group/batch {args.group}")
    header.append(f"# {name}: {shape}, bound "
                  f"{args.seconds:g} s" + (f" / {args.records} records" if args.records else "")
                  + "; latency per record, submit -> ack")
    print("\n".join(header), file=human, flush=True)

    def idle(label: str) -> float:
        os.sync()  # write back what earlier measurements left dirty, so it does not land in this one
        return machine.wait_for_idle(args.idle_min, args.idle_wait_s,
                                     lambda line: print(line, file=human, flush=True), label)

    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    results: list[Result] = []
    ratios: list[Ratio] = []
    try:
        for _ in range(args.repeat):
            more_results, more_ratios = measure(workdir, idle)
            results += more_results
            ratios += more_ratios
    finally:
        signal.signal(signal.SIGTERM, previous)
        if args.keep:
            print(f"# kept {workdir}", file=human)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.repeat > 1 and ratios:
        ratios.append(median_ratio(ratios))
    print(format_table(results, ratios), file=human, flush=True)
    if args.json:
        print(json.dumps({"benchmark": name, "machine": facts, "results": [r.to_json() for r in results],
                          "ratios": [q.to_json() for q in ratios]}, indent=2))
    return 0


def _check_bounds(args) -> None:
    from bksim.model.errors import ConfigError

    if args.seconds <= 0 and args.records <= 0:
        raise ConfigError("give a bound: --seconds > 0 and/or --records > 0")
    if args.record_bytes <= 0 or args.group <= 0:
        raise ConfigError("--record-bytes and the group/batch size must be > 0")
    if args.repeat <= 0:
        raise ConfigError("--repeat must be > 0")
    if getattr(args, "inflight", 1) <= 0:
        raise ConfigError("--inflight must be > 0")


def _sigterm_to_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
