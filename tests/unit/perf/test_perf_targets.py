"""perf/targets.py (row selection, verdicts, the table, one measurement per benchmark in turn) and the target
functions its rows are judged by: ledger_write's closed and open loop, consume's end-to-end p99 and its ratio to
the backlog's produce rate."""
from __future__ import annotations

import shlex

import pytest

from bksim.cli.main import build_parser
from bksim.model.config import Config
from bksim.perf import consume, ledger_write, targets
from bksim.perf.stats import LatencyRecorder, make_result, ratio


def result(name: str, records: int, elapsed_s: float = 1.0, p99_ms: float = 5.0, record_bytes: int = 1024,
           group: int = 100, **extra):
    lat = LatencyRecorder()
    lat.add(p99_ms / 1000.0, records)
    return make_result(name, record_bytes, group, elapsed_s, lat, 1.0, extra)


def settings(**kw) -> targets.Settings:
    values = dict(seconds=2.0, rss_seconds=3.0, replay_size="4MB", replay_bytes=4_000_000, config=Config(),
                  log=lambda line: None)
    return targets.Settings(**{**values, **kw})


# ---------------------------------------------------------------------------------------------- rows
def test_every_row_of_the_table_in_order_with_its_target():
    assert targets.ROW_NAMES == ("bookie-add", "ledger-write", "ledger-write-p99", "consume-e2e", "consume-backlog",
                                 "replay", "bookie-rss")
    by_name = {r.name: r.target for r in targets.ROWS}
    assert by_name == {"bookie-add": ">= 0.60x grpc-baseline", "ledger-write": ">= 0.18x grpc-baseline",
                       "ledger-write-p99": "p99 <= 15 ms", "consume-e2e": "p99 <= 25 ms",
                       "consume-backlog": ">= 1.20x produce", "replay": ">= 0.50x bare parse",
                       "bookie-rss": "<= write cache + 150 MB"}


def test_select_keeps_table_order_and_refuses_unknown_rows():
    assert [r.name for r in targets.select(None)] == list(targets.ROW_NAMES)
    assert [r.name for r in targets.select("")] == list(targets.ROW_NAMES)
    assert [r.name for r in targets.select("replay, bookie-add")] == ["bookie-add", "replay"]
    with pytest.raises(ValueError, match="unknown row.*nope.*choose among bookie-add"):
        targets.select("replay,nope")
    with pytest.raises(ValueError):
        targets.select(" , ")


def test_each_rows_command_is_a_bksim_command_with_the_runs_durations():
    s = settings(config_path="my.toml")
    commands = {r.name: r.command(s) for r in targets.ROWS}
    assert commands["bookie-add"] == ("bksim --config my.toml perf bookie-add --batch 100 --record-bytes 1024 "
                                      "--seconds 2")
    assert commands["bookie-rss"].endswith("--seconds 3")
    assert commands["replay"] == "bksim perf replay --size 4MB --config my.toml"  # its own --config shadows bksim's
    assert "--both" in commands["ledger-write-p99"] and "--both" not in commands["ledger-write"]
    parser = build_parser()
    for name, command in commands.items():
        argv = shlex.split(command)
        assert argv[0] == "bksim"
        args = parser.parse_args(argv[1:])  # argparse exits (SystemExit) on an option the command does not have
        assert args.command == "perf" and args.config == "my.toml", name  # the file reaches the benchmark
    assert settings().command("consume --seconds 2") == "bksim perf consume --seconds 2"


def test_verdicts():
    assert [targets.verdict(m) for m in (True, False, None)] == ["MET", "NOT MET", "NOT ESTABLISHED"]
    assert targets.verdict(True, error="boom") == "FAILED"


def test_the_table_has_a_line_per_row_in_aligned_columns_and_the_count_met():
    outcomes = [targets.Outcome("bookie-add", "0.44x (a vs b)", ">= 0.60x grpc-baseline", False, "bksim perf x"),
                targets.Outcome("replay", "0.78x", ">= 0.50x bare parse", True, "bksim perf replay --size 1MB"),
                targets.Outcome("bookie-rss", "", "<= write cache + 150 MB", None, "bksim perf y",
                                error="RuntimeError: bookie exited\nits log: ...")]
    lines = targets.format_rows(outcomes).splitlines()
    assert lines[0].split() == ["row", "measured", "target", "verdict", "command"]
    assert lines[-1] == "1 of 3 target(s) met"
    body = lines[1:-1]
    assert len(body) == 3
    assert body[0].startswith("bookie-add ") and "NOT MET" in body[0] and body[0].endswith("bksim perf x")
    assert "RuntimeError: bookie exited" in body[2] and "its log" not in body[2] and " FAILED " in body[2]
    # columns line up: every cell of a column starts at the same offset
    for column in ("target", "verdict", "command"):
        start = lines[0].index(column)
        assert all(line[start - 2:start] == "  " and line[start] != " " for line in body), column
    assert {o.to_json()["verdict"] for o in outcomes} == {"NOT MET", "MET", "FAILED"}


