"""targets: every performance target in one table, each row measured in this run, with its verdict
(`bksim perf targets`).

The rows (ROWS, in this order; name: what is measured, the target):

- bookie-add: bookie-add / grpc-baseline records/s, 1 KiB x 100, 8 batches in flight (perf/bookie_add.py): >= 0.6x.
- ledger-write: ledger-write's closed loop (E3/Qw3/Qa2, 1 KiB x 100, window 16) / grpc-baseline records/s with the
  same entry size, batch and window (perf/ledger_write.py): >= 0.18x.
- ledger-write-p99: the open loop at half that closed loop's entries/s, p99: <= 15 ms.
- consume-e2e: end-to-end p99 at 10,000 msgs/s of 100 B, producer and consumer in one process (perf/consume.py):
  <= 25 ms.
- consume-backlog: a backlog consumed / the same backlog produced, msgs/s of 100 B (perf/consume.py): >= 1.2x.
- replay: the bookie's journal replay on start-up / a bare parse of the same journals, records/s (perf/replay.py):
  >= 0.5x.
- bookie-rss: the bookie's peak resident set (VmHWM) over a sustained bookie-add (perf/bookie_add.py): <= its
  write cache + 150 MB.

Each row is judged by the code its benchmark judges itself with (its Ratio or its target function) on what that
benchmark's functions measured here, in this process, so this table and the row's own command state the same
verdict for the same figures. The measurements run one after another, never two at once; one measurement serves
the rows that share it (ledger-write --both: ledger-write and ledger-write-p99; consume: consume-e2e and
consume-backlog). A measurement that fails marks its rows FAILED and the next one still runs.
"""
from __future__ import annotations

import dataclasses
import traceback
from dataclasses import dataclass
from typing import Callable

from bksim.model.config import Config
from bksim.perf import bookie_add, consume, ledger_write, produce, replay
from bksim.perf.grpc_baseline import INFLIGHT_DEFAULT
from bksim.perf.stats import Ratio, Result

RECORD_BYTES = 1024  # bookie-add, ledger-write and replay entries
BATCH = 100  # bookie-add and ledger-write records per request
LEDGER_SHAPE = ledger_write.Shape(3, 3, 2)
RSS_SECONDS_DEFAULT = 60.0
REPLAY_SIZE_DEFAULT = "256MB"
SUSTAINED = "bookie-add-rss"  # the bookie-rss row's result (a bookie-add run of rss_seconds)

Judge = Callable[[list[Result], list[Ratio]], tuple[str, "bool | None"]]


@dataclass(frozen=True)
class Settings:
    seconds: float  # time bound of the short measurements
    rss_seconds: float  # the bookie-rss row's sustained bookie-add
    replay_size: str  # the replay row's journal bytes as given ("256MB") ...
    replay_bytes: int  # ... and parsed
    config: Config
    config_path: str | None = None
    keep: bool = False
    log: Callable[[str], None] = print

    def command(self, perf_args: str, own_config: bool = False) -> str:
        """`bksim perf <perf_args>` with this run's configuration file: as the benchmark's own --config when it
        has one (it shadows bksim's), else as bksim's."""
        if not self.config_path:
            return f"bksim perf {perf_args}"
        if own_config:
            return f"bksim perf {perf_args} --config {self.config_path}"
        return f"bksim --config {self.config_path} perf {perf_args}"


@dataclass(frozen=True)
class Row:
    name: str
    what: str
    target: str
    measurement: str  # key of MEASUREMENTS
    command: Callable[[Settings], str]  # the command that measures this row alone
    judge: Judge


@dataclass(frozen=True)
class Outcome:
    row: str
    value: str
    target: str
    met: bool | None
    command: str
    error: str = ""  # the measurement or the judgement failed

    @property
    def verdict(self) -> str:
        return verdict(self.met, self.error)

    def to_json(self) -> dict:
        out = {"row": self.row, "value": self.value, "target": self.target, "verdict": self.verdict,
               "met": self.met, "command": self.command}
        if self.error:
            out["error"] = self.error
        return out


