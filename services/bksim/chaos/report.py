"""A chaos run's report: the `Report` the runner fills in, the figures computed from the recorded
acknowledgements (throughput and its dips, recovery times), the verdict rules (`violations`), and its two
renderings: report.json (`Report.to_dict()`, the same plain dict `bksim chaos run --json` prints),
report.txt (`render_text`) and report.html (`render_html`: the same facts as a page in bksim's one stylesheet,
formats/style.py, with acknowledgements per second drawn as SVG and a link to the run's audit/report.html). A campaign's summary row and table come from the same dicts.

The JSON fields, in this order: scenario, seed, duration_s, run_dir, plan, cluster_start_s, tail, entrylog_flips,
check_s, ledgers, ledger_writers, ledger_ends, topic, audit, rereplication, failed_checks, timeline, faults,
throughput, recovery, problems, violations, verdict, elapsed_s. `rereplication` (only where autorecovery had to
repair: a bookie lost for good, copies destroyed) lists per loss or damage {"bookie", "bookie_id", "cause",
"t", "rereplication_s"}: the seconds from it to every closed ledger fully replicated (None: not within the
bound, which is a violation of its own). A run that could not be carried out has only scenario, seed,
duration_s, run_dir, timeline, problems, violations (naming why it was aborted) and verdict FAIL.

Every function here reads and returns plain data (dicts and lists): no processes, no clock.
"""
from __future__ import annotations

import collections
import dataclasses
import html
import json
import os
import statistics
from dataclasses import dataclass

from bksim.chaos.workload import Recorder
from bksim.formats.style import STYLESHEET

GAP_S = 0.5  # an acknowledgement gap at least this long is a disruption


@dataclass
class Report:
    """One run's report; a field left None was not reached (an aborted run) and is not written."""
    scenario: str
    seed: int
    duration_s: float
    run_dir: str
    plan: list[dict] | None = None
    secure: bool | None = None  # True: TLS, tokens + authorization, ZooKeeper digest ACLs (`--secure`)
    cluster_start_s: float | None = None
    tail: dict | None = None  # {"from_s", "to_s"}: the calm tail after the last step
    entrylog_flips: list[dict] | None = None
    check_s: float | None = None
    ledgers: dict | None = None
    ledger_writers: list[dict] | None = None
    ledger_ends: list[dict] | None = None
    topic: dict | None = None
    audit: dict | None = None
    rereplication: list[dict] | None = None
    failed_checks: list[str] | None = None
    timeline: list[dict] | None = None
    faults: list[dict] | None = None
    throughput: dict | None = None
    recovery: dict | None = None
    problems: list[str] | None = None
    violations: list[str] | None = None
    verdict: str | None = None  # PASS | FAIL
    elapsed_s: float | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def judge(self) -> None:
        """Set violations and the verdict from everything else."""
        self.violations = violations(self.to_dict())
        self.verdict = "PASS" if not self.violations else "FAIL"


def aborted(scenario: str, seed: int, duration_s: float, run_dir: str, timeline: list[dict], problems: list[str],
            error: Exception) -> Report:
    """The report of a run that could not be carried out: what happened so far, and why it stopped."""
    first_line = str(error).splitlines()[0] if str(error) else ""
    return Report(scenario, seed, duration_s, run_dir, timeline=timeline,
                  problems=problems + [f"run aborted: {type(error).__name__}: {error}"],
                  violations=[f"run aborted: {type(error).__name__}: {first_line}"], verdict="FAIL")


