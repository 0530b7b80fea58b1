"""report.html: the report as a page a person reads — the verdict first, then charts and tables.

Made from report.json alone (so it can be regenerated): a verdict banner with the totals, a chart of how many
bookies hold each checked entry (replica-count histogram), a chart of each bookie's volume, the violations,
what is reported but not a violation, the benign findings and counts, warnings, per-ledger summaries, inputs
and run facts. Charts are inline SVG drawn here (no plotting library, no scripts, no external resources); the
stylesheet is bksim's one (formats/style.py, the broker dashboard's), embedded.
Tables show at most ROWS_MAX rows each; report.json has the rest.
"""
from __future__ import annotations

import html
import os

from bksim.formats.style import STYLESHEET

ROWS_MAX = 500
BAR_COLOURS = ("#3b7dd8", "#8fb8ef")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _num(n) -> str:
    return f"{n:,}" if isinstance(n, int) else _e(n)


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def histogram_svg(histogram: dict[str, int], qa: set[int], qw: set[int]) -> str:
    """Vertical bars: entries held by k bookies, for each k. Bars below the smallest Qa in red."""
    if not histogram:
        return "<p class=muted>No entry was checked (no ledger with a confirmed end).</p>"
    keys = sorted(int(k) for k in histogram)
    top = max(histogram.values())
    width, height, left, bottom = 60 * max(len(keys), 3) + 80, 220, 70, 40
    bar_w = 40
    parts = [f'<svg width="{width}" height="{height + bottom + 10}" role="img" aria-label="replica histogram">']
    parts.append(f'<line x1="{left}" y1="{height}" x2="{width - 10}" y2="{height}" stroke="#555"/>')
    for frac in (0, 0.5, 1):
        y = height - frac * (height - 20)
        parts.append(f'<text x="{left - 6}" y="{y + 4:.0f}" text-anchor="end" font-size="11">{_num(round(top * frac))}</text>')
    qa_min = min(qa) if qa else 1
    qw_min = min(qw) if qw else 1
    for i, k in enumerate(keys):
        n = histogram[str(k)]
        h = 0 if top == 0 else (height - 20) * n / top
        x = left + 20 + i * 60
        colour = "#d64545" if k < qa_min else "#e6a23c" if k < qw_min else BAR_COLOURS[0]
        parts.append(f'<rect x="{x}" y="{height - h:.1f}" width="{bar_w}" height="{h:.1f}" fill="{colour}">'
                     f'<title>{_num(n)} entries held by {k} bookie(s)</title></rect>')
        parts.append(f'<text x="{x + bar_w / 2}" y="{height - h - 4:.1f}" text-anchor="middle" font-size="11">{_num(n)}</text>')
        parts.append(f'<text x="{x + bar_w / 2}" y="{height + 16}" text-anchor="middle" font-size="12">{k}</text>')
    parts.append(f'<text x="{left + 20}" y="{height + 34}" font-size="12">bookies holding the entry '
                 f'(red: below Qa, amber: below Qw)</text></svg>')
    return "".join(parts)


def bookies_svg(per_bookie: list[dict]) -> str:
    """Horizontal stacked bars per bookie: journal bytes and entry log bytes."""
    if not per_bookie:
        return "<p class=muted>No bookie files.</p>"
    top = max(b["journal_bytes"] + b["entrylog_bytes"] for b in per_bookie) or 1
    label_w, bar_max, row_h = 170, 460, 26
    height = row_h * len(per_bookie) + 30
    parts = [f'<svg width="{label_w + bar_max + 200}" height="{height}" role="img" aria-label="per-bookie volume">']
    for i, b in enumerate(per_bookie):
        y = 10 + i * row_h
        jw = bar_max * b["journal_bytes"] / top
        lw = bar_max * b["entrylog_bytes"] / top
        parts.append(f'<text x="{label_w - 8}" y="{y + 14}" text-anchor="end" font-size="12">{_e(b["bookie"])}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{jw:.1f}" height="18" fill="{BAR_COLOURS[0]}">'
                     f'<title>journals: {_bytes(b["journal_bytes"])}, {_num(b["journal_records"])} records</title></rect>')
        parts.append(f'<rect x="{label_w + jw:.1f}" y="{y}" width="{lw:.1f}" height="18" fill="{BAR_COLOURS[1]}">'
                     f'<title>entry logs: {_bytes(b["entrylog_bytes"])}, {_num(b["entrylog_records"])} entries</title></rect>')
        parts.append(f'<text x="{label_w + jw + lw + 6:.1f}" y="{y + 14}" font-size="11">'
                     f'{_bytes(b["journal_bytes"] + b["entrylog_bytes"])}, {_num(b["copies"])} copies</text>')
    y = 10 + len(per_bookie) * row_h
    parts.append(f'<rect x="{label_w}" y="{y}" width="12" height="10" fill="{BAR_COLOURS[0]}"/>'
                 f'<text x="{label_w + 16}" y="{y + 9}" font-size="11">journals</text>'
                 f'<rect x="{label_w + 90}" y="{y}" width="12" height="10" fill="{BAR_COLOURS[1]}"/>'
                 f'<text x="{label_w + 106}" y="{y + 9}" font-size="11">entry logs</text></svg>')
    return "".join(parts)


def _table(headers: list[str], rows: list[list], total: int | None = None) -> str:
    if not rows:
        return "<p class=muted>None.</p>"
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>"]
    for row in rows[:ROWS_MAX]:
        out.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    out.append("</table>")
    total = len(rows) if total is None else total
    if total > min(len(rows), ROWS_MAX):
        out.append(f"<p class=muted>{_num(min(len(rows), ROWS_MAX))} of {_num(total)} shown; report.json lists "
                   f"more (its counts are exact).</p>")
    return "".join(out)