def verdict(met: bool | None, error: str = "") -> str:
    """FAILED (a measurement failed), MET, NOT MET, or NOT ESTABLISHED (the run cannot say)."""
    if error:
        return "FAILED"
    return {True: "MET", False: "NOT MET", None: "NOT ESTABLISHED"}[met]


# ---------------------------------------------------------------------------------------------- judges
def _named(results: list[Result], name: str) -> Result:
    found = [r for r in results if r.name == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} results named {name!r} (expected 1)")
    return found[0]


def ratio_judge(subject: str, baseline: str, unit: str) -> Judge:
    """A row judged by the Ratio subject / baseline of its benchmark."""
    def judge(results: list[Result], ratios: list[Ratio]) -> tuple[str, bool | None]:
        found = [q for q in ratios if (q.subject, q.baseline) == (subject, baseline)]
        if len(found) != 1:
            raise LookupError(f"{len(found)} ratios {subject} / {baseline} (expected 1)")
        q = found[0]
        s, b = _named(results, subject), _named(results, baseline)
        return (f"{q.records_per_s_ratio:.2f}x ({subject} {s.records_per_s:,.0f} vs {baseline} "
                f"{b.records_per_s:,.0f} {unit}/s)"), q.met
    return judge


def target_judge(pick: Callable[[list[Result]], dict]) -> Judge:
    """A row judged by one of its benchmark's target functions ({"target", "value", "met"})."""
    def judge(results: list[Result], ratios: list[Ratio]) -> tuple[str, bool | None]:
        t = pick(results)
        return t["value"], t["met"]
    return judge


def _ledger_closed(results: list[Result]) -> dict:
    return ledger_write.closed_loop_target(_named(results, "ledger-write"), _named(results, "grpc-baseline"))


def _ledger_open(results: list[Result]) -> dict:
    return ledger_write.open_loop_target(_named(results, "ledger-open-loop"), _named(results, "ledger-write"))


def _consume_e2e(results: list[Result]) -> dict:
    return consume.e2e_target(_named(results, "consume-e2e"))


def _bookie_rss(results: list[Result]) -> dict:
    [t] = bookie_add.targets([_named(results, SUSTAINED)])
    return t


# ---------------------------------------------------------------------------------------------- measurements
Measured = tuple[list[Result], list[Ratio], list[dict]]


def _measure_bookie_add(workdir: str, s: Settings, idle: Callable[[str], float], rows: set[str]) -> Measured:
    return bookie_add.measure_against_baseline(workdir, RECORD_BYTES, BATCH, INFLIGHT_DEFAULT, s.seconds, 0, idle,
                                               s.config, config_path=s.config_path, keep=s.keep)


def _measure_ledger_write(workdir: str, s: Settings, idle: Callable[[str], float], rows: set[str]) -> Measured:
    both = "ledger-write-p99" in rows
    common = dict(config_path=s.config_path, keep=s.keep, half_after_max=both)
    if "ledger-write" not in rows:  # the open loop alone needs no baseline
        results = ledger_write.measure(workdir, LEDGER_SHAPE, RECORD_BYTES, BATCH, ledger_write.WINDOW_DEFAULT,
                                       s.seconds, 0, [None], idle, s.config, **common)
        return results, [], ledger_write.targets(results)
    return ledger_write.measure_against_baseline(workdir, LEDGER_SHAPE, RECORD_BYTES, BATCH,
                                                 ledger_write.WINDOW_DEFAULT, s.seconds, 0, [None], idle, s.config,
                                                 **common)


def _measure_consume(workdir: str, s: Settings, idle: Callable[[str], float], rows: set[str]) -> Measured:
    results = consume.measure(workdir, LEDGER_SHAPE, produce.MESSAGE_BYTES_DEFAULT, produce.BATCH_DEFAULT,
                              produce.MAX_PENDING_DEFAULT, 0, s.seconds, 0, consume.RECEIVER_QUEUE_DEFAULT,
                              consume.E2E_RATE_DEFAULT, idle, s.config, config_path=s.config_path, keep=s.keep)
    return results, consume.ratios(results), produce.targets(results) + consume.targets(results)


