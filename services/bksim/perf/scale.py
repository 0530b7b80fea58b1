"""scale: how cost grows with what a cluster holds, per axis, as a table, a verdict and a PNG chart.

Each axis runs on a fresh cluster of its own (perf/ledger_write.LedgerCluster: a real ZooKeeper, real `bksim bookie
run` processes and, where topics are involved, one `bksim broker run`, under the benchmark's temp dir and stopped by
pid whatever happens), and measures a cost at every point of the axis:

- `topics` (perf/scale_topics.py): N topics on one broker, each with a producer at TOPIC_RATE msgs/s and a
  consumer; broker CPU and RSS per topic, znodes per topic, lookup latency and first-message latency;
- `subscriptions` (perf/scale_topics.py): N subscriptions of one topic, one producer at a fixed rate; broker CPU
  per delivered message;
- `ledgers` (perf/scale_storage.py): N ledgers on one bookie process; index bytes, RSS and restart time per ledger;
- `entry-size` (perf/scale_storage.py): bookie-add's MB/s at each entry size against the fsync and gRPC limits
  at the same size.

Per-unit costs. A cost that has a part independent of the axis (the broker's own idle CPU and memory, a bookie's
start-up) is measured once at zero units on the same cluster (the baseline row), and the per-unit cost at N is
(value at N - value at zero) / N. Latencies and ratios are per operation already and are taken as they are.

Verdict, per cost: factor = the per-unit cost at the largest point / at the smallest (resolved) point. Within 2x
either way (0.5 <= factor <= 2): "roughly flat"; above 2: "grows" by the factor; below 0.5: "falls" by the factor (a
fixed part spread over more units). A cost resolved at fewer than two points has no verdict ("n/a"). The axis's
verdict (a "target" of the report: met = nothing grows) names every cost's.

The chart (matplotlib, one PNG per axis, `scale-<axis>.png` in the PNG directory): one panel per judged cost,
per-unit cost against the axis's points (log scale), with the band within 2x of the smallest resolved point's cost.

Resolution. A per-unit cost whose total change over the baseline is below what its measurement resolves (the
broker's CPU in 10 ms ticks of /proc/PID/stat, RSS against the allocator's noise, a restart's jitter) is shown in
parentheses and left out of the verdict, which then starts at the smallest point where the cost is resolved.
"""
from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Callable

from bksim.model.config import Config
from bksim.perf.machine import process_memory_bytes
from bksim.perf.stats import Result

AXES = ("topics", "subscriptions", "ledgers", "entry-size")
FLAT_FACTOR = 2.0  # "roughly flat": the per-unit cost at the largest point within 2x of the smallest point's
KiB = 1024
MiB = 1024 * 1024
SIZE_SUFFIXES = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB}


# ---------------------------------------------------------------------------------------------- the report
@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: str  # format spec of the value ("" for str)
    width: int = 10


@dataclass(frozen=True)
class Cost:
    """A judged per-unit cost: `key` of the rows, `label` for the verdict and the chart, `unit` of its values."""
    key: str
    label: str
    unit: str = ""


@dataclass
class AxisReport:
    axis: str
    unit: str  # what the points count ("topics", "bytes per entry")
    describe: str  # the axis's set-up, one line
    columns: list[Column]
    costs: list[Cost]
    rows: list[dict] = field(default_factory=list)  # one per point ("points": N); a "baseline" row first or not
    results: list[Result] = field(default_factory=list)  # the rows as harness Results (the common table)
    notes: list[str] = field(default_factory=list)

    @property
    def points(self) -> list[dict]:
        return [r for r in self.rows if not r.get("baseline")]


def resolved(row: dict, key: str, value: float | None, ok: bool) -> None:
    """Put a per-unit cost into `row`; `ok` False: its total change over the baseline is below what the measurement
    resolves (CPU ticks, allocator noise, restart jitter; a decrease is noise too), so it is shown in parentheses and
    not judged."""
    row[key] = value
    if not ok:
        row.setdefault("unresolved", []).append(key)


def _judged_value(row: dict, key: str) -> float | None:
    return None if key in row.get("unresolved", ()) else row.get(key)


def verdict(first: float | None, last: float | None) -> tuple[str, float | None]:
    """("roughly flat" | "grows" | "falls" | "n/a", factor) for per-unit costs at the smallest and largest point."""
    if first is None or last is None or first <= 0 or last < 0:
        return "n/a", None
    factor = last / first
    if factor > FLAT_FACTOR:
        return "grows", factor
    if factor < 1 / FLAT_FACTOR:
        return "falls", factor
    return "roughly flat", factor