def _finding_rows(findings: list[dict]) -> list[list]:
    rows = []
    for f in findings:
        entries = "" if "first_entry" not in f else (
            f"{f['first_entry']}" if f["first_entry"] == f["last_entry"] else f"{f['first_entry']}–{f['last_entry']} ({_num(f['entries'])})")
        where = "" if "file" not in f else f"{_e(f['file'])}@{f.get('offset', '')}"
        rows.append([f"<b>{_e(f['rule'])}</b>", _e(f.get("invariant", "")), _e(f.get("ledger", "")), entries,
                     _e(f.get("bookie", "")), f"<code>{where}</code>", _e(f["detail"])])
    return rows


FINDING_HEADERS = ["rule", "invariant", "ledger", "entries", "bookie", "file@offset", "detail"]


def render(report: dict) -> str:
    t = report["totals"]
    clean = report["verdict"] == "clean"
    counts = report["rule_counts"]
    quorums = [lg["quorum"] for lg in report["ledgers"] if lg["quorum"]]
    banner = ("CLEAN: no violation found" if clean else
              f"VIOLATIONS: {_num(t['violations'])} finding(s) break the cluster's promises")
    summary = [
        f"{_num(t['bookies'])} bookies", f"{_num(t['journal_files'])} journals, {_num(t['entrylog_files'])} entry logs",
        f"{_bytes(t['bytes'])}", f"{_num(t['records'])} journal records", f"{_num(t['ledgers'])} ledgers",
        f"{_num(t['entries_checked'])} entries checked",
        f"{_num(t['under_replicated_entries'])} under-replicated", f"{_num(t['unverifiable_entries'])} unverifiable"]
    rule_rows = [[_e(rule), _e(c["class"]), _num(c["findings"]), _num(c["entries"])] for rule, c in counts.items()]
    ledger_rows = [[_e(lg["ledger"]), _e(lg["state"]), _e(lg["last_entry_id"]), _e(lg["confirmed_end"]),
                    _e("/".join(map(str, lg["quorum"])) if lg["quorum"] else ""), _num(lg["entries"]),
                    _num(lg["copies"]), _e(", ".join(f"{k}:{v}" for k, v in lg["histogram"].items())),
                    _num(lg["violations"]), _e(", ".join(f"{k} {v}" for k, v in lg["benign"].items()))]
                   for lg in report["ledgers"]]
    bookie_rows = [[_e(b["bookie"]), _e(b["evidence"]), _num(b["journals"]),
                    _e(f"{b['journal_ids'][0]}–{b['journal_ids'][1]}" if b["journal_ids"] else ""),
                    _e(f"{b['lastmark']['journal_id']}@{b['lastmark']['offset']}" if b["lastmark"] else "unknown"),
                    _num(b["entry_logs"]), _e("; ".join(b["notes"]))] for b in report["inputs"]["bookies"]]
    run = report.get("run", {})
    run_rows = [[_e(k), f"<code>{_e(v)}</code>"] for k, v in run.items()]
    md = report["inputs"]["metadata"]
    benign_rows = [[_e(k), _num(v)] for k, v in report["benign_counts"].items()]
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8><title>bksim audit: {_e(report['verdict'])}</title>
<style>
{STYLESHEET}
</style></head><body class=report>
<h1>bksim journal audit</h1>
<div class="banner {'ok' if clean else 'bad'}">{banner}</div>
<div class=summary>{''.join(f'<span>{s}</span>' for s in summary)}</div>
<div class=charts>
<div><h2>Replicas per checked entry</h2>{histogram_svg(report['replica_histogram'], {q[2] for q in quorums}, {q[1] for q in quorums})}</div>
<div><h2>Volume per bookie</h2>{bookies_svg(report['per_bookie'])}</div>
</div>
<h2>Violations</h2>
{_table(FINDING_HEADERS, _finding_rows(report['violations']), t['violations'])}
<h2>Reported, not violations</h2>
<p class=muted>under_replicated: held by at least Qa but fewer than Qw bookies of the segment. unverifiable: fewer
than Qa holders where a bookie of the segment has no complete history in the inputs.</p>
{_table(FINDING_HEADERS, _finding_rows(report['reported']))}
<h2>Benign</h2>
{_table(['what', 'count'], benign_rows)}
{_table(FINDING_HEADERS, _finding_rows(report['benign']))}
<h2>Rules that found something</h2>
{_table(['rule', 'class', 'findings', 'entries'], rule_rows)}
<h2>Warnings</h2>
{''.join(f'<p>{_e(w)}</p>' for w in report['warnings']) or '<p class=muted>None.</p>'}
<h2>Ledgers</h2>
{_table(['ledger', 'state', 'last entry', 'confirmed end', 'E/Qw/Qa', 'entries', 'copies', 'holders:entries',
         'violations', 'benign'], ledger_rows)}
<h2>Inputs</h2>
<p>Metadata: {_e(md['source'])}, {_num(md['ledgers'])} ledgers ({_e(md['states'])}), instance {_e(md['instance_id'])},
{_num(md['unreadable'])} unreadable, {_num(md['managed_ledger_nodes'])} /managed-ledgers nodes.</p>
{_table(['bookie', 'evidence', 'journals', 'journal ids', 'checkpoint mark', 'entry logs', 'notes'], bookie_rows)}
<h2>Run</h2>
{_table(['', ''], run_rows)}
</body></html>
"""


def write_html(report: dict, out_dir: str) -> str:
    path = os.path.join(out_dir, "report.html")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(render(report))
    os.replace(tmp, path)
    return path
