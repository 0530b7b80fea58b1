"""The simulated network between named nodes, and the BookieTransport port over it.

Owns message delivery in virtual time: per directed link (src -> dst) a delay (base + uniform jitter), loss,
duplication, reordering and cuts (partitions, symmetric or one-way), plus "slow" nodes whose every link gets
an extra delay, and nodes that are down (a crashed process: nothing reaches it, nothing leaves it). Faults are
set and healed at run time (by a scenario's fault plan); `heal()` restores the clean network.

Invariants:
- Every random draw comes from the rng given to SimNetwork, in the order messages are sent; delivery times are
  virtual (the running SimLoop). One seed -> one delivery order -> one trace.
- A message sent on a *stream* (e.g. the AddEntries stream of one client to one bookie) is delivered in send
  order unless reordering is enabled on its link (then its jitter alone decides the order). Messages outside
  a stream (unary calls, replies of unary calls) are independent.
- A message is dropped when: the link is cut or either end is down when it is sent; the loss draw says so;
  or the link is cut or the destination is down when it arrives (it was in flight when the fault began).
- A duplicated message is delivered twice (the copy with its own delay, also in stream order).

SimBookieTransport implements ports.bookie_transport.BookieTransport for one client node: a call travels
client -> bookie through the network, the bookie's real BookieEngine handles it (start_adds / read_entry /
read_lac / list_entries), the answer travels back bookie -> client. The bookie side runs the gRPC server's
rules from the same code (bookie/requests.py): a ReadEntries call is one message each way, answered by
read_entries (batch bound, the fence once by the first id, a status per id, the frame_bytes_max budget), and
the observer sees each id's answer as a "read_entry"; the client asks again for ids the bookie left unread
(answered_count), as GrpcBookieTransport does; list_entries is one call per page of the engine's answer,
joined by list_all_entries, as there too. The add bounds are the bookie incarnation's AddAdmission (BookieHost
.add_admission), one share per (client, bookie incarnation) add stream: a refused batch is answered
TOO_MANY_REQUESTS without reaching the engine; an admitted one is started in the engine when it arrives.
The answers of one client's add stream leave in request order, each once its batch is durable. A
duplicated add request reaches the engine twice (two batches, two answers; the client takes the first). No
answer within `timeout_ms` of virtual time (request or reply lost, a partition, a crashed bookie) raises
BookieUnreachable; so does any call after close(). An answer computed by a bookie incarnation that has
crashed since is never sent. An exception from the engine escapes the request handler (sim.cluster records
it): the simulator reports engine bugs instead of answering them.

Must not: read the wall clock, use threads, or draw randomness from anything but the rng it is given.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Mapping, Protocol, Sequence

from bksim.bookie.requests import AddAdmission, AddStreamAdmission, answered_count, list_all_entries, read_entries
from bksim.model.errors import BookieUnreachable
from bksim.model.status import StatusCode

CALLS_INFLIGHT_MAX = 100_000  # unanswered calls of one transport: beyond it, a bug (calls never time out)


@dataclass(frozen=True, slots=True)
class LinkFaults:
    """How one directed link behaves. Delays in virtual ms, probabilities in [0, 1]."""
    delay_ms: float = 0.2  # base one-way delay
    jitter_ms: float = 0.0  # plus uniform [0, jitter_ms]
    loss: float = 0.0  # probability a message is dropped
    duplicate: float = 0.0  # probability a message is delivered twice
    reorder: bool = False  # streams on this link lose their FIFO order
    cut: bool = False  # partitioned: nothing gets through

    def __post_init__(self) -> None:
        assert self.delay_ms >= 0 and self.jitter_ms >= 0, self
        assert 0.0 <= self.loss <= 1.0 and 0.0 <= self.duplicate <= 1.0, self

    def describe(self) -> str:
        parts = [f"delay {self.delay_ms:g}+{self.jitter_ms:g} ms"]
        if self.loss:
            parts.append(f"loss {self.loss:g}")
        if self.duplicate:
            parts.append(f"dup {self.duplicate:g}")
        if self.reorder:
            parts.append("reorder")
        if self.cut:
            parts.append("CUT")
        return ", ".join(parts)


class SimNetwork:
    """Links between named nodes. `clean` is the fault-free behaviour `heal()` returns to; `log` (optional)
    receives one line per fault change and per dropped or duplicated message, and with `trace_messages` one
    line per message sent and delivered."""

    def __init__(self, rng: random.Random, clean: LinkFaults = LinkFaults(), *,
                 log: Callable[[str], None] | None = None, trace_messages: bool = False) -> None:
        self._rng = rng
        self.clean = clean
        self._default = clean
        self._links: dict[tuple[str, str], LinkFaults] = {}
        self._slow: dict[str, float] = {}  # node -> extra ms on each of its links
        self._down: set[str] = set()
        self._stream_last: dict[tuple, float] = {}  # stream key -> due time (s) of its last message
        self._log = log or (lambda line: None)
        self._trace_messages = trace_messages
        self._ids = itertools.count(1)
        self.stats = {"sent": 0, "delivered": 0, "lost": 0, "duplicated": 0, "dropped_cut": 0, "dropped_down": 0}

    # -- fault control -----------------------------------------------------------------------------------
    def link(self, src: str, dst: str) -> LinkFaults:
        """The faults of link src -> dst now (its override, else the network default)."""
        return self._links.get((src, dst), self._default)

    def set_default(self, **changes: Any) -> None:
        """Change every link without an override (e.g. loss=0.05 everywhere)."""
        self._default = dataclasses.replace(self._default, **changes)
        self._log(f"net: default links now {self._default.describe()}")

    def set_link(self, src: str, dst: str, **changes: Any) -> None:
        """Override one directed link (starting from its current behaviour)."""
        self._links[(src, dst)] = dataclasses.replace(self.link(src, dst), **changes)
        self._log(f"net: link {src}->{dst} now {self._links[(src, dst)].describe()}")

    def partition(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Cut a -> b, and b -> a too unless `one_way` (then b still reaches a)."""
        for src, dst in ((a, b),) if one_way else ((a, b), (b, a)):
            self._links[(src, dst)] = dataclasses.replace(self.link(src, dst), cut=True)
        self._log(f"net: PARTITION {a} {'->' if one_way else '<->'} {b}")

    def heal_partition(self, a: str, b: str) -> None:
        for src, dst in ((a, b), (b, a)):
            if (src, dst) in self._links:
                self._links[(src, dst)] = dataclasses.replace(self._links[(src, dst)], cut=False)
        self._log(f"net: heal {a} <-> {b}")

    def slow(self, node: str, extra_ms: float) -> None:
        """Every link from or to `node` gets `extra_ms` more delay (0: back to normal)."""
        if extra_ms > 0:
            self._slow[node] = extra_ms
        else:
            self._slow.pop(node, None)
        self._log(f"net: {node} slow by {extra_ms:g} ms")

    def heal(self) -> None:
        """Back to the clean network: no override, no slow node (down nodes stay down: they are processes)."""
        self._default = self.clean
        self._links.clear()
        self._slow.clear()
        self._log(f"net: HEALED (every link {self.clean.describe()})")

    def set_up(self, node: str, up: bool) -> None:
        """A node's process is up or down (crashed): a down node neither receives nor sends."""
        if up:
            self._down.discard(node)
        else:
            self._down.add(node)

    def is_up(self, node: str) -> bool:
        return node not in self._down

    def describe(self) -> list[str]:
        lines = [f"default: {self._default.describe()}"]
        lines += [f"{src}->{dst}: {f.describe()}" for (src, dst), f in sorted(self._links.items())]
        lines += [f"slow {node}: +{ms:g} ms" for node, ms in sorted(self._slow.items())]
        return lines

    # -- delivery ----------------------------------------------------------------------------------------
    def send(self, src: str, dst: str, deliver: Callable[[], None], *, stream: Any = None, what: str = "") -> int:
        """Send one message; `deliver()` runs when (and each time) it arrives. `stream`: a key (with src and
        dst) for messages that must arrive in send order. Returns how many copies were scheduled (0: lost)."""
        msg_id = next(self._ids)
        self.stats["sent"] += 1
        label = f"msg#{msg_id} {src}->{dst} {what}"
        faults = self.link(src, dst)
        if faults.cut or src in self._down or dst in self._down:
            self.stats["dropped_cut" if faults.cut else "dropped_down"] += 1
            if self._trace_messages:
                self._log(f"net: {label} not sent ({'link cut' if faults.cut else 'node down'})")
            return 0
        if faults.loss and self._rng.random() < faults.loss:
            self.stats["lost"] += 1
            self._log(f"net: {label} LOST")
            return 0
        copies = 1
        if faults.duplicate and self._rng.random() < faults.duplicate:
            copies = 2
            self.stats["duplicated"] += 1
            self._log(f"net: {label} DUPLICATED")
        loop = asyncio.get_running_loop()
        extra = self._slow.get(src, 0.0) + self._slow.get(dst, 0.0)
        key = None if stream is None or faults.reorder else (src, dst, stream)
        for copy in range(copies):
            delay_ms = faults.delay_ms + extra + (self._rng.uniform(0.0, faults.jitter_ms) if faults.jitter_ms else 0.0)
            due = loop.time() + delay_ms / 1000.0
            if key is not None:
                due = max(due, self._stream_last.get(key, 0.0))  # equal due times run in scheduling order
                self._stream_last[key] = due
            loop.call_at(due, self._arrive, src, dst, deliver, label if copy == 0 else f"{label} (copy)")
        if self._trace_messages:
            self._log(f"net: {label} sent")
        return copies

    def _arrive(self, src: str, dst: str, deliver: Callable[[], None], label: str) -> None:
        if self.link(src, dst).cut:
            self.stats["dropped_cut"] += 1
            self._log(f"net: {label} dropped in flight (link cut)")
            return
        if dst in self._down:
            self.stats["dropped_down"] += 1
            if self._trace_messages:
                self._log(f"net: {label} dropped ({dst} down)")
            return
        self.stats["delivered"] += 1
        if self._trace_messages:
            self._log(f"net: {label} delivered")
        deliver()


