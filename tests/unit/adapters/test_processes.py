"""adapters/processes.processes_mentioning: finds a process by a text of its command line, never this one."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

from bksim.adapters import processes
from helpers import wait_until


def test_a_process_is_found_by_a_text_of_its_command_line_and_gone_after_it_exits():
    marker = f"bksim-test-{uuid.uuid4().hex}"
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()", marker],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        # Popen may return before the exec is visible in /proc/<pid>/cmdline: the child's first line says it runs
        assert child.stdout.readline() == b"up\n"
        found = processes.processes_mentioning(marker)
        assert list(found) == [child.pid] and marker in found[child.pid]
    finally:
        child.communicate(b"", timeout=10)  # closing its stdin ends it
    assert processes.processes_mentioning(marker) == {}


def test_this_process_is_never_listed():
    own = processes.cmdline(os.getpid())
    assert own and os.getpid() not in processes.processes_mentioning(own)


def test_a_spawned_child_is_alive_by_its_exit_status_whatever_its_command_line_shows(tmp_path):
    """A child spawn() started counts as running until it exits, even while its command line does not (yet, or
    any more) carry the marker a caller expects: here it execs into a program without it."""
    marker = f"bksim-test-{uuid.uuid4().hex}"
    ready = tmp_path / "ready"
    code = (f"import os, sys; open({str(ready)!r}, 'w').close(); "
            "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)'])")
    pid = processes.spawn([sys.executable, "-c", code, marker], None, str(tmp_path / "child.log"))
    try:
        wait_until(lambda: ready.exists() and "time.sleep(60)" in processes.cmdline(pid), 30.0,
                   message="the child to exec into a command line without the marker")
        assert marker not in processes.cmdline(pid)
        assert processes.is_alive(pid, marker)
    finally:
        assert processes.stop(pid, 10.0, marker)
    assert not processes.is_alive(pid) and not processes.is_alive(pid, marker)
