"""The progress line (cli/progress.py) on a fake terminal with a fake clock: what it shows (bar, done/total,
rate, ETA; a spinner and the elapsed time without a total; a phase with its seconds), the redraw throttle, a
clean end, and silence when the stream is no terminal, with --json or with BKSIM_PROGRESS=0."""
from __future__ import annotations

import io
import sys

import pytest

from bksim.cli import progress as progress_mod
from bksim.cli.progress import Progress, enabled_for, format_duration


class FakeTerminal(io.StringIO):
    def __init__(self, tty: bool = True) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(total=None, unit="entries", tty=True, **kw):
    stream, clock = FakeTerminal(tty), FakeClock()
    p = Progress("ledger write", total, unit, stream=stream, clock=clock, environ={}, width=200, **kw)
    return p, stream, clock


def last_frame(stream: FakeTerminal) -> str:
    return stream.getvalue().split("\r")[-1].rstrip()


def test_a_known_total_shows_bar_count_rate_and_eta():
    p, stream, clock = make(total=1000)
    with p:
        clock.now += 2.0
        p.update(250)
        frame = last_frame(stream)
    assert frame.startswith("ledger write  [#####...............]  25%")
    assert "250/1,000 entries" in frame and "125/s" in frame and "ETA 0:06" in frame


def test_an_unknown_total_shows_a_spinner_count_rate_and_elapsed():
    p, stream, clock = make(total=None)
    with p:
        clock.now += 4.0
        p.update(2000)
        frame = last_frame(stream)
    assert "2,000 entries" in frame and "500/s" in frame and "0:04 elapsed" in frame
    assert any(ch in frame for ch in progress_mod.SPINNER)


def test_a_phase_shows_its_text_and_its_seconds():
    p, stream, clock = make(total=None, unit="")
    with p:
        clock.now += 1.0
        p.phase("bookie-add baseline")
        clock.now += 3.0
        p.refresh()
        frame = last_frame(stream)
    assert "bookie-add baseline (3 s)" in frame and "0:04 elapsed" in frame


def test_redraws_are_throttled():
    p, stream, clock = make(total=10_000)
    with p:
        drawn = stream.getvalue().count("\r")
        for i in range(1, 1001):  # a thousand reports within 0.1 s: no redraw
            clock.now += 0.0001
            p.update(i)
        assert stream.getvalue().count("\r") == drawn
        clock.now += progress_mod.REDRAW_INTERVAL_S
        p.update(1001)
        assert stream.getvalue().count("\r") == drawn + 1


def test_the_line_ends_clean_and_outputs_are_restored_also_on_an_error():
    out, err = sys.stdout, sys.stderr
    p, stream, clock = make(total=10)
    with pytest.raises(RuntimeError):
        with p:
            assert sys.stdout is not out  # wrapped while the line is shown
            clock.now += 1
            p.update(5)
            raise RuntimeError("boom")
    assert (sys.stdout, sys.stderr) == (out, err)
    text = stream.getvalue()
    assert text.endswith("\r") and text.split("\r")[-2].strip() == ""  # erased: blanks, then back to column 0
    p.update(6)  # after the end: nothing more is drawn
    assert stream.getvalue() == text


def test_other_output_erases_the_line_first(capsys):
    p, stream, clock = make(total=10)
    with p:
        clock.now += 1
        p.update(3)
        shown = len(last_frame(stream))
        print("a result line")
        assert stream.getvalue().endswith("\r" + " " * shown + "\r")
    assert capsys.readouterr().out == "a result line\n"  # stdout's bytes unchanged


@pytest.mark.parametrize("kw", [{"tty": False}, {"json": True}, {"environ": {"BKSIM_PROGRESS": "0"}}])
def test_silent_without_a_terminal_with_json_or_when_switched_off(kw):
    stream, clock = FakeTerminal(kw.pop("tty", True)), FakeClock()
    out = sys.stdout
    with Progress("x", 10, "seeds", stream=stream, clock=clock, environ=kw.pop("environ", {}), **kw) as p:
        assert sys.stdout is out
        clock.now += 5
        p.update(5)
        p.phase("y")
    assert stream.getvalue() == ""


def test_enabled_for():
    assert enabled_for(FakeTerminal(True), environ={})
    assert not enabled_for(FakeTerminal(False), environ={})
    assert not enabled_for(FakeTerminal(True), environ={"BKSIM_PROGRESS": "off"})
    assert enabled_for(FakeTerminal(False), is_tty=True, environ={})


def test_the_line_is_cut_to_the_terminal_width():
    stream, clock = FakeTerminal(), FakeClock()
    with Progress("a label " * 20, 10, "entries", stream=stream, clock=clock, environ={}, width=40) as p:
        p.update(1)
        assert max(len(frame) for frame in stream.getvalue().split("\r")) <= 39


def test_format_duration():
    assert [format_duration(s) for s in (0, 59.6, 61, 3725)] == ["0:00", "1:00", "1:01", "1:02:05"]


def test_chaos_campaign_counts_runs_done_of_n_and_failures_under_its_log(monkeypatch, capsys):
    """`chaos campaign` with its runs replaced (no cluster): the line counts the runs and the failures the
    campaign reports, and every log line is written with the line erased first."""
    import argparse

    from bksim.chaos import runner
    from bksim.cli import chaos_cmd

    terminal, clock = FakeTerminal(), FakeClock()
    seen: list[str] = []

    def campaign(runs, seed, duration_s, base_dir, names, *, keep, log, progress, secure):
        for i in range(1, runs + 1):
            clock.now += 10.0
            log(f"run {i}: a log line")
            failed = 1 if i >= 2 else 0
            progress(f"[{i}/{runs}] kill-bookie seed 7: {'FAIL' if i == 2 else 'PASS'} (10 s; 5 acked, recovery 1 "
                     f"s) | failed {failed} | elapsed 0.2 min, eta 0.3 min")
            seen.append(terminal.getvalue().split("\r")[-1].strip())
        return [{"verdict": "PASS"}] * runs, "the table"

    monkeypatch.setattr(runner, "campaign", campaign)
    def fake_progress(*a, **kw) -> Progress:  # on the fake terminal; no ticker: the fake clock does not move
        return Progress(*a, **{**kw, "ticking": False}, stream=terminal, clock=clock, environ={}, width=200,
                        interval_s=0.0)

    monkeypatch.setattr(chaos_cmd, "Progress", fake_progress)
    args = argparse.Namespace(runs=3, seed=5, scenarios="", duration=1.0, keep=False, dir="/nonexistent",
                              secure=False)
    assert chaos_cmd.cmd_campaign(args) == 0
    assert capsys.readouterr().out == "the table\n"
    assert seen[0].startswith("chaos campaign  [######..............]  33%  1/3 runs") and "0 failed" in seen[0]
    assert "2/3 runs" in seen[1] and "1 failed" in seen[1] and "ETA 0:10" in seen[1]
    assert terminal.getvalue().endswith("\r")
