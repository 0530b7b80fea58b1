"""The machine a benchmark runs on: facts for the report header, the CPU-idle guard, per-process CPU use.

The machine is shared, so before every measurement `wait_for_idle` samples /proc/stat until the CPUs are
mostly idle (bounded wait) and returns the idle fraction it saw; the report prints it next to the figures.
Linux only (/proc). Owns no state.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Callable

from bksim.adapters.processes import cpu_seconds as process_cpu_s  # noqa: F401 - the benchmarks take it from here
from bksim.adapters.processes import memory_bytes as process_memory_bytes  # noqa: F401 - likewise

IDLE_MIN_DEFAULT = 0.85  # the environment notes' guard: >= 85 % idle over the sample
IDLE_WAIT_S_DEFAULT = 30.0  # give up waiting (and say so) after this long
IDLE_SAMPLE_S = 0.5


def facts(directory: str | None = None) -> dict:
    """Cores, CPU model, Python, gRPC and protobuf versions, kernel, and the file system of `directory`."""
    out = {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    try:
        import grpc

        out["grpc"] = grpc.__version__
    except ImportError:  # maybe: the fsync benchmark does not need grpc
        out["grpc"] = "not installed"
    try:
        from google import protobuf

        out["protobuf"] = protobuf.__version__
    except ImportError:
        out["protobuf"] = "not installed"
    if directory:
        out["dir"] = os.path.abspath(directory)
        out["dir_fs"] = _fs_type(directory)
    return out


def header_lines(machine: dict) -> list[str]:
    line = (f"# machine: {machine['cores']} cores ({machine['cores_usable']} usable), {machine['cpu_model']}, "
            f"python {machine['python']}, grpc {machine['grpc']}, protobuf {machine['protobuf']}, "
            f"kernel {machine['kernel']}")
    lines = [line]
    if "dir" in machine:
        lines.append(f"# data dir: {machine['dir']} ({machine['dir_fs']})")
    return lines


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fs_type(directory: str) -> str:
    """File system type of the mount holding `directory` (longest matching mount point in /proc/mounts)."""
    path = os.path.realpath(directory)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mount = parts[1]
                    if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                        best, kind = mount, f"{parts[2]} on {parts[0]}"
    except OSError:
        pass
    return kind


@dataclass(frozen=True, slots=True)
class CpuTimes:
    idle: int
    total: int


def read_cpu_times() -> CpuTimes:
    """Aggregate jiffies from the first line of /proc/stat; idle counts idle + iowait."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    assert fields[0] == "cpu", f"unexpected /proc/stat first line: {fields[:3]}"
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest is in user)
    return CpuTimes(idle=values[3] + values[4], total=sum(values))


def idle_fraction(before: CpuTimes, after: CpuTimes) -> float | None:
    """Idle share of the CPU time between two readings; None when /proc/stat did not advance between them.

    Some kernels and sandboxes refresh /proc/stat only every few hundred milliseconds, so a short
    measurement can see no jiffies at all: that is "not measured", not "idle".
    """
    total = after.total - before.total
    return (after.idle - before.idle) / total if total > 0 else None


def sample_idle(sample_s: float = IDLE_SAMPLE_S) -> float:
    """Idle fraction of all CPUs over the next `sample_s` seconds (1.0 when /proc/stat did not advance)."""
    before = read_cpu_times()
    time.sleep(sample_s)
    idle = idle_fraction(before, read_cpu_times())
    return 1.0 if idle is None else idle


def idle_noting_load(idle: Callable[[str], float], loads: dict[str, float]) -> Callable[[str], float]:
    """`idle` (the idle guard), then the 1-minute load average as the measurement starts, kept in `loads` by name."""
    def ready(name: str) -> float:
        fraction = idle(name)
        loads[name] = os.getloadavg()[0]
        return fraction
    return ready


def wait_for_idle(idle_min: float = IDLE_MIN_DEFAULT, wait_s_max: float = IDLE_WAIT_S_DEFAULT,
                  log: Callable[[str], None] | None = None, label: str = "") -> float:
    """Sample until the CPUs are at least `idle_min` idle or `wait_s_max` passed; return the last fraction."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    deadline = time.monotonic() + wait_s_max
    idle = sample_idle()
    while idle < idle_min and time.monotonic() < deadline:
        idle = sample_idle()
    verdict = ("ok" if idle >= idle_min
               else f"BUSY: still below {idle_min:.2f} after {wait_s_max:.0f} s, measuring anyway")
    log(f"# cpu idle before {label or 'measurement'}: {idle:.2f} ({verdict})")
    return idle