def write(report: dict, run_dir: str) -> None:
    """report.json, report.txt and report.html in `run_dir`."""
    with open(os.path.join(run_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(run_dir, "report.txt"), "w") as f:
        f.write(render_text(report))
    with open(os.path.join(run_dir, "report.html"), "w", encoding="utf-8") as f:
        f.write(render_html(report))


# ------------------------------------------------------------------------------------------------ figures
def throughput(rec: Recorder, faults: list[dict]) -> dict:
    """Acknowledgements per second of each stream, the baseline before the first fault and the dips."""
    out = {}
    first_fault = min((f["t"] for f in faults), default=None)
    for stream, counts in rec.counts.items():
        last = max(counts, default=-1)
        series = [counts.get(s, 0) for s in range(last + 1)]
        # whole seconds before the first fault (second 0 only when there is nothing else: it starts mid-way)
        cut = int(first_fault) if first_fault is not None else len(series)
        before = series[1:cut] or series[:max(1, cut)]
        baseline = statistics.median(before) if before else None
        during = series[int(first_fault):] if first_fault is not None else []
        low = min(during) if during else None
        out[stream] = {"per_second": series, "baseline_per_s": baseline, "min_per_s_after_first_fault": low,
                       "dip_fraction": (round(1 - low / baseline, 3) if baseline and low is not None else None)}
    return out


def _gaps(times: list[float]) -> list[tuple[float, float]]:
    return [(a, b) for a, b in zip(times, times[1:]) if b - a >= GAP_S]


def recovery_times(rec: Recorder, faults: list[dict], tail_from: float | None, end_t: float | None = None) -> dict:
    """Per fault: from its injection to the end of the last acknowledgement gap (>= GAP_S) that began before
    the next fault, per stream (0 when acks never paused). A stream whose acknowledgements never came back
    before `end_t` (the end of the workload) gets end_t - fault time and is listed in `not_recovered`.
    Also: acknowledgements during the final tail."""
    per_fault = []
    for i, f in enumerate(faults):
        start = f["t"]
        # a gap that begins within GAP_S before the next fault belongs to that fault
        limit = faults[i + 1]["t"] - GAP_S if i + 1 < len(faults) else float("inf")
        entry = {"t": start, "action": f["action"], "victims": f["victims"], "not_recovered": []}
        for stream, times in rec.acks.items():
            ordered = sorted(times)
            if end_t is not None and (not ordered or end_t - ordered[-1] >= GAP_S):
                ordered.append(end_t)  # a gap still open at the end of the workload
                open_gap = True
            else:
                open_gap = False
            ends = [b for a, b in _gaps(ordered) if start - GAP_S <= a < limit and b > start]
            entry[f"{stream}_s"] = round(max(ends) - start, 3) if ends else 0.0
            if open_gap and ends and max(ends) == end_t:
                entry["not_recovered"].append(stream)
        entry["recovery_s"] = max(entry["ledger_s"], entry["topic_s"])
        per_fault.append(entry)
    tail_acks = {s: sum(1 for t in times if tail_from is not None and t >= tail_from) for s, times in rec.acks.items()}
    return {"per_fault": per_fault, "max_s": max((e["recovery_s"] for e in per_fault), default=0.0),
            "tail_acks": tail_acks}


# ------------------------------------------------------------------------------------------------ verdict
def violations(report: dict) -> list[str]:
    out = []
    for part in ("ledgers", "topic"):
        counts = report.get(part, {})
        for key in ("lost", "reordered", "divergent", "read_errors"):
            if counts.get(key):
                out.append(f"{part}: {key} = {counts[key]}")
    if report.get("topic", {}).get("duplicates"):
        out.append(f"topic: duplicates = {report['topic']['duplicates']} (dedup is on: none is documented)")
    if report.get("ledgers", {}).get("not_closed"):
        out.append(f"ledgers: {report['ledgers']['not_closed']} not CLOSED after recovery")
    tail = report.get("recovery", {}).get("tail_acks", {})
    for stream, n in tail.items():
        if not n:
            out.append(f"liveness: no {stream} acknowledgement in the tail after the last fault was healed")
    audit = report.get("audit", {})
    judged = audit.get("judged")
    if judged is not None and audit.get("verdict") in ("clean", "violations"):
        out.extend(f"audit: {p}" for p in judged["problems"])
    elif audit.get("verdict") != "clean":
        out.append(f"audit: {audit.get('verdict')} (exit {audit.get('exit_status')})")
    out.extend(p for p in report.get("problems", []) if p.startswith("unexpected exit") or "torn tail" in p)
    out.extend(report.get("failed_checks", []))
    return out


# ------------------------------------------------------------------------------------------------ text
def render_text(report: dict) -> str:
    lines = [f"chaos {report['scenario']} seed {report['seed']}{' (secure)' if report.get('secure') else ''}: "
             f"{report['verdict']} "
             f"({report.get('elapsed_s', '?')} s, run dir {report['run_dir']})", "", "timeline:"]
    for e in report.get("timeline", []):
        extra = f" ({e['seconds']:.2f} s)" if "seconds" in e else ""
        lines.append(f"  {e['t']:7.2f}s  {e['kind']:<9} {e['what']}{extra}")
    lines.append("")
    lines.append("throughput (acks/s; baseline before the first fault -> lowest second after it):")
    for stream, t in report.get("throughput", {}).items():
        lines.append(f"  {stream:<6} baseline {t['baseline_per_s']}  low {t['min_per_s_after_first_fault']}  "
                     f"dip {t['dip_fraction']}")
    lines.append("recovery (fault -> acknowledgements flowing again):")
    for f in report.get("recovery", {}).get("per_fault", []):
        lines.append(f"  {f['t']:7.2f}s {f['action']:<14} {f['victims']:<20} ledger {f['ledger_s']:.2f} s  "
                     f"topic {f['topic_s']:.2f} s"
                     + (f"  (not recovered: {', '.join(f['not_recovered'])})" if f.get("not_recovered") else ""))
    led, top = report.get("ledgers", {}), report.get("topic", {})
    lines.append(f"ledgers: {led.get('ledgers')} ledgers, {led.get('acknowledged')} entries acknowledged; lost "
                 f"{led.get('lost')}, reordered {led.get('reordered')}, divergent {led.get('divergent')}, "
                 f"recovered at the end {led.get('recovered_at_end')}, not closed {led.get('not_closed')}, "
                 f"unconfirmed kept {led.get('unconfirmed_present')}")
    lines.append(f"topic: {top.get('acknowledged')}/{top.get('sent')} messages receipted; lost {top.get('lost')}, "
                 f"duplicates {top.get('duplicates')}, reordered {top.get('reordered')}, divergent "
                 f"{top.get('divergent')}, failed sends {top.get('failed_sends')}")
    for r in report.get("rereplication", []):
        took = "NOT within the bound" if r["rereplication_s"] is None else f"in {r['rereplication_s']:.2f} s"
        lines.append(f"rereplication: {r['cause']} of {r['bookie']} at {r['t']:.2f}s -> every closed ledger fully "
                     f"replicated {took}")
    audit = report.get("audit", {})
    lines.append(f"audit: {audit.get('verdict')} ({audit.get('seconds', '?')} s)")
    for p in report.get("problems", []):
        lines.append(f"problem: {p.splitlines()[0]}")
    for v in report.get("violations", []):
        lines.append(f"VIOLATION: {v}")
    for f in (led.get("findings", []) + top.get("findings", []))[:20]:
        lines.append(f"  finding: {f}")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ html
def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: list[str], rows: list[list]) -> str:
    if not rows:
        return "<p class=muted>None.</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _acks_svg(stream: str, t: dict, fault_times: list[float], w: int = 640, h: int = 120) -> str:
    """Acknowledgements per second of one stream as a polyline, each fault a red line at its second."""
    series = t.get("per_second") or []
    if not series:
        return f"<p class=muted>{_e(stream)}: no acknowledgement recorded.</p>"
    top = max(max(series), 1)
    step = w / max(len(series) - 1, 1)
    points = " ".join(f"{i * step:.1f},{h - 14 - v / top * (h - 24):.1f}" for i, v in enumerate(series))
    faults = "".join(f'<line x1="{ft * step:.1f}" x2="{ft * step:.1f}" y1="0" y2="{h - 14}" stroke="var(--bad)" '
                     f'stroke-dasharray="3 2"/>' for ft in fault_times if 0 <= ft <= len(series) - 1)
    return (f'<div><h3>{_e(stream)} <span class=muted>baseline {_e(t.get("baseline_per_s"))}/s, lowest after the '
            f'first fault {_e(t.get("min_per_s_after_first_fault"))}/s</span></h3>'
            f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(stream)} acks per second">'
            f'<line x1="0" x2="{w}" y1="{h - 14}" y2="{h - 14}" stroke="var(--line)"/>{faults}'
            f'<polyline fill="none" stroke="var(--accent)" stroke-width="1.5" points="{points}"/>'
            f'<text x="0" y="{h - 2}">0 s</text><text x="{w}" y="{h - 2}" text-anchor="end">{len(series) - 1} s</text>'
            f'<text x="2" y="10">{top}/s</text></svg></div>')