# ---------------------------------------------------------------------------------------------- judges
def test_a_ratio_row_reads_its_benchmarks_ratio():
    base, subject = result("grpc-baseline", 1000), result("bookie-add", 600)
    judge = targets.ratio_judge("bookie-add", "grpc-baseline", "records")
    value, met = judge([base, subject], [ratio(subject, base, 0.6)])
    assert met is True and value == "0.60x (bookie-add 600 vs grpc-baseline 1,000 records/s)"
    subject = result("bookie-add", 599)
    assert judge([base, subject], [ratio(subject, base, 0.6)])[1] is False
    with pytest.raises(LookupError):
        judge([base, subject], [])


def test_ledger_write_closed_loop_is_judged_against_the_baseline_of_the_run():
    base = result("grpc-baseline", 100_000)
    closed = result("ledger-write", 18_000, mode="closed-loop")
    t = ledger_write.closed_loop_target(closed, base)
    assert t["met"] is True and t["value"].startswith("0.18x: 18,000 entries/s")
    assert ledger_write.closed_loop_target(result("ledger-write", 17_900, mode="closed-loop"), base)["met"] is False
    assert ledger_write.closed_loop_target(closed, None)["met"] is None
    small = result("ledger-write", 50_000, record_bytes=200, mode="closed-loop")
    t = ledger_write.closed_loop_target(small, result("grpc-baseline", 100_000, record_bytes=200))
    assert t["met"] is None and "1 KiB" in t["value"]


def test_ledger_write_open_loop_is_judged_at_half_the_closed_loop_rate():
    closed = result("ledger-write", 30_000, mode="closed-loop")
    assert ledger_write.half_rate(closed.records_per_s) == 15_000  # half the measured rate, whatever it is
    assert ledger_write.half_rate(80_000) == 40_000

    def opened(rate: float, p99_ms: float, unsent: int = 0, **kw):
        return result("ledger-open-loop", int(rate), p99_ms=p99_ms, mode="open-loop", rate_target_per_s=rate,
                      entries_unsent_behind_schedule=unsent, **kw)

    assert ledger_write.open_loop_target(opened(15_000, 15.0), closed)["met"] is True
    assert ledger_write.open_loop_target(opened(15_000, 15.1), closed)["met"] is False
    assert ledger_write.open_loop_target(opened(15_000, 5.0, unsent=100), closed)["met"] is False
    assert ledger_write.open_loop_target(opened(10_000, 5.0), closed)["met"] is None  # below half: not established
    assert ledger_write.open_loop_target(opened(10_000, 16.0), closed)["met"] is False  # fails even below it
    assert ledger_write.open_loop_target(opened(15_000, 5.0), None)["met"] is None
    assert ledger_write.open_loop_target(opened(15_000, 5.0, record_bytes=200), closed)["met"] is None
    # targets() pairs each open loop with the closed loop of the same cluster kind
    got = ledger_write.targets([result("grpc-baseline", 200_000), closed, opened(15_000, 9.0),
                                result("ledger-write-tls", 40_000, mode="closed-loop"),
                                result("ledger-open-loop-tls", 15_000, p99_ms=9.0, mode="open-loop",
                                       rate_target_per_s=15_000.0, entries_unsent_behind_schedule=0)])
    # 0.15x the baseline; met; (a secured closed loop is not judged: no baseline) offered below half of 40,000/s
    assert [t["met"] for t in got] == [False, True, None]
    assert [t["target"].split()[0] for t in got] == ["ledger-write", "ledger-open-loop", "ledger-open-loop-tls"]
    assert [t["target"].split()[0] for t in ledger_write.targets([closed, opened(15_000, 9.0)])] == [
        "ledger-open-loop"]  # no baseline in the run: the closed loop is not judged


def test_consume_e2e_p99_at_ten_thousand_msgs_per_s_and_the_backlog_ratio():
    def e2e(rate: float, p99_ms: float, record_bytes: int = 100):
        return result("consume-e2e", int(rate), p99_ms=p99_ms, record_bytes=record_bytes, rate_target_per_s=rate)

    assert consume.e2e_target(e2e(10_000, 25.0))["met"] is True
    assert consume.e2e_target(e2e(10_000, 25.1))["met"] is False
    assert consume.e2e_target(e2e(4_000, 10.0))["met"] is None
    assert consume.e2e_target(e2e(4_000, 30.0))["met"] is False
    assert consume.e2e_target(e2e(10_000, 5.0, record_bytes=200))["met"] is None
    produced = result("produce-backlog", 100_000, record_bytes=100)
    drained = result("consume", 120_000, record_bytes=100)
    [q] = consume.ratios([produced, drained, e2e(10_000, 5.0)])
    assert (q.subject, q.baseline, q.target) == ("consume", "produce-backlog", 1.2) and q.met
    assert consume.ratios([drained]) == []
    assert [t["met"] for t in consume.targets([produced, drained, e2e(10_000, 30.0)])] == [False]


