"""Child processes of a benchmark (echo server, ZooKeeper, bookie): start in their own session, stop by pid.

Every process started here is stopped by `ProcessGroup.stop_all()` (SIGTERM, bounded wait, then SIGKILL),
which the benchmarks call in a `finally`, so Ctrl-C or an exception never leaves a server behind. Only
pids this object started are ever signalled.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

STOP_GRACE_S = 10.0  # a bookie checkpoints on SIGTERM; give it time before SIGKILL


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class ProcessGroup:
    """The children of one benchmark run."""

    children: list[Child] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], log_path: str, env: dict[str, str] | None = None,
              cwd: str | None = None) -> Child:
        log = open(log_path, "ab")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, cwd=cwd, start_new_session=True)
        finally:
            log.close()
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM, wait up to `grace_s`, then SIGKILL; return the exit code."""
        if child.proc.poll() is None:
            try:
                os.kill(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                print(f"# {child.name} (pid {child.pid}) ignored SIGTERM for {grace_s:.0f} s: SIGKILL",
                      file=sys.stderr)
                os.kill(child.pid, signal.SIGKILL)
                child.proc.wait(timeout=grace_s)
        if child in self.children:
            self.children.remove(child)
        return child.proc.returncode

    def stop_all(self) -> None:
        """Stop every child, newest first (a bookie before its ZooKeeper)."""
        for child in reversed(list(self.children)):
            try:
                self.stop(child)
            except Exception as e:  # keep stopping the others
                print(f"# could not stop {child.name} (pid {child.pid}): {e}", file=sys.stderr)


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> None:
    """Poll `predicate()` until true, or raise TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what}")
        time.sleep(interval_s)
