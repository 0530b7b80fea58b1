"""`bksim chaos list | run | campaign`: the chaos scenarios of bksim.chaos on real processes.

    bksim chaos list
    bksim chaos run SCENARIO [--seed N] [--duration S] [--keep] [--json] [--secure]
    bksim chaos campaign --runs N [--seed N] [--duration S] [--scenarios A,B] [--keep] [--secure]

--secure: the cluster runs with TLS on every gRPC link, token authentication and authorization at the brokers
and ZooKeeper digest ACLs (bksim.security.kit, files under the run's security/ directory).

Runs go under <cluster.run_dir>/chaos/<scenario>-s<seed>-<time>-<pid>/ (report.json, report.txt, logs/,
audit/; the data directories are removed after a passing run unless --keep). Exit status: 0 every run
passed, 1 a violation (or a run that could not be carried out), 2 bad arguments. On a terminal, `campaign`
keeps a status line under its log on stderr: runs done of N, ETA, failures so far (cli/progress.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from bksim.cli.progress import Progress

DURATION_DEFAULT_S = 15.0
SECURE_HELP = ("TLS on every gRPC link, tokens and authorization at the brokers, ZooKeeper digest ACLs; the workload "
               "and checks present a client certificate and a super-user token")


def register(subparsers) -> None:
    p = subparsers.add_parser("chaos", help="fault scenarios on a fresh local cluster, with checks and the audit",
                              description="Start a fresh cluster (ZooKeeper, 3 bookies, 2 brokers), run a recording "
                              "workload, inject faults on a seeded schedule, heal, then check: lost, reordered, "
                              "divergent = 0, duplicates counted, every ledger CLOSED, the journal audit clean.")
    p.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file (for cluster.run_dir)")
    sub = p.add_subparsers(dest="chaos_command", required=True)
    sub.add_parser("list", help="the scenarios").set_defaults(func=cmd_list)
    r = sub.add_parser("run", help="one scenario")
    r.add_argument("scenario")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--duration", type=float, default=DURATION_DEFAULT_S, help="seconds of workload (default 15)")
    r.add_argument("--keep", action="store_true", help="keep the data directories of a passing run")
    r.add_argument("--json", action="store_true", help="print report.json instead of the text report")
    r.add_argument("--dir", default=None, help="base directory of the runs (default <cluster.run_dir>/chaos)")
    r.add_argument("--secure", action="store_true", help=SECURE_HELP)
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("campaign", help="many runs of random scenarios and seeds, with a summary table")
    c.add_argument("--runs", type=int, required=True)
    c.add_argument("--seed", type=int, default=None, help="seed of the campaign's draws (default: random)")
    c.add_argument("--duration", type=float, default=DURATION_DEFAULT_S)
    c.add_argument("--scenarios", default="", help="comma-separated subset (default: all)")
    c.add_argument("--keep", action="store_true")
    c.add_argument("--dir", default=None)
    c.add_argument("--secure", action="store_true", help=SECURE_HELP)
    c.set_defaults(func=cmd_campaign)


def _base_dir(args) -> str:
    if args.dir:
        return args.dir
    from bksim.cli import config as cfgload

    config = cfgload.load(getattr(args, "config", None))
    return os.path.join(config.cluster.run_dir, "chaos")


def cmd_list(args) -> int:
    from bksim.chaos.scenarios import SCENARIOS

    width = max(len(n) for n in SCENARIOS)
    for name, s in SCENARIOS.items():
        print(f"{name:<{width}}  {s.summary}")
    return 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_run(args) -> int:
    from bksim.chaos import runner

    try:
        report = runner.run(args.scenario, args.seed, args.duration, _base_dir(args), keep=args.keep, log=_log,
                            secure=args.secure)
    except runner.ChaosError as e:
        print(f"bksim: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(runner.render_text(report), end="")
    return 0 if report["verdict"] == "PASS" else 1


def cmd_campaign(args) -> int:
    import random

    from bksim.chaos import runner

    if args.runs < 1:
        print("bksim: error: --runs must be >= 1", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()] or None
    base = _base_dir(args)
    _log(f"chaos campaign: {args.runs} runs, seed {seed}, {args.duration:g} s each, under {base}")
    with Progress("chaos campaign", args.runs, "runs", ticking=True) as status:
        def progress(line: str) -> None:  # once per run done, "[i/N] ... | failed F | ..."
            _log(line)
            failed = re.search(r"\| failed (\d+) \|", line)
            status.advance(1, note=f"{failed.group(1)} failed" if failed else None)

        try:
            rows, table = runner.campaign(args.runs, seed, args.duration, base, names, keep=args.keep, log=_log,
                                          progress=progress, secure=args.secure)
        except runner.ChaosError as e:
            status.close()
            print(f"bksim: error: {e}", file=sys.stderr)
            return 2
    print(table)
    failed = [r for r in rows if r["verdict"] != "PASS"]
    for r in failed:
        print(f"FAILED: {r['scenario']} seed {r['seed']}: {'; '.join(r['violations'][:3])} ({r['run_dir']})")
    return 1 if failed else 0