# -- the bookie transport over the network ---------------------------------------------------------------
class BookieHost(Protocol):
    """What the transport needs of a simulated bookie process (sim.cluster.SimBookie)."""
    bookie_id: str
    incarnation: int
    add_admission: AddAdmission  # the add bounds of the current incarnation

    def serving(self) -> Any:
        """The BookieEngine answering requests now, or None (crashed, starting, stopped)."""

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        """Run a request handler that dies with the current incarnation (cancelled by a crash)."""


# (bookie id, incarnation, call kind "add" | "read_entry" | "read_lac" | "list_entries", request, the engine's full
# answer)
Observer = Callable[[str, int, str, tuple, Any], None]


class SimBookieTransport:
    """ports.bookie_transport.BookieTransport for `client_node`, over `network`, to the bookies in `bookies`
    (bookie id -> BookieHost; the id is also the bookie's network node). `observer`, if given, sees every
    answer where the bookie computes it (in the order the engine answered), before it is sent: what a checker
    needs to know of the bookies' side (fences acknowledged, known LACs)."""

    def __init__(self, network: SimNetwork, client_node: str, bookies: Mapping[str, BookieHost],
                 timeout_ms: float, observer: Observer | None = None) -> None:
        assert timeout_ms > 0
        self._observe = observer
        self.network = network
        self.client_node = client_node
        self._bookies = bookies
        self.timeout_ms = timeout_ms
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._stream_tails: dict[tuple[str, int], asyncio.Task] = {}  # (bookie, incarnation) -> last answer
        self._add_streams: dict[str, tuple[int, AddStreamAdmission]] = {}  # bookie -> (incarnation, its share)
        self._closed = False
        self.stats = {"calls": 0, "timeouts": 0}

    # -- the port ----------------------------------------------------------------------------------------
    async def add(self, bookie: str, entries: Sequence[tuple[bytes, bytes, int]]) -> list[StatusCode]:
        items = list(entries)
        return await self._call(bookie, f"add x{len(items)}", ("adds", self.client_node),
                                lambda host, call_id: self._serve_add(host, call_id, items))

    async def read_entry(self, bookie: str, ledger_id: int, entry_id: int, *, fence: bool = False,
                         master_key: bytes = b"") -> tuple[StatusCode, bytes]:
        async def handle(engine) -> tuple:
            return await engine.read_entry(ledger_id, entry_id, fence=fence, master_key=master_key)
        what = f"read{'+fence' if fence else ''} {ledger_id}:{entry_id}"
        return await self._call(bookie, what, None, lambda host, call_id: self._serve_unary(
            host, call_id, handle, "read_entry", (ledger_id, entry_id, fence), lambda r: (r[0], r[1])))

    async def read_entries(self, bookie: str, ledger_id: int, entry_ids: Sequence[int], *, fence: bool = False,
                           master_key: bytes = b"") -> list[tuple[StatusCode, bytes]]:
        n = len(entry_ids)
        out: list[tuple[StatusCode, bytes]] = []
        while len(out) < n:  # one call, plus one for the rest each time the bookie's answer was full
            ids = list(entry_ids[len(out):])
            what = f"read-batch{'+fence' if fence else ''} {ledger_id}:{ids[0]} x{len(ids)}"
            results = await self._call(bookie, what, None, lambda host, call_id: self._serve_read_entries(
                host, call_id, ledger_id, ids, fence, master_key))
            out += results[:answered_count([status for status, _ in results])]
        return out

    async def read_lac(self, bookie: str, ledger_id: int) -> tuple[StatusCode, int]:
        async def handle(engine) -> tuple:
            return await engine.read_lac(ledger_id)
        return await self._call(bookie, f"read-lac {ledger_id}", None, lambda host, call_id: self._serve_unary(
            host, call_id, handle, "read_lac", (ledger_id,), lambda r: (r[0], r[1])))

    async def list_entries(self, bookie: str, ledger_id: int) -> tuple[StatusCode, list[tuple[int, int]]]:
        async def page(first_entry: int) -> tuple:
            async def handle(engine) -> tuple:
                return await engine.list_entries(ledger_id, first_entry)
            return await self._call(bookie, f"list {ledger_id} from {first_entry}", None,
                                    lambda host, call_id: self._serve_unary(
                                        host, call_id, handle, "list_entries", (ledger_id, first_entry),
                                        lambda r: (r[0], r[1], r[2])))
        return await list_all_entries(bookie, ledger_id, page)

    async def close(self) -> None:
        """Later calls raise BookieUnreachable; calls waiting for an answer fail with it now."""
        self._closed = True
        for _incarnation, admission in self._add_streams.values():
            admission.close()
        self._add_streams.clear()
        for call_id in sorted(self._calls):
            future = self._calls.pop(call_id)
            if not future.done():
                future.set_exception(BookieUnreachable("?", f"transport of {self.client_node} closed"))

    # -- client side -------------------------------------------------------------------------------------
    async def _call(self, bookie: str, what: str, stream: Any,
                    serve: Callable[[BookieHost, int], None]) -> Any:
        if self._closed:
            raise BookieUnreachable(bookie, f"transport of {self.client_node} is closed")
        host = self._bookies.get(bookie)
        if host is None:
            raise BookieUnreachable(bookie, "no such bookie in the simulated cluster")
        if len(self._calls) >= CALLS_INFLIGHT_MAX:
            raise BookieUnreachable(bookie, f"{CALLS_INFLIGHT_MAX} calls in flight (CALLS_INFLIGHT_MAX)")
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        self.stats["calls"] += 1
        future = loop.create_future()
        self._calls[call_id] = future
        timer = loop.call_later(self.timeout_ms / 1000.0, self._expire, call_id)
        self.network.send(self.client_node, bookie, lambda: serve(host, call_id), stream=stream,
                          what=f"call#{call_id} {what}")
        try:
            return await future
        except BookieUnreachable as e:
            raise BookieUnreachable(bookie, e.why) from None
        finally:
            timer.cancel()
            self._calls.pop(call_id, None)

    def _expire(self, call_id: int) -> None:
        future = self._calls.get(call_id)
        if future is not None and not future.done():
            self.stats["timeouts"] += 1
            future.set_exception(BookieUnreachable("?", f"no answer within {self.timeout_ms:g} ms"))

    def _answered(self, call_id: int, result: Any) -> None:
        future = self._calls.get(call_id)
        if future is not None and not future.done():
            future.set_result(result)  # a duplicate or late answer finds the call done (or gone): ignored

    # -- bookie side (runs at the bookie when a request arrives) -------------------------------------------
    def _reply(self, host: BookieHost, incarnation: int, call_id: int, result: Any, stream: Any) -> None:
        if host.incarnation != incarnation or host.serving() is None:
            return  # the incarnation that computed it crashed: the answer never leaves
        self.network.send(host.bookie_id, self.client_node, lambda: self._answered(call_id, result),
                          stream=stream, what=f"answer#{call_id}")

    def _serve_add(self, host: BookieHost, call_id: int, items: list) -> None:
        engine = host.serving()
        if engine is None:
            return
        incarnation = host.incarnation
        admission = self._add_stream(host)
        refused = admission.admit(len(items))
        # validation, cache, journal queueing: now, in arrival order
        batch = engine.start_adds(items) if refused is None else None
        key = (host.bookie_id, incarnation)
        previous = self._stream_tails.get(key)

        async def answer() -> None:
            if previous is not None and not previous.done():
                await asyncio.wait([previous])  # answers of one stream leave in request order
            if batch is None:
                statuses = refused[0]
            else:
                statuses, _message = await batch.result()
                admission.answered(len(items))
            if self._observe is not None and host.incarnation == incarnation and host.serving() is not None:
                self._observe(host.bookie_id, incarnation, "add", tuple(items), statuses)
            self._reply(host, incarnation, call_id, statuses, ("answers", self.client_node))
            if self._stream_tails.get(key) is task:
                del self._stream_tails[key]
        task = self._stream_tails[key] = host.spawn(answer(), f"{host.bookie_id} answer#{call_id}")

    def _add_stream(self, host: BookieHost) -> AddStreamAdmission:
        """This client's add stream to the bookie's current incarnation: its share of the add bounds (a new
        incarnation is a new stream)."""
        current = self._add_streams.get(host.bookie_id)
        if current is None or current[0] != host.incarnation:
            if current is not None:
                current[1].close()
            current = self._add_streams[host.bookie_id] = (host.incarnation, host.add_admission.open_stream())
        return current[1]

    def _serve_read_entries(self, host: BookieHost, call_id: int, ledger_id: int, ids: list[int], fence: bool,
                            master_key: bytes) -> None:
        engine = host.serving()
        if engine is None:
            return
        incarnation = host.incarnation

        def observe(entry_id: int, fenced: bool, result: tuple) -> None:
            if self._observe is not None and host.incarnation == incarnation and host.serving() is not None:
                self._observe(host.bookie_id, incarnation, "read_entry", (ledger_id, entry_id, fenced), result)

        async def answer() -> None:
            results = await read_entries(engine, engine.config, ledger_id, ids, fence, master_key, on_read=observe)
            self._reply(host, incarnation, call_id, [(status, entry) for status, entry, _lac, _message in results],
                        None)
        host.spawn(answer(), f"{host.bookie_id} answer#{call_id}")

    def _serve_unary(self, host: BookieHost, call_id: int, handle: Callable[[Any], Coroutine[Any, Any, Any]],
                     kind: str, request: tuple, to_port: Callable[[Any], Any]) -> None:
        engine = host.serving()
        if engine is None:
            return
        incarnation = host.incarnation

        async def answer() -> None:
            result = await handle(engine)
            if self._observe is not None and host.incarnation == incarnation and host.serving() is not None:
                self._observe(host.bookie_id, incarnation, kind, request, result)
            self._reply(host, incarnation, call_id, to_port(result), None)
        host.spawn(answer(), f"{host.bookie_id} answer#{call_id}")
