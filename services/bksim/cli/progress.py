"""Progress of long commands on a terminal: one status line on stderr, redrawn in place with a carriage return.

    with Progress("ledger write", total=10_000, unit="entries", json=args.json) as status:
        ...
        status.update(acknowledged)            # or status.advance(1), from any thread

    ledger write [#######.............]  36% 3,600/10,000 entries  9,871/s  ETA 0:01

What it shows: the label; with a known total a bar, the percentage, done/total, the rate (per second over the
whole run) and the ETA (what remains at that rate); without a total a spinner, the count, the rate and the
elapsed time; a phase (`phase(text)`: its text and the seconds spent in it) or a note (`note(text)`: e.g.
"2 failed"). A command that only waits (one long call) passes `ticking=True`: a thread it owns redraws the
spinner and the elapsed time while the call blocks, and is joined when the block ends.

Contracts:
- It writes only to its stream (the process's stderr at construction) and only when that stream is a terminal,
  the command does not print JSON (`json=True`), and neither BKSIM_PROGRESS=0 (or off/false/no) nor
  `bksim --no-progress` silenced it. Otherwise every method does nothing: what a command prints on stdout, and
  on stderr when redirected, is byte for byte what it prints without progress.
- At most one redraw per `interval_s` (REDRAW_INTERVAL_S): counts may be reported per entry at no cost.
- Other output stays readable: while the line is shown, `sys.stdout` and `sys.stderr` are wrapped so that a
  write first erases the line (it comes back at the next redraw, once the output ended its line). The bytes
  written to stdout are unchanged.
- It ends clean: leaving the `with` block (also on an exception or Ctrl-C) erases the line and leaves the
  cursor at the start of an empty line; `sys.stdout` and `sys.stderr` are restored.
- The line is cut to the terminal's width (a wrapped line could not be redrawn in place).
- Time is an input: `clock` (monotonic seconds), the stream and `is_tty` are injectable for tests.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

ENV = "BKSIM_PROGRESS"
OFF_VALUES = frozenset({"0", "off", "false", "no"})
REDRAW_INTERVAL_S = 0.2  # five redraws a second: smooth to the eye, negligible cost
BAR_WIDTH = 20
WIDTH_DEFAULT = 80  # when the stream cannot tell its terminal's width
SPINNER = "|/-\\"

_silenced = False  # `bksim --no-progress`


def silence() -> None:
    """No progress line for the rest of this process (`bksim --no-progress`)."""
    global _silenced
    _silenced = True


def enabled_for(stream: TextIO, *, json: bool = False, is_tty: bool | None = None,
                environ: dict | None = None) -> bool:
    """Whether a progress line may be drawn on `stream`: a terminal, no --json, not silenced."""
    if json or _silenced:
        return False
    env = os.environ if environ is None else environ
    if env.get(ENV, "").strip().lower() in OFF_VALUES:
        return False
    if is_tty is not None:
        return is_tty
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or odd stream: no terminal
        return False


def format_duration(seconds: float) -> str:
    """M:SS, or H:MM:SS from an hour."""
    s = max(0, int(seconds + 0.5))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_rate(per_s: float) -> str:
    return f"{per_s:,.0f}/s" if per_s >= 10 else f"{per_s:.1f}/s"


class Progress:
    """One status line; see the module docstring. Safe to call from several threads."""

    def __init__(self, label: str, total: int | None = None, unit: str = "", *, json: bool = False,
                 ticking: bool = False, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 is_tty: bool | None = None, environ: dict | None = None, interval_s: float = REDRAW_INTERVAL_S,
                 width: int | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled_for(self.stream, json=json, is_tty=is_tty, environ=environ)
        self._clock, self._interval_s, self._ticking = clock, interval_s, ticking
        self._width = width
        self._lock = threading.RLock()
        self.done = 0
        self._note = ""
        self._phase_started: float | None = None
        self._started = clock()
        self._drawn_at: float | None = None
        self._drawn_len = 0  # characters of the line now on the terminal (0: none shown)
        self._frames = 0
        self._at_line_start = True  # the wrapped outputs ended their last write with a newline
        self._saved: tuple | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- reporting ------------------------------------------------------------------------------------------
    def update(self, done: int, note: str | None = None) -> None:
        """Set the count done so far (and the note)."""
        if not self.enabled:
            return
        with self._lock:
            self.done = done
            if note is not None:
                self._note = note
            self.refresh()

    def advance(self, n: int = 1, note: str | None = None) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.update(self.done + n, note)

    def set_total(self, total: int | None) -> None:
        """The total, once known (or changed): shown at the next report, however soon."""
        with self._lock:
            if total != self.total:
                self.total, self._drawn_at = total, None

    def note(self, text: str) -> None:
        """A short text after the counts (a status message, "2 failed"); drawn at the next redraw."""
        if not self.enabled:
            return
        with self._lock:
            self._note = text
            self.refresh()

    def phase(self, text: str) -> None:
        """A named phase: its text and the seconds since it began are shown; drawn now."""
        if not self.enabled:
            return
        with self._lock:
            self._note, self._phase_started = text, self._clock()
            self.refresh(force=True)

    # -- drawing --------------------------------------------------------------------------------------------
    def render(self, now: float) -> str:
        """The status line at `now` (no carriage return, not cut to the width)."""
        elapsed = max(now - self._started, 0.0)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        unit = f" {self.unit}" if self.unit else ""
        parts = [self.label]
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            filled = int(fraction * BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction * 100:3.0f}%")
            parts.append(f"{self.done:,}/{self.total:,}{unit}")
            if self.done:
                parts.append(format_rate(rate))
                eta = (self.total - self.done) / rate if rate > 0 else 0.0
                parts.append(f"ETA {format_duration(eta)}")
            else:
                parts.append("ETA ?")
        else:
            parts.append(SPINNER[self._frames % len(SPINNER)])
            if self.unit or self.done:
                parts.append(f"{self.done:,}{unit}")
                parts.append(format_rate(rate))
            parts.append(f"{format_duration(elapsed)} elapsed")
        if self._note:
            phase = (f" ({now - self._phase_started:.0f} s)" if self._phase_started is not None else "")
            parts.append(f"{self._note}{phase}")
        return "  ".join(parts)

    def refresh(self, force: bool = False) -> None:
        """Redraw if the last redraw is at least `interval_s` old (or `force`) and no output line is open."""
        if not self.enabled:
            return
        with self._lock:
            now = self._clock()
            if not self._at_line_start:
                return
            if not force and self._drawn_at is not None and now - self._drawn_at < self._interval_s:
                return
            self._frames += 1
            line = self.render(now)[:self._columns() - 1]
            pad = " " * max(0, self._drawn_len - len(line))
            self._write("\r" + line + pad)
            self._drawn_len, self._drawn_at = len(line), now

    def clear(self) -> None:
        """Erase the line (the next redraw brings it back)."""
        with self._lock:
            if self._drawn_len:
                self._write("\r" + " " * self._drawn_len + "\r")
                self._drawn_len = 0  # back at the next redraw, still at most one per interval

    def _columns(self) -> int:
        if self._width is not None:
            return self._width
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or WIDTH_DEFAULT
        except (AttributeError, ValueError, OSError):
            return WIDTH_DEFAULT

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is never worth an error
            self.enabled = False

    # -- lifetime -------------------------------------------------------------------------------------------
    def __enter__(self) -> "Progress":
        if not self.enabled:
            return self
        self._started = self._clock()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Erasing(sys.stdout, self), _Erasing(sys.stderr, self)
        self.refresh(force=True)
        if self._ticking:
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the ticker, erase the line, restore sys.stdout and sys.stderr. Idempotent."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=max(1.0, self._interval_s * 5))
            self._ticker = None
        with self._lock:
            if self._saved is not None:
                sys.stdout, sys.stderr = self._saved
                self._saved = None
            if self.enabled:
                self.clear()
            self.enabled = False

    def _tick(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.refresh()

    def _output(self, text: str) -> None:
        """Bookkeeping of a write through a wrapped output (called under the lock)."""
        if text:
            self._at_line_start = text.endswith("\n")


class _Erasing:
    """sys.stdout / sys.stderr while a line is shown: a write first erases the line. Everything else is the
    wrapped stream's (fileno, isatty, encoding, buffer, ...)."""

    def __init__(self, inner: TextIO, progress: Progress) -> None:
        self._inner, self._progress = inner, progress

    def write(self, text: str) -> int:
        with self._progress._lock:
            self._progress.clear()
            n = self._inner.write(text)
            self._progress._output(text)
            return n

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._inner.flush()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)