def _measure_replay(workdir: str, s: Settings, idle: Callable[[str], float], rows: set[str]) -> Measured:
    results, ratios = replay.measure(workdir, replay.Shape(s.replay_bytes, RECORD_BYTES), idle, s.config, log=s.log)
    return results, ratios, []


def _measure_bookie_rss(workdir: str, s: Settings, idle: Callable[[str], float], rows: set[str]) -> Measured:
    r = bookie_add.measure(workdir, RECORD_BYTES, BATCH, INFLIGHT_DEFAULT, s.rss_seconds, 0, idle, s.config,
                           config_path=s.config_path, keep=s.keep)
    r = dataclasses.replace(r, name=SUSTAINED)
    return [r], [], bookie_add.targets([r])


MEASUREMENTS: dict[str, Callable[[str, Settings, Callable[[str], float], set[str]], Measured]] = {
    "bookie-add": _measure_bookie_add, "ledger-write": _measure_ledger_write, "consume": _measure_consume,
    "replay": _measure_replay, "bookie-rss": _measure_bookie_rss,
}

ROWS: tuple[Row, ...] = (
    Row("bookie-add", "bookie-add vs grpc-baseline (1 KiB x 100)", f">= {bookie_add.TARGET_RATIO:.2f}x grpc-baseline",
        "bookie-add",
        lambda s: s.command(f"bookie-add --batch {BATCH} --record-bytes {RECORD_BYTES} --seconds {s.seconds:g}"),
        ratio_judge("bookie-add", "grpc-baseline", "records")),
    Row("ledger-write", f"ledger-write {LEDGER_SHAPE} vs grpc-baseline (closed loop, 1 KiB x {BATCH})",
        f">= {ledger_write.TARGET_RATIO:.2f}x grpc-baseline", "ledger-write",
        lambda s: s.command(f"ledger-write --entry-size {RECORD_BYTES} --batch {BATCH} --duration {s.seconds:g}"),
        target_judge(_ledger_closed)),
    Row("ledger-write-p99", "ledger-write open loop at half the closed-loop rate, p99",
        f"p99 <= {ledger_write.TARGET_P99_MS:g} ms", "ledger-write",
        lambda s: s.command(f"ledger-write --both --entry-size {RECORD_BYTES} --batch {BATCH} "
                            f"--duration {s.seconds:g}"),
        target_judge(_ledger_open)),
    Row("consume-e2e", f"consume-e2e at {consume.TARGET_E2E_RATE:,.0f} msgs/s, p99 (producer and consumer in one "
                       f"process)", f"p99 <= {consume.TARGET_E2E_P99_MS:g} ms", "consume",
        lambda s: s.command(f"consume --seconds {s.seconds:g}"),
        target_judge(_consume_e2e)),
    Row("consume-backlog", "consume backlog vs produce in the same run",
        f">= {consume.TARGET_RATIO_TO_PRODUCE:.2f}x produce", "consume",
        lambda s: s.command(f"consume --seconds {s.seconds:g}"),
        ratio_judge("consume", "produce-backlog", "msgs")),
    Row("replay", "bookie restart: journal replay rate vs bare parse", f">= {replay.TARGET_RATIO:.2f}x bare parse",
        "replay",
        lambda s: s.command(f"replay --size {s.replay_size}", own_config=True),
        ratio_judge("journal-replay", "journal-parse", "records")),
    Row("bookie-rss", "bookie RSS peak under sustained bookie-add",
        f"<= write cache + {bookie_add.RSS_SLACK_MB:g} MB", "bookie-rss",
        lambda s: s.command(f"bookie-add --batch {BATCH} --record-bytes {RECORD_BYTES} --seconds {s.rss_seconds:g}"),
        target_judge(_bookie_rss)),
)
ROW_NAMES = tuple(r.name for r in ROWS)


