"""Local child processes by pid: spawn into their own session, signal, wait, and pid files.

Owns: starting a process detached from the caller's terminal (its own session and process group, stdout
and stderr appended to a log file), the pid file that names it, and stopping it (SIGTERM, a bounded wait,
then SIGKILL to its whole process group). Used by `bksim cluster up|down`, the tests and the benchmarks.

Invariants: every wait is bounded by a deadline; a pid is only ever signalled when it is alive and, when
the caller says what it expects, its command line contains that marker (so a stale pid file whose pid was
reused by an unrelated process is never signalled). Never kills by name.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Iterator, Mapping, Sequence

# Children spawned by this process, so that stop()/kill9() can reap them (no zombies left behind).
_children: dict[int, subprocess.Popen] = {}

POLL_INTERVAL_S = 0.02
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the duration of the block, then deliver them to the previous handlers (so a
    Ctrl-C between a fork and the bookkeeping of the child's pid cannot orphan the child)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in INTERRUPTS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


def spawn(argv: Sequence[str], env: Mapping[str, str] | None, log_path: str, pid_path: str | None = None,
          cwd: str | None = None) -> int:
    """Start `argv` in a new session (own process group); stdout+stderr append to `log_path`.

    `env` replaces the environment when given (pass ``{**os.environ, ...}`` to extend it). Writes the pid
    to `pid_path` (atomically) when given. Returns the pid.
    """
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab", buffering=0) as log:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
                                close_fds=True)
    _children[proc.pid] = proc
    if pid_path:
        write_pid(pid_path, proc.pid)
    return proc.pid


def write_pid(path: str, pid: int) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{pid}\n")
    os.replace(tmp, path)


def read_pid(path: str) -> int | None:
    """The pid in `path`, or None when the file is missing or does not hold a positive integer."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    try:
        pid = int(text)
    except ValueError:
        return None
    return pid if pid > 0 else None


def remove_pid(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def cmdline(pid: int) -> str:
    """The process's command line joined by spaces ('' when it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes_mentioning(text: str) -> dict[int, str]:
    """pid -> command line of this machine's processes (not this one) whose command line contains `text`:
    a run's own directory names whatever that run started."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        line = cmdline(int(name))  # '' when gone meanwhile, or not ours to read
        if text in line:
            found[int(name)] = line
    return found


def is_alive(pid: int | None, expect_in_cmdline: str | None = None) -> bool:
    """True when `pid` runs (not a zombie) and, if given, its command line contains `expect_in_cmdline`.

    A child this process spawned and has not reaped is judged by its exit status alone: its pid cannot name
    another process yet, and its command line may still be its parent's for a moment after spawn returns (the
    exec not yet visible in /proc), which would make a daemon just started look gone."""
    if not pid:
        return False
    proc = _children.get(pid)
    if proc is not None:
        if proc.poll() is None:
            return True
        _children.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _state(pid) in ("Z", "X", ""):
        return False
    if expect_in_cmdline is not None and expect_in_cmdline not in cmdline(pid):
        return False
    return True


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `pid` to exit; True if it did."""
    proc = _children.get(pid)
    if proc is not None:
        try:
            proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            return False
        _children.pop(pid, None)
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        if not is_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_INTERVAL_S)


def wait_status(pid: int, timeout_s: float) -> int | None:
    """Wait up to `timeout_s` for `pid`, a child spawned here; its exit status, or None if it still runs."""
    proc = _children.get(pid)
    if proc is None:
        raise ValueError(f"pid {pid} is not a running child spawned by this process")
    try:
        status = proc.wait(timeout=max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        return None
    _children.pop(pid, None)
    return status


def terminate(pid: int, expect_in_cmdline: str | None = None) -> bool:
    """Send SIGTERM to `pid` if it is alive (and matches); True if a signal was sent."""
    if not is_alive(pid, expect_in_cmdline):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def stop(pid: int | None, timeout_s: float, expect_in_cmdline: str | None = None) -> bool:
    """SIGTERM, wait up to `timeout_s`, then SIGKILL the process group and wait again (bounded).

    Returns True when the process is gone at the end (also when it was not running at all).
    """
    if not pid or not is_alive(pid, expect_in_cmdline):
        return True
    terminate(pid, expect_in_cmdline)
    if wait_exit(pid, timeout_s):
        return True
    return kill9(pid, timeout_s=5.0)


def kill9(pid: int | None, timeout_s: float = 5.0, expect_in_cmdline: str | None = None) -> bool:
    """SIGKILL `pid` (its whole process group when it leads one) and wait up to `timeout_s` for it to go."""
    if not pid or not is_alive(pid, expect_in_cmdline):
        return True
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return wait_exit(pid, timeout_s)


def stop_pid_file(pid_path: str, timeout_s: float, expect_in_cmdline: str | None = None) -> tuple[int | None, bool]:
    """Stop the process a pid file names; remove the file once it is gone. Returns (pid, stopped)."""
    pid = read_pid(pid_path)
    stopped = stop(pid, timeout_s, expect_in_cmdline)
    if stopped:
        remove_pid(pid_path)
    return pid, stopped


def tail(path: str, lines: int = 40) -> str:
    """The last `lines` lines of a (log) file, or a note that it is missing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"
    return "\n".join(data.splitlines()[-lines:])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by process `pid` (its own threads, not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()  # the command name may contain spaces
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def memory_bytes(pid: int) -> dict[str, int]:
    """Resident set of process `pid` now ("rss", VmRSS) and at its peak so far ("peak", VmHWM), in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out["rss" if name == "VmRSS" else "peak"] = int(value.split()[0]) * 1024  # kB
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # "pid (comm) S ..." - comm may contain spaces and parentheses; the state follows the last ')'.
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""
