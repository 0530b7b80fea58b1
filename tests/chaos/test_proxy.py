"""The chaos proxy's link faults on a loopback echo server: block resets, hold delivers nothing until the
heal and then everything in order, one-way hold stops one direction only, delay delays.

Every wait is bounded (socket timeouts, wait_until deadlines); the echo server and the proxies are closed by
the fixture, and close() must report that every thread stopped.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from bksim.chaos.proxy import TcpProxy
from tests.helpers import wait_until

TIMEOUT_S = 5.0


class EchoServer:
    """Echoes every byte back; records what it received (so one direction can be observed alone)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _echo(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        with conn:
            while not self.stop.is_set():
                try:
                    data = conn.recv(4096)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not data:
                    return
                with self.lock:
                    self.received += data
                conn.sendall(data)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for t in self.threads:
            t.join(TIMEOUT_S)


@pytest.fixture
def link():
    echo = EchoServer()
    proxy = TcpProxy(echo.port)
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S)
    try:
        yield echo, proxy, client
    finally:
        client.close()
        assert proxy.close(), "a proxy thread did not stop"
        echo.close()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def test_forwarding_and_block_resets_the_connection(link):
    echo, proxy, client = link
    client.sendall(b"hello")
    assert recv_exactly(client, 5) == b"hello"
    proxy.block()
    assert proxy.state() == "blocked"
    with pytest.raises((ConnectionError, OSError)):
        client.sendall(b"x")
        recv_exactly(client, 1)


def test_blackhole_delivers_nothing_until_the_heal_then_everything_in_order(link):
    echo, proxy, client = link
    proxy.hold(up=True, down=True)
    client.sendall(b"abc")
    client.settimeout(0.3)
    with pytest.raises(socket.timeout):  # no reply and no error: the bytes are held, not refused
        client.recv(1)
    assert bytes(echo.received) == b""
    client.sendall(b"def")
    proxy.heal()
    client.settimeout(TIMEOUT_S)
    assert recv_exactly(client, 6) == b"abcdef"
    assert proxy.state() == "ok"


def test_one_way_loss_of_replies_lets_requests_through(link):
    echo, proxy, client = link
    proxy.hold(up=False, down=True)
    client.sendall(b"ping")
    wait_until(lambda: bytes(echo.received) == b"ping", timeout_s=TIMEOUT_S, message="request reached the server")
    client.settimeout(0.3)
    with pytest.raises(socket.timeout):
        client.recv(1)
    proxy.heal()
    client.settimeout(TIMEOUT_S)
    assert recv_exactly(client, 4) == b"ping"


def test_one_way_loss_of_requests_holds_them_back(link):
    echo, proxy, client = link
    proxy.hold(up=True, down=False)
    client.sendall(b"ping")
    client.settimeout(0.3)
    with pytest.raises(socket.timeout):
        client.recv(1)
    assert bytes(echo.received) == b""
    proxy.heal()
    client.settimeout(TIMEOUT_S)
    assert recv_exactly(client, 4) == b"ping"


def test_delay_applies_to_each_direction(link):
    echo, proxy, client = link
    proxy.delay(150)
    started = time.monotonic()
    client.sendall(b"x")
    assert recv_exactly(client, 1) == b"x"
    assert time.monotonic() - started >= 0.3  # 150 ms up + 150 ms down
    with pytest.raises(ValueError):
        proxy.delay(-1)