def render_html(report: dict) -> str:
    """report.html: the verdict first, then acknowledgements per second, the timeline, recovery, counts."""
    passed = report.get("verdict") == "PASS"
    faults = [f["t"] for f in report.get("faults") or []]
    led, top, audit = report.get("ledgers", {}), report.get("topic", {}), report.get("audit", {})
    charts = "".join(_acks_svg(s, t, faults) for s, t in (report.get("throughput") or {}).items())
    timeline = [[f"{e['t']:.2f}s", e["kind"], e["what"] + (f" ({e['seconds']:.2f} s)" if "seconds" in e else "")]
                for e in report.get("timeline", [])]
    recovery = [[f"{f['t']:.2f}s", f["action"], f["victims"], f"{f['ledger_s']:.2f}", f"{f['topic_s']:.2f}",
                 ", ".join(f.get("not_recovered", []))] for f in report.get("recovery", {}).get("per_fault", [])]
    counts = [["ledgers", led.get("acknowledged"), led.get("lost"), led.get("duplicates"), led.get("reordered"),
               led.get("divergent")],
              ["topic", top.get("acknowledged"), top.get("lost"), top.get("duplicates"), top.get("reordered"),
               top.get("divergent")]]
    rereplication = [[r["cause"], r["bookie"], f"{r['t']:.2f}s",
                      "NOT within the bound" if r["rereplication_s"] is None else f"{r['rereplication_s']:.2f} s"]
                     for r in report.get("rereplication", [])]
    audit_link = (f'<a href="audit/report.html">the audit\'s report</a> ({_e(audit.get("verdict"))})'
                  if audit else "not run")
    verdict = _e(report.get("verdict"))
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>bksim chaos {_e(report['scenario'])}: {verdict}</title>
<style>
{STYLESHEET}
</style></head><body class=report>
<h1>bksim chaos: {_e(report['scenario'])} <span class=muted>seed {_e(report['seed'])}\
{' (secure)' if report.get('secure') else ''}</span></h1>
<div class="banner {'ok' if passed else 'bad'}">{verdict}{'' if passed else f": {len(report.get('violations', []))} violation(s)"}</div>
<div class=summary><span>{_e(report.get('elapsed_s', '?'))} s</span><span>run dir <code>{_e(report['run_dir'])}</code></span>
<span>audit: {audit_link}</span><span><a href="report.json">report.json</a></span></div>
<h2>Violations</h2>
{''.join(f'<p class=bad>{_e(v)}</p>' for v in report.get('violations', [])) or '<p class=muted>None.</p>'}
<h2>Acknowledgements per second</h2>
<div class=charts>{charts or '<p class=muted>None recorded.</p>'}</div>
<h2>Timeline</h2>
{_table(['t', 'kind', 'what'], timeline)}
<h2>Recovery (fault to acknowledgements flowing again)</h2>
{_table(['t', 'action', 'victims', 'ledger s', 'topic s', 'not recovered'], recovery)}
<h2>What was acknowledged and what became of it</h2>
{_table(['', 'acknowledged', 'lost', 'duplicates', 'reordered', 'divergent'], counts)}
{('<h2>Re-replication</h2>' + _table(['cause', 'bookie', 't', 'every closed ledger fully replicated'], rereplication))
 if rereplication else ''}
