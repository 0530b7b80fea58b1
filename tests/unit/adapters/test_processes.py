"""adapters/processes.processes_mentioning: finds a process by a text of its command line, never this one."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

from bksim.adapters import processes


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