# ---------------------------------------------------------------------------------------------- the run
def test_a_run_measures_each_benchmark_once_in_turn_and_a_failure_marks_only_its_rows(monkeypatch):
    calls = []

    def ledger(workdir, s, idle, rows):
        calls.append(("ledger-write", sorted(rows)))
        base, closed = result("grpc-baseline", 100_000), result("ledger-write", 20_000, mode="closed-loop")
        opened = result("ledger-open-loop", 10_000, p99_ms=20.0, mode="open-loop", rate_target_per_s=10_000.0,
                        entries_unsent_behind_schedule=0)
        return [base, closed, opened], [ratio(closed, base, 0.18)], []

    def failing(workdir, s, idle, rows):
        calls.append(("consume", sorted(rows)))
        raise RuntimeError("broker exited")

    def replay(workdir, s, idle, rows):
        calls.append(("replay", sorted(rows)))
        parse, replayed = result("journal-parse", 1000), result("journal-replay", 400)
        return [parse, replayed], [ratio(replayed, parse, 0.5)], []

    monkeypatch.setattr(targets, "MEASUREMENTS", {"ledger-write": ledger, "consume": failing, "replay": replay})
    logged = []
    run = targets.Run(targets.select("replay,consume-backlog,ledger-write-p99,ledger-write,consume-e2e"),
                      settings(log=logged.append))
    results, ratios, _ = run.measure("/nowhere", lambda label: 1.0)
    assert calls == [("ledger-write", ["ledger-write", "ledger-write-p99"]),
                     ("consume", ["consume-backlog", "consume-e2e"]), ("replay", ["replay"])]
    assert [r.name for r in results] == ["grpc-baseline", "ledger-write", "ledger-open-loop", "journal-parse",
                                         "journal-replay"]
    assert [(o.row, o.verdict) for o in run.outcomes] == [
        ("ledger-write", "MET"), ("ledger-write-p99", "NOT MET"), ("consume-e2e", "FAILED"),
        ("consume-backlog", "FAILED"), ("replay", "NOT MET")]
    assert run.failed and "RuntimeError: broker exited" in run.outcomes[2].error
    assert any("measurement consume failed" in line and "broker exited" in line for line in logged)
    text, fields = run.summary()
    assert [row["row"] for row in fields["rows"]] == [o.row for o in run.outcomes]
    assert fields["rows"][0]["command"].startswith("bksim perf ledger-write --entry-size 1024")
    assert "0 of 5" not in text and "2 of 5 target(s) met" not in text and "1 of 5 target(s) met" in text


def test_the_command_exits_0_on_a_target_not_met_and_1_when_a_measurement_fails(monkeypatch, tmp_path, capsys):
    import json

    from bksim.cli.main import main

    def replay(workdir, s, idle, rows):
        parse, replayed = result("journal-parse", 1000), result("journal-replay", 400)
        return [parse, replayed], [ratio(replayed, parse, 0.5)], []

    def failing(workdir, s, idle, rows):
        raise RuntimeError("bookie exited")

    monkeypatch.setattr(targets, "MEASUREMENTS", {"replay": replay, "bookie-rss": failing})
    argv = ["perf", "targets", "--json", "--idle-min", "0", "--idle-wait-s", "0", "--dir", str(tmp_path / "perf")]
    assert main(argv + ["--rows", "replay"]) == 0  # NOT MET is a figure
    report = json.loads(capsys.readouterr().out)
    assert [(r["row"], r["verdict"]) for r in report["rows"]] == [("replay", "NOT MET")]
    assert main(argv + ["--rows", "replay,bookie-rss"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [(r["row"], r["verdict"]) for r in report["rows"]] == [("replay", "NOT MET"), ("bookie-rss", "FAILED")]
    assert report["rows"][1]["error"] == "RuntimeError: bookie exited"
    assert "FAILED" in captured.err and "1 row(s)" not in captured.err  # the table went to stderr with --json
    assert list((tmp_path / "perf").iterdir()) == []
    assert main(argv + ["--rows", "nope"]) == 2


def test_a_replay_size_too_small_to_give_every_ledger_an_entry_is_refused():
    from bksim.perf import replay

    fewest = (replay.LEDGERS - 1) * replay.FILL_BATCH + 1  # the fill's batches go round robin over the ledgers
    assert replay.Shape(fewest * 1024, 1024).entries == fewest
    with pytest.raises(ValueError, match=f"need at least {fewest}"):
        replay.Shape((fewest - 1) * 1024, 1024)
    assert targets.REPLAY_SIZE_DEFAULT == "256MB"
