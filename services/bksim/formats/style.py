"""The one stylesheet of bksim's web pages: the broker's live dashboard (served at /dashboard/static/bksim.css),
the chaos report and the audit report (embedded in their self-contained HTML files).

Contract: plain CSS, no external URLs (fonts are the system's), light and dark schemes by
`prefers-color-scheme`. State colours are named once here and used by class: `.ok` (writable, passed, acked),
`.warn` (read-only, backlog, skipped), `.bad` (down, failed, ack hole), `.info` (open, current). Report pages
use `<body class=report>` and a verdict banner `<div class="banner ok|bad">`. Pages may add rules of their own
after it; they do not redefine these.
"""
from __future__ import annotations

STYLESHEET = """\
:root {
  --bg: #f6f7f9; --panel: #ffffff; --fg: #1d2330; --muted: #667085; --line: #e4e7ec;
  --ok: #12b76a; --ok-bg: #ecfdf3; --warn: #f79009; --warn-bg: #fffaeb; --bad: #f04438; --bad-bg: #fef3f2;
  --info: #2e90fa; --info-bg: #eff8ff; --accent: #6172f3;
  --stripe-0: #6172f3; --stripe-1: #12b76a; --stripe-2: #f79009; --stripe-3: #ee46bc; --stripe-4: #15b79e;
  --stripe-5: #875bf7; --stripe-6: #ef6820; --stripe-7: #2e90fa;
  --mono: ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace;
  --sans: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", Roboto, Helvetica, Arial, sans-serif;
}
@media (prefers-color-scheme: dark) {
  :root { --bg: #0f131a; --panel: #171c26; --fg: #e6e9ef; --muted: #98a2b3; --line: #2a3140;
          --ok-bg: #053321; --warn-bg: #4e1d09; --bad-bg: #55160c; --info-bg: #102a56; }
}
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg); font: 14px/1.45 var(--sans); }
header.bar { display: flex; align-items: baseline; gap: 16px; padding: 14px 24px; background: var(--panel);
             border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 2; }
header.bar h1 { font-size: 18px; margin: 0; letter-spacing: .2px; }
header.bar .sub { color: var(--muted); font-size: 13px; }
header.bar .right { margin-left: auto; color: var(--muted); font-size: 12px; }
main { padding: 18px 24px 40px; max-width: 1600px; margin: 0 auto; }
h1 { font-size: 20px; } h2 { font-size: 15px; margin: 0 0 10px; } h3 { font-size: 13px; margin: 8px 0 4px; }
.grid { display: grid; gap: 16px; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); }
.panel, section.card { background: var(--panel); border: 1px solid var(--line); border-radius: 10px;
                       padding: 14px 16px; margin-bottom: 16px; box-shadow: 0 1px 2px rgba(16,24,40,.04); }
.panel h2 { display: flex; align-items: baseline; gap: 8px; }
.panel h2 .count { color: var(--muted); font-weight: 400; font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th { text-align: left; color: var(--muted); font-weight: 600; font-size: 11px; text-transform: uppercase;
     letter-spacing: .4px; border-bottom: 1px solid var(--line); padding: 6px 8px; }
td { border-bottom: 1px solid var(--line); padding: 6px 8px; vertical-align: middle; }
tr:last-child td { border-bottom: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: var(--mono); font-size: 12px; }
.muted { color: var(--muted); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 999px; font-size: 11px; font-weight: 600;
         border: 1px solid transparent; white-space: nowrap; }
.ok { color: var(--ok); } .warn { color: var(--warn); } .bad { color: var(--bad); } .info { color: var(--info); }
.badge.ok { background: var(--ok-bg); border-color: var(--ok); }
.badge.warn { background: var(--warn-bg); border-color: var(--warn); }
.badge.bad { background: var(--bad-bg); border-color: var(--bad); }
.badge.info { background: var(--info-bg); border-color: var(--info); }
.meter { height: 8px; background: var(--line); border-radius: 4px; overflow: hidden; min-width: 80px; }
.meter > span { display: block; height: 100%; background: var(--ok); }
.meter.warn > span { background: var(--warn); } .meter.bad > span { background: var(--bad); }
.more { color: var(--muted); font-size: 12px; padding-top: 6px; }
.legend { display: flex; gap: 14px; font-size: 12px; color: var(--muted); flex-wrap: wrap; margin: 4px 0 8px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px;
            vertical-align: -1px; }
svg text { font-family: var(--sans); fill: var(--muted); font-size: 10px; }
a { color: var(--accent); }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 8px; overflow: auto; }
/* report pages (audit, chaos): <body class=report>, the verdict in <div class="banner ok|bad"> */
body.report { margin: 24px auto; padding: 0 24px; max-width: 1400px; }
.banner { padding: 14px 18px; border-radius: 10px; font-size: 20px; font-weight: 600; color: white; }
.banner.ok { background: var(--ok); } .banner.bad { background: var(--bad); }
.summary { margin: 10px 0 20px; color: var(--muted); } .summary span { margin-right: 18px; }
body.report table { width: auto; margin: 6px 0 18px; background: var(--panel); border: 1px solid var(--line); }
body.report td { vertical-align: top; }
body.report h2 { margin-top: 28px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
.charts { display: flex; flex-wrap: wrap; gap: 40px; }
"""
