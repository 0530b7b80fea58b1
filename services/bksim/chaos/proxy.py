"""A loopback TCP proxy that can be cut: the chaos runner puts one between each broker and ZooKeeper.

`TcpProxy(upstream_port)` listens on 127.0.0.1:<free port> and forwards every connection to
127.0.0.1:<upstream_port> (two pump threads per connection). `block()` shuts every forwarded connection
down and closes new ones at once: the broker loses ZooKeeper while it keeps running, so its session
expires after the session timeout. `unblock()` forwards again. `close()` stops everything; threads are
joined with a deadline. Every loop ends on the stop event or on a closed socket; at most
`CONNECTIONS_MAX` connections are forwarded at once (more are closed).
"""
from __future__ import annotations

import socket
import threading

ACCEPT_POLL_S = 0.05
JOIN_TIMEOUT_S = 5.0
CHUNK_BYTES = 64 * 1024
CONNECTIONS_MAX = 64


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self._upstream = (host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(16)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.host = host
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._blocked = False
        self._stop = threading.Event()
        self.connections = 0
        self._start(self._accept_loop)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def blocked(self) -> bool:
        return self._blocked

    def block(self) -> None:
        with self._lock:
            self._blocked = True
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            _shut(s)

    def unblock(self) -> None:
        with self._lock:
            self._blocked = False

    def close(self) -> bool:
        """Stop forwarding and join the threads; False if one of them did not stop within JOIN_TIMEOUT_S."""
        self._stop.set()
        self.block()
        self._listener.close()
        for t in self._threads:
            t.join(JOIN_TIMEOUT_S)
        return not any(t.is_alive() for t in self._threads)

    def _start(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"chaos-proxy-{self.port}")
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # listener closed
            client.settimeout(None)
            with self._lock:
                refuse = self._blocked or len(self._sockets) >= 2 * CONNECTIONS_MAX
            if refuse:
                _shut(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=JOIN_TIMEOUT_S)
            except OSError:
                _shut(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._blocked:
                    _shut(client)
                    _shut(upstream)
                    continue
                self._sockets |= {client, upstream}
                self.connections += 1
            self._start(self._pump, client, upstream)
            self._start(self._pump, upstream, client)

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                data = source.recv(CHUNK_BYTES)
                if not data:
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets -= {source, target}
            _shut(source)
            _shut(target)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
