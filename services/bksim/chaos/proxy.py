"""A loopback TCP proxy with injectable link faults: the chaos runner puts one between each broker and
ZooKeeper, and (for the network scenarios) one on every broker->bookie link.

`TcpProxy(upstream_port)` listens on 127.0.0.1:<free port> and forwards every connection to
127.0.0.1:<upstream_port>. Each direction of a connection has a reader thread (socket -> bounded queue of
chunks stamped with their arrival time) and a writer thread (queue -> the other socket). "up" is the
direction client -> upstream (for a bookie link: the broker's requests), "down" the replies.

Faults, all of them on live connections and new ones alike:
- `block()` / `unblock()`: connection refused and reset. Every forwarded connection is shut down at once and
  new ones are closed; the client sees its connection fail (used to cut a broker off from ZooKeeper).
- `hold(up=..., down=...)`: the bytes of a held direction are not delivered until the link heals. This is what
  TCP makes of a path that loses every segment in that direction: the sender's writes pile up (first in this
  proxy's bounded queue, then in its socket buffers) and nothing reaches the receiver, no error, no reset;
  after the heal TCP's retransmissions deliver everything in order. Holding both directions is a blackhole;
  holding one is one-way loss.
- `delay(ms)`: every chunk is delivered `ms` after it arrived (both directions; order kept).
- `heal()`: no hold, no delay, not blocked: queued bytes flow on in order.

Bounds: at most `CONNECTIONS_MAX` connections are forwarded at once (more are closed); each direction queues
at most `QUEUE_CHUNKS` chunks of at most `CHUNK_BYTES` (a full queue stops the reader: backpressure, as a
real link's buffers would). Every loop ends on the stop event or on a closed socket and waits with a short
timeout, so `close()` joins every thread within `JOIN_TIMEOUT_S`.
"""
from __future__ import annotations

import queue
import socket
import threading
import time

ACCEPT_POLL_S = 0.05
WAIT_S = 0.05  # the longest a thread waits before it looks at the stop event and the fault state again
JOIN_TIMEOUT_S = 5.0
CHUNK_BYTES = 64 * 1024
QUEUE_CHUNKS = 256
CONNECTIONS_MAX = 64
DELAY_MS_MAX = 60_000
_EOF = b""


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
        self._changed = threading.Condition(self._lock)  # notified when hold/delay/blocked change
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._blocked = False
        self._held = {"up": False, "down": False}
        self._delay_s = 0.0
        self._stop = threading.Event()
        self.connections = 0

        self._start(self._accept_loop)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def blocked(self) -> bool:
        return self._blocked

    def state(self) -> str:
        """A short description of the faults in force ("ok" when none)."""
        with self._lock:
            parts = (["blocked"] if self._blocked else []) + [f"{d} held" for d in ("up", "down") if self._held[d]]
            if self._delay_s:
                parts.append(f"delay {self._delay_s * 1000:.0f} ms")
        return ", ".join(parts) or "ok"

    # -- faults ----------------------------------------------------------------------------------------------
    def block(self) -> None:
        with self._lock:
            self._blocked = True
            sockets, self._sockets = self._sockets, set()
            self._changed.notify_all()
        for s in sockets:
            _shut(s)

    def unblock(self) -> None:
        with self._lock:
            self._blocked = False
            self._changed.notify_all()

    def hold(self, up: bool = True, down: bool = True) -> None:
        with self._lock:
            self._held = {"up": up, "down": down}
            self._changed.notify_all()

    def delay(self, ms: float) -> None:
        if not 0 <= ms <= DELAY_MS_MAX:
            raise ValueError(f"delay {ms} ms is outside 0..{DELAY_MS_MAX}")
        with self._lock:
            self._delay_s = ms / 1000.0
            self._changed.notify_all()

    def heal(self) -> None:
        with self._lock:
            self._blocked = False
            self._held = {"up": False, "down": False}
            self._delay_s = 0.0
            self._changed.notify_all()

    def close(self) -> bool:
        """Stop forwarding and join the threads; False if one of them did not stop within JOIN_TIMEOUT_S."""
        self._stop.set()
        self.block()
        self._listener.close()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    # -- forwarding ------------------------------------------------------------------------------------------
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
            for direction, source, target in (("up", client, upstream), ("down", upstream, client)):
                chunks: queue.Queue = queue.Queue(QUEUE_CHUNKS)
                self._start(self._read, source, chunks)
                self._start(self._write, direction, chunks, source, target)

    def _read(self, source: socket.socket, chunks: queue.Queue) -> None:
        try:
            while not self._stop.is_set():
                data = source.recv(CHUNK_BYTES)
                if not self._put(chunks, (time.monotonic(), data)) or not data:
                    return
        except OSError:
            self._put(chunks, (time.monotonic(), _EOF))

    def _put(self, chunks: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                chunks.put(item, timeout=WAIT_S)
                return True
            except queue.Full:
                continue
        return False

    def _write(self, direction: str, chunks: queue.Queue, source: socket.socket, target: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                try:
                    arrived, data = chunks.get(timeout=WAIT_S)
                except queue.Empty:
                    continue
                if not self._wait_deliverable(direction, arrived) or not data:
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets -= {source, target}
            _shut(source)
            _shut(target)

    def _wait_deliverable(self, direction: str, arrived: float) -> bool:
        """Wait until this direction is not held and the chunk's delay has passed; False on stop or block."""
        with self._lock:
            while not self._stop.is_set() and not self._blocked:
                if self._held[direction]:
                    self._changed.wait(WAIT_S)
                    continue
                due = arrived + self._delay_s - time.monotonic()
                if due <= 0:
                    return True
                self._changed.wait(min(due, WAIT_S))
            return False


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