def judge(report: AxisReport) -> dict:
    """The axis's verdict as a harness target: {"target", "value", "met", "axis", "verdicts", "points"}."""
    points = report.points
    verdicts = []
    for cost in report.costs:
        # from the smallest point at which the cost is resolved to the largest point
        first = next((p for p in points if (_judged_value(p, cost.key) or 0) > 0), None)
        last = points[-1] if points else None
        if first is None or last is None or first is last:
            word, factor, span = "n/a", None, "fewer than two resolved points"
        else:
            word, factor = verdict(_judged_value(first, cost.key), _judged_value(last, cost.key))
            span = f"{first['points']:,} -> {last['points']:,}"
        verdicts.append({"cost": cost.label, "key": cost.key, "verdict": word, "factor": factor, "span": span})
    judged = [v for v in verdicts if v["verdict"] != "n/a"]
    grows = [v for v in judged if v["verdict"] == "grows"]
    met = None if not judged else not grows
    value = "; ".join(f"{v['cost']} {v['verdict']}" + (f" x{v['factor']:.2f}" if v["factor"] is not None else "")
                      + f" ({v['span']})" for v in verdicts)
    return {"target": f"{report.axis}: every cost per unit at the largest point within {FLAT_FACTOR:g}x of its "
                      f"value at the smallest resolved point",
            "value": value, "met": met, "axis": report.axis, "verdicts": verdicts, "points": report.rows,
            "notes": report.notes}


def verdict_line(report: AxisReport, judged: dict) -> str:
    words = {v["verdict"] for v in judged["verdicts"]} - {"n/a"}
    if judged["met"] is None:
        overall = "n/a (no cost resolved at two points)"
    elif not judged["met"]:
        overall = "GROWS (" + ", ".join(f"{v['cost']} x{v['factor']:.1f}" for v in judged["verdicts"]
                                        if v["verdict"] == "grows") + ")"
    else:
        overall = "roughly flat" if words == {"roughly flat"} else "roughly flat or falling"
    return f"verdict {report.axis}: {overall}; " + judged["value"]


def table(report: AxisReport) -> list[str]:
    """The axis's table: a title, a header, one row per point (the baseline row first, when there is one)."""
    head = "  ".join(f"{c.header:>{c.width}}" for c in report.columns)
    lines = [f"# scale {report.axis}: {report.describe}", head]
    for row in report.rows:
        cells = []
        for c in report.columns:
            v = row.get(c.key)
            if v is None:
                text = "-"
            elif c.fmt:
                text = format(v, c.fmt)
            else:
                text = str(v)
            if c.key in row.get("unresolved", ()):
                text = f"({text})"
            cells.append(f"{text:>{c.width}}")
        lines.append("  ".join(cells))
    if any(r.get("unresolved") for r in report.rows):
        lines.append("# (value): below what the measurement resolves at this point; not judged")
    lines += [f"# {note}" for note in report.notes]
    return lines


def draw(report: AxisReport, path: str) -> None:
    """One panel per judged cost: the per-unit cost at every point, and the band within FLAT_FACTOR of the first."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    points = report.points
    n = max(1, len(report.costs))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = pyplot.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    xs = [p["points"] for p in points]
    for i, cost in enumerate(report.costs):
        ax = axes[i // cols][i % cols]
        pairs = [(x, _judged_value(p, cost.key)) for x, p in zip(xs, points) if _judged_value(p, cost.key) is not None]
        vague = [(x, p.get(cost.key)) for x, p in zip(xs, points)
                 if p.get(cost.key) is not None and cost.key in p.get("unresolved", ())]
        first = next((y for _, y in pairs if y > 0), None)
        if pairs:
            ax.plot([x for x, _ in pairs], [y for _, y in pairs], marker="o", color="C0")
        if first and len(xs) > 1:
            ax.fill_between([min(xs), max(xs)], [first / FLAT_FACTOR] * 2, [first * FLAT_FACTOR] * 2,
                            color="C2", alpha=0.15, label=f"within {FLAT_FACTOR:g}x of the first resolved")
        if pairs:  # the scale of the resolved costs; an unresolved one beyond it is cut off (its value is in the table)
            top = max([y for _, y in pairs] + [first * FLAT_FACTOR if first else 0])
            bottom = min([0.0] + [y for _, y in pairs])
            ax.set_ylim(bottom, top * 1.15 if top > 0 else 1.0)
        if vague:
            ax.plot([x for x, _ in vague], [y for _, y in vague], marker="o", linestyle="none", color="white",
                    markeredgecolor="C0", label="not resolved (value in the table)")
        if vague or (first and len(xs) > 1):
            ax.legend(fontsize=7)
        if len(xs) > 1 and max(xs) / max(1, min(xs)) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(report.unit)
        ax.set_ylabel(cost.unit)
        ax.set_title(cost.label, fontsize=9)
        ax.grid(True, alpha=0.3)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    fig.suptitle(textwrap.fill(f"bksim perf scale {report.axis}: {report.describe}", int(4.2 * cols * 15)), fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    pyplot.close(fig)


# ---------------------------------------------------------------------------------------------- measuring
def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` (VmRSS of /proc/PID/status)."""
    return process_memory_bytes(pid)["rss"]