<h2>Problems</h2>
{''.join(f'<p>{_e(p.splitlines()[0])}</p>' for p in report.get('problems', [])) or '<p class=muted>None.</p>'}
</body></html>
"""


# ------------------------------------------------------------------------------------------------ campaigns
def summary_row(report: dict) -> dict:
    led, top = report.get("ledgers", {}), report.get("topic", {})
    return {"scenario": report["scenario"], "seed": report["seed"], "verdict": report["verdict"],
            "acknowledged": (led.get("acknowledged") or 0) + (top.get("acknowledged") or 0),
            "lost": (led.get("lost") or 0) + (top.get("lost") or 0),
            "duplicates": (led.get("duplicates") or 0) + (top.get("duplicates") or 0),
            "reordered": (led.get("reordered") or 0) + (top.get("reordered") or 0),
            "divergent": (led.get("divergent") or 0) + (top.get("divergent") or 0),
            "audit": _audit_column(report.get("audit", {})),
            "recovery_s": report.get("recovery", {}).get("max_s"),
            "elapsed_s": report.get("elapsed_s"), "run_dir": report["run_dir"],
            "violations": report.get("violations", [])}


def _audit_column(audit: dict) -> str:
    """clean; or, where copies were destroyed on purpose, whether the audit reported exactly those."""
    judged = audit.get("judged")
    if judged is None or audit.get("verdict") not in ("clean", "violations"):
        return audit.get("verdict", "not run")
    return "unexpected findings" if judged["problems"] else "lost copies reported"


def summary_table(rows: list[dict]) -> str:
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["scenario"], []).append(r)
    header = ("| scenario | runs | acknowledged ops | lost | duplicates | reordered | divergent | audit | "
              "median recovery (s) | failed runs |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    groups = sorted(by.items()) + ([("**all**", rows)] if len(by) > 1 else [])
    for name, group in groups:
        audits = collections.Counter(r["audit"] for r in group)
        audit = ", ".join(f"{k} {v}" for k, v in sorted(audits.items()))
        rec = [r["recovery_s"] for r in group if r["recovery_s"] is not None]
        median = f"{statistics.median(rec):.2f}" if rec else "-"
        lines.append(f"| {name} | {len(group)} | {sum(r['acknowledged'] for r in group):,} | "
                     f"{sum(r['lost'] for r in group)} | {sum(r['duplicates'] for r in group)} | "
                     f"{sum(r['reordered'] for r in group)} | {sum(r['divergent'] for r in group)} | {audit} | "
                     f"{median} | {sum(1 for r in group if r['verdict'] != 'PASS')} |")
    return "\n".join(lines)
