"""bksim.adapters.ports.free_port: ports below the ephemeral range (no outgoing connection takes them between the
check and the server's bind), never the same one twice in a process, runs of consecutive free ports."""
from __future__ import annotations

import socket

import pytest

from bksim.adapters import ports


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice():
    low, _ = ports._ephemeral_range()
    got = [ports.free_port() for _ in range(300)]
    assert len(set(got)) == len(got)
    assert all(ports.RANGE_FLOOR <= p < max(low, ports.RANGE_FLOOR + 1_000) for p in got), got[:10]


def test_a_run_of_ports_is_free_and_not_handed_out_again():
    first = ports.free_port(count=4)
    run = set(range(first, first + 4))
    for port in run:  # every port of the run binds now
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
    assert not run & {ports.free_port() for _ in range(200)}


def test_a_port_in_use_is_not_handed_out():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not ports._bindable("127.0.0.1", busy.getsockname()[1])


def test_a_bad_count_is_refused():
    with pytest.raises(ValueError):
        ports.free_port(count=0)


def test_bksim_port_range_confines_the_ports_handed_out(monkeypatch):
    monkeypatch.setenv(ports.PORT_RANGE_ENV, "41000-41050")
    got = [ports.free_port() for _ in range(20)] + [ports.free_port(count=3)]
    assert all(41000 <= p < 41050 for p in got), got
    assert ports.port_range() == (41000, 41050)


@pytest.mark.parametrize("value", ["41000", "41050-41000", "80-1000", "41000-70000", "a-b"])
def test_a_bad_bksim_port_range_is_refused_with_its_value(monkeypatch, value):
    monkeypatch.setenv(ports.PORT_RANGE_ENV, value)
    with pytest.raises(ValueError, match=ports.PORT_RANGE_ENV):
        ports.free_port()
