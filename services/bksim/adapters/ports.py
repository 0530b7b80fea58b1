"""Free TCP ports for local servers started by the cluster launcher, chaos, the benchmarks and the tests.

A port found with bind(port 0) comes from the kernel's ephemeral range, the same range outgoing connections
take their local ports from: between "free a moment ago" and the server's own bind, any client connection on
the machine may take it (then the server fails with "Failed to bind"), and a later call may hand out the same
port again (a bookie's id is its address, so a second bookie on a reused port meets the first one's cookie in
a ZooKeeper that outlived it). So ports here come from below the ephemeral range, where no outgoing connection
lands, are checked bindable (with SO_REUSEADDR, as the servers bind), and are never handed out twice by one
process. Runs of consecutive ports are for configurations that take a base port (`bookie_port_base`).
"""
from __future__ import annotations

import os
import random
import socket
import threading

RANGE_FLOOR = 10_000  # lowest port handed out
PORT_RANGE_ENV = "BKSIM_PORT_RANGE"
EPHEMERAL_FALLBACK = (32_768, 60_999)  # Linux's default ip_local_port_range, if /proc does not say
ATTEMPTS_MAX = 200  # random candidates tried before giving up (each a bind on loopback: cheap)

_handed_out: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()  # seeded from the OS: two processes do not walk the same sequence


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_range() -> tuple[int, int]:
    """[floor, ceiling) ports are handed out from: $BKSIM_PORT_RANGE ("LOW-HIGH", HIGH exclusive: processes that
    must never pick the same port, such as parallel test workers, each get a slice; their children inherit it),
    else RANGE_FLOOR up to the ephemeral range."""
    given = os.environ.get(PORT_RANGE_ENV, "").strip()
    if given:
        try:
            floor, ceiling = (int(x) for x in given.split("-"))
        except ValueError:
            raise ValueError(f"{PORT_RANGE_ENV}={given!r}: expected LOW-HIGH, e.g. 10000-20000") from None
        if not 1024 <= floor < ceiling <= 65_536:
            raise ValueError(f"{PORT_RANGE_ENV}={given!r}: need 1024 <= LOW < HIGH <= 65536")
        return floor, ceiling
    low, _ = _ephemeral_range()
    return RANGE_FLOOR, max(low, RANGE_FLOOR + 1_000)  # a machine whose ephemeral range starts very low: share it


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of `count` consecutive TCP ports on `host` that are bindable now, lie below the ephemeral range
    and were never handed out by this process. RuntimeError when none is found in ATTEMPTS_MAX tries."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    floor, ceiling = port_range()
    with _lock:
        for _ in range(ATTEMPTS_MAX):
            first = _rng.randrange(floor, ceiling - count + 1)
            ports = range(first, first + count)
            if any(p in _handed_out for p in ports):
                continue
            if all(_bindable(host, p) for p in ports):
                _handed_out.update(ports)
                return first
    raise RuntimeError(f"no run of {count} free TCP port(s) on {host} in [{floor}, {ceiling}) after "
                       f"{ATTEMPTS_MAX} tries")
