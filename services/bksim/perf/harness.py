"""The benchmark harness every `bksim perf ...` command runs through.

`run(name, options, measure, shape)`: a fresh temp dir under `options.out_dir` (removed at the end unless
`keep`, whatever happens), a header with the machine facts and the run's shape, `repeat` measurements (each
waits for the CPU to be idle before it measures, after an os.sync()), then a table of records/s, MB/s and
per-record p50/p99/p99.9 latency, the ratios (with their median over repeats) and the targets' verdicts;
with `json` one JSON object on stdout (the human lines go to stderr). SIGTERM is turned into
KeyboardInterrupt meanwhile, so a terminated run cleans up as a Ctrl-C'd one does.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

from bksim.perf import machine
from bksim.perf.stats import Ratio, Result, format_table, median_ratio


@dataclass(frozen=True)
class RunOptions:
    out_dir: str  # the temp dir of the run is made under it
    seconds: float  # time bound of one measurement (0: none)
    records: int  # record bound of one measurement (0: none)
    repeat: int
    idle_min: float  # CPU idle fraction to wait for before each measurement
    idle_wait_s: float  # ... at most this long
    json: bool
    keep: bool  # keep the temp dir
    record_bytes: int
    group: int
    sweep: bool = False


def run(name: str, options: RunOptions, measure: Callable[[str, Callable[[str], float]], tuple],
        shape: str | None = None, summary: Callable[[], tuple[str, dict]] | None = None) -> int:
    """Make the temp dir, print the header, measure, print the report; clean up whatever happens.

    `measure(workdir, idle)` returns (results, ratios) or (results, ratios, targets), targets being dicts
    {"target", "value", "met"} (met None: not established by the run); `idle(label)` waits for an idle CPU and
    returns the idle fraction. `summary()`, when given, is called after the measurements: (text printed after the
    report, fields added to the JSON object)."""
    human = sys.stderr if options.json else sys.stdout
    os.makedirs(options.out_dir, exist_ok=True)
    if shape is None:
        shape = ("sweep of record bytes x group" if options.sweep
                 else f"record {options.record_bytes} B, group/batch {options.group}")
        shape += ", bound " + f"{options.seconds:g} s" + (f" / {options.records} records" if options.records else "")
        shape += "; latency per record, submit -> ack"
    elif options.seconds or options.records:
        shape += ", bound " + f"{options.seconds:g} s" + (f" / {options.records} records" if options.records else "")

    def idle(label: str) -> float:
        os.sync()  # write back what earlier measurements left dirty, so it does not land in this one
        return machine.wait_for_idle(options.idle_min, options.idle_wait_s,
                                     lambda line: print(line, file=human, flush=True), label)

    previous = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    results: list[Result] = []
    ratios: list[Ratio] = []
    targets: list[dict] = []
    workdir = tempfile.mkdtemp(prefix=f"{name}-", dir=options.out_dir)
    try:  # from here on the temp dir is removed whatever happens (even a closed stdout)
        facts = machine.facts(workdir)
        print("\n".join(machine.header_lines(facts) + [f"# {name}: {shape}"]), file=human, flush=True)
        for _ in range(options.repeat):
            more_results, more_ratios, *more_targets = measure(workdir, idle)
            results += more_results
            ratios += more_ratios
            targets += more_targets[0] if more_targets else []
    finally:
        signal.signal(signal.SIGTERM, previous)
        if options.keep:
            print(f"# kept {workdir}", file=human)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if options.repeat > 1 and ratios:  # one median per kind of ratio (a secured pair of --both has two)
        kinds = list(dict.fromkeys((q.subject, q.baseline) for q in ratios))
        ratios += [_median([q for q in ratios if (q.subject, q.baseline) == kind]) for kind in kinds]
    print(format_table(results, ratios), file=human, flush=True)
    for t in targets:
        verdict = {True: "MET", False: "NOT MET", None: "NOT ESTABLISHED"}[t["met"]]
        print(f"target {t['target']}: {t['value']}: {verdict}", file=human, flush=True)
    text, fields = summary() if summary is not None else ("", {})
    if text:
        print(text, file=human, flush=True)
    if options.json:
        report = {"benchmark": name, "machine": facts, "results": [r.to_json() for r in results],
                  "ratios": [q.to_json() for q in ratios]}
        if targets:
            report["targets"] = targets
        report.update(fields)
        print(json.dumps(report, indent=2))
    return 0


def _median(ratios: list[Ratio]) -> Ratio:
    """median_ratio; a ratio whose target depends on its run's baseline (ledger-write) gets the median target."""
    targets = sorted(q.target for q in ratios)
    if len(set(targets)) == 1:
        return median_ratio(ratios)
    mid = len(targets) // 2
    target = targets[mid] if len(targets) % 2 else (targets[mid - 1] + targets[mid]) / 2
    return median_ratio([dataclasses.replace(q, target=target) for q in ratios])


def _sigterm_to_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
