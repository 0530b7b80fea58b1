"""Running `bksim` with its stderr on a pseudo-terminal (the `pty` module) and its stdout on a pipe, for the tests
of the progress line (cli/progress.py): what reached the terminal, split into the frames drawn."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading

TIMEOUT_S = 120
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = 200


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update(extra)
    return env


def run_on_tty(*args: str, cwd: str = ROOT, timeout_s: float = TIMEOUT_S, **env: str) -> tuple[int, str, str]:
    """(exit status, stdout, what reached the terminal with "\\r\\n" read as "\\n") of `bksim ARGS`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    out: list[bytes] = []
    try:
        child = subprocess.Popen([sys.executable, "-m", "bksim.cli.main", *args], stdout=subprocess.PIPE,
                                 stderr=slave, stdin=subprocess.DEVNULL, env=clean_env(**env), cwd=cwd)
        os.close(slave)
        slave = -1
        reader = threading.Thread(target=lambda: out.append(child.stdout.read()), daemon=True)
        reader.start()  # stdout drained meanwhile: a full pipe would stop the child before it closes the terminal
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            chunks.append(data)
        status = child.wait(timeout=timeout_s)
        reader.join(timeout_s)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    terminal = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")  # the terminal's onlcr
    return status, b"".join(out).decode(), terminal


def run_on_pipes(*args: str, cwd: str = ROOT, timeout_s: float = TIMEOUT_S, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], capture_output=True, text=True,
                          env=clean_env(**env), cwd=cwd, timeout=timeout_s)


def untimed(text: str) -> str:
    """`text` with durations ("1.3 s", "43 ms") replaced, to compare two runs' outputs."""
    return re.sub(r"[0-9.]+ (s|ms)\b", "T", text)


def frames(terminal: str) -> list[str]:
    """The status lines drawn (the texts between carriage returns, blanks left out)."""
    return [f.strip() for f in terminal.split("\r") if f.strip()]


def assert_ends_clean(terminal: str) -> None:
    """The last thing on the terminal is an erased line with the cursor at its start."""
    tail = terminal.rsplit("\n", 1)[-1]  # after the last full line written to stderr
    assert tail.endswith("\r") and tail.split("\r")[-2].strip() == "", repr(tail[-200:])