def dir_bytes(path: str, wanted: Callable[[str], bool] = lambda name: True) -> int:
    """The bytes of every file under `path` whose name is `wanted` (files that vanish while walking are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            if not wanted(name):
                continue
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # maybe: RocksDB or GC deleted it meanwhile
                pass
    return total


def count_znodes(zk) -> int:
    """Every znode of the tree but ZooKeeper's own /zookeeper, walked level by level (asynchronous reads)."""
    total = 0
    level = ["/"]
    while level:
        asyncs = [(path, zk.get_children_async(path)) for path in level]
        level = []
        for path, result in asyncs:
            try:
                children = result.get(timeout=30)
            except Exception as e:  # noqa: BLE001 - NoNodeError: deleted meanwhile
                if type(e).__name__ == "NoNodeError":
                    continue
                raise
            for child in children:
                full = ("" if path == "/" else path) + "/" + child
                if full == "/zookeeper":
                    continue
                total += 1
                level.append(full)
    return total


def parse_points(axis: str, text: str) -> list[int]:
    """"1,10,100" -> [1, 10, 100]; entry sizes may carry K/M suffixes (KiB, MiB): "100,1K,1M". Ascending,
    distinct, positive."""
    out = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        if not item:
            continue
        if axis == "entry-size":
            digits = item.rstrip("kKmMiIbB")
            suffix = item[len(digits):].lower()
            if suffix not in SIZE_SUFFIXES or not digits:
                raise ValueError(f"entry size {item!r} is not a number of bytes (suffixes K, M)")
            value = float(digits) * SIZE_SUFFIXES[suffix]
        else:
            value = float(item)
        if value <= 0 or value != int(value):
            raise ValueError(f"point {item!r} of axis {axis} must be a positive whole number")
        out.append(int(value))
    if not out:
        raise ValueError(f"no points given for axis {axis}")
    if out != sorted(set(out)):
        raise ValueError(f"the points of axis {axis} must be distinct and ascending, got {text!r}")
    return out


def default_points(axis: str) -> list[int]:
    from bksim.perf import scale_storage, scale_topics

    return {"topics": scale_topics.TOPIC_POINTS, "subscriptions": scale_topics.SUBSCRIPTION_POINTS,
            "ledgers": scale_storage.LEDGER_POINTS, "entry-size": scale_storage.ENTRY_SIZE_POINTS}[axis]


def describe(axes: list[str], points: dict[str, list[int]], seconds: float) -> str:
    return "; ".join(f"{a} at {','.join(f'{p:,}' for p in points[a])}" for a in axes) + \
        f"; {seconds:g} s per measurement window"


def measure(workdir: str, axes: list[str], points: dict[str, list[int]], seconds: float, png_dir: str,
            idle: Callable[[str], float], config: Config, config_path: str | None = None, keep: bool = False,
            log: Callable[[str], None] = print) -> tuple[list[Result], list, list[dict]]:
    """Every axis in `axes` on a fresh cluster: its table, verdict and chart (`png_dir`/scale-<axis>.png)."""
    from bksim.perf import scale_storage, scale_topics

    runners = {"topics": scale_topics.measure_topics, "subscriptions": scale_topics.measure_subscriptions,
               "ledgers": scale_storage.measure_ledgers, "entry-size": scale_storage.measure_entry_sizes}
    results: list[Result] = []
    targets: list[dict] = []
    for axis in axes:
        before = idle(f"scale {axis}")  # the full idle wait once per axis; its points sample the idle fraction only
        report = runners[axis](workdir, points[axis], seconds, config, config_path=config_path, keep=keep, log=log,
                               idle_before=before)
        judged = judge(report)
        png = os.path.join(png_dir, f"scale-{axis}.png")
        draw(report, png)
        judged["png"] = os.path.abspath(png)
        for line in table(report) + [verdict_line(report, judged), f"# chart: {png}"]:
            log(line)
        results += report.results
        targets.append(judged)
    return results, [], targets