def select(names: str | None) -> list[Row]:
    """The rows named in `names` (comma-separated; None or "" = all), in table order; ValueError naming any
    unknown one."""
    if not names:
        return list(ROWS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in ROW_NAMES]
    if unknown or not wanted:
        raise ValueError(f"unknown row(s) {', '.join(unknown) or repr(names)}: choose among {', '.join(ROW_NAMES)}")
    return [r for r in ROWS if r.name in wanted]


def describe(rows: list[Row], settings: Settings) -> str:
    """The run's shape for the report's header."""
    parts = [f"{len(rows)} row(s): {', '.join(r.name for r in rows)}; one benchmark at a time"]
    if any(r.measurement == "replay" for r in rows):
        parts.append(f"replay of {settings.replay_size}")
    if any(r.measurement == "bookie-rss" for r in rows):
        parts.append(f"sustained bookie-add {settings.rss_seconds:g} s")
    return "; ".join(parts) + "; short runs"


# ---------------------------------------------------------------------------------------------- the run
COLUMNS = ("row", "measured", "target", "verdict", "command")


def format_rows(outcomes: list[Outcome]) -> str:
    """The table: one line per row (row, measured value, target, verdict, command), columns as wide as their
    widest cell; a failed row shows its error's first line as its value."""
    cells = [COLUMNS] + [(o.row, (o.error.splitlines() or [""])[0] if o.error else o.value, o.target, o.verdict,
                          o.command) for o in outcomes]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join([*(f"{c[i]:<{widths[i]}}" for i in range(len(widths))), c[-1]]).rstrip() for c in cells]
    met = sum(o.met is True and not o.error for o in outcomes)
    lines.append(f"{met} of {len(outcomes)} target(s) met")
    return "\n".join(lines)


class Run:
    """The selected rows' measurements, one after the other, and their outcomes."""

    def __init__(self, rows: list[Row], settings: Settings) -> None:
        self.rows = rows
        self.settings = settings
        self.outcomes: list[Outcome] = []

    @property
    def failed(self) -> bool:
        return any(o.error for o in self.outcomes)

    def measure(self, workdir: str, idle: Callable[[str], float]) -> Measured:
        """The harness's measure: every selected measurement in turn; (results, ratios, the benchmarks' targets)."""
        results: list[Result] = []
        ratios: list[Ratio] = []
        targets: list[dict] = []
        outcomes: dict[str, Outcome] = {}
        for key in dict.fromkeys(r.measurement for r in self.rows):
            mine = [r for r in self.rows if r.measurement == key]
            try:
                got = MEASUREMENTS[key](workdir, self.settings, idle, {r.name for r in mine})
            except Exception as e:  # noqa: BLE001 - reported in the table; the next measurement still runs
                self.settings.log(f"# measurement {key} failed:\n{traceback.format_exc().rstrip()}")
                for r in mine:
                    outcomes[r.name] = self._outcome(r, "", None, f"{type(e).__name__}: {e}")
                continue
            results += got[0]
            ratios += got[1]
            targets += got[2]
            for r in mine:
                try:
                    value, met = r.judge(got[0], got[1])
                except (LookupError, ValueError) as e:
                    outcomes[r.name] = self._outcome(r, "", None, f"{type(e).__name__}: {e}")
                else:
                    outcomes[r.name] = self._outcome(r, value, met)
        self.outcomes = [outcomes[r.name] for r in self.rows]
        return results, ratios, targets

    def _outcome(self, row: Row, value: str, met: bool | None, error: str = "") -> Outcome:
        return Outcome(row.name, value, row.target, met, row.command(self.settings), error)

    def summary(self) -> tuple[str, dict]:
        """The harness's summary: the table, and {"rows": [...]} for the JSON object."""
        return "\n" + format_rows(self.outcomes), {"rows": [o.to_json() for o in self.outcomes]}
