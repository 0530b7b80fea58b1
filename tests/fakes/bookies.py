"""FakeBookies: an IN-MEMORY FAKE of bookies behind the BookieTransport port, for unit tests of the broker layer.

Not a bookie: no journal, no disk. It keeps entries per (bookie, ledger, entry), fencing and master keys with the
status semantics of PROTOCOL.md §2.1, so the broker's shells can be tested without processes. It passes the
BookieTransport contract (tests/bookie_transport_contract.py, run by test_fake_bookies_contract.py) with the
bookie limits it is given (BookieConfig defaults): entry sizes, ReadEntries batch bounds, and an add batch
larger than `add_inflight_per_stream_max` answered TOO_MANY_REQUESTS (its adds are answered at once, so a
batch is all a stream ever has in flight). A bookie can be `down` (every call raises BookieUnreachable),
`hold`ing its answers (calls wait until released), or told to answer a fixed error (list_entries answers it
with no ranges).
"""
from __future__ import annotations

import asyncio

from bksim.formats.entry import HEADER_BYTES, decode_entry
from bksim.model.config import BookieConfig
from bksim.model.errors import BookieUnreachable, FormatError
from bksim.model.status import FENCE_CONFIRMED, FLAG_RECOVERY_ADD, StatusCode


class FakeBookie:
    def __init__(self, bookie_id: str) -> None:
        self.id = bookie_id
        self.entries: dict[int, dict[int, bytes]] = {}
        self.fenced: set[int] = set()
        self.keys: dict[int, bytes] = {}
        self.lac: dict[int, int] = {}
        self.down = False
        self.error: StatusCode | None = None
        self.gate: asyncio.Event | None = None  # when set: calls wait for it
        self.waiting = 0  # calls waiting at the gate now (tests wait for this instead of sleeping)
        self.adds = 0
        self.add_calls: list[int] = []  # entries per add call, in call order (counted before the gate)
        self.read_calls: list[tuple[int, tuple[int, ...], bool]] = []  # (ledger, entry ids, fence) per read call


class FakeBookies:
    def __init__(self, ids, config: BookieConfig = BookieConfig()) -> None:
        self.bookies = {b: FakeBookie(b) for b in ids}
        self.config = config
        self.closed = False

    def __getitem__(self, bookie_id: str) -> FakeBookie:
        return self.bookies[bookie_id]

    async def _reach(self, bookie_id: str) -> FakeBookie:
        if self.closed:
            raise BookieUnreachable(bookie_id, "the fake transport is closed")
        b = self.bookies.get(bookie_id)
        if b is None or b.down:
            raise BookieUnreachable(bookie_id, "connection refused (fake)")
        await asyncio.sleep(0)
        if b.gate is not None:
            b.waiting += 1
            try:
                await b.gate.wait()
            finally:
                b.waiting -= 1
        if b.down:
            raise BookieUnreachable(bookie_id, "connection broken (fake)")
        return b

    async def add(self, bookie, entries):
        if bookie in self.bookies:
            self.bookies[bookie].add_calls.append(len(entries))
        b = await self._reach(bookie)
        if len(entries) > self.config.add_inflight_per_stream_max:
            return [StatusCode.TOO_MANY_REQUESTS] * len(entries)
        out = []
        for data, key, flags in entries:
            if not HEADER_BYTES <= len(data) <= self.config.entry_bytes_max:
                out.append(StatusCode.BAD_REQUEST)
                continue
            try:
                e = decode_entry(data)
            except FormatError:
                out.append(StatusCode.BAD_REQUEST)
                continue
            if b.error is not None:
                out.append(b.error)
                continue
            if b.keys.get(e.ledger_id, key) != key:
                out.append(StatusCode.UNAUTHORIZED)
                continue
            if e.ledger_id in b.fenced and not flags & FLAG_RECOVERY_ADD:
                out.append(StatusCode.FENCED)
                continue
            if not key:
                out.append(StatusCode.BAD_REQUEST)
                continue
            b.keys[e.ledger_id] = key
            b.entries.setdefault(e.ledger_id, {})[e.entry_id] = bytes(data)
            b.lac[e.ledger_id] = max(b.lac.get(e.ledger_id, -1), e.last_add_confirmed)
            b.adds += 1
            out.append(StatusCode.OK)
        return out

    async def read_entry(self, bookie, ledger_id, entry_id, *, fence=False, master_key=b""):
        b = await self._reach(bookie)
        b.read_calls.append((ledger_id, (entry_id,), fence))
        return self._read(b, ledger_id, entry_id, fence, master_key)

    async def read_entries(self, bookie, ledger_id, entry_ids, *, fence=False, master_key=b""):
        """One call for all of entry_ids: the fence (if asked) once, by the first id, as the real bookie."""
        ids = tuple(entry_ids)
        if not ids:
            return []
        b = await self._reach(bookie)
        b.read_calls.append((ledger_id, ids, fence))
        if len(ids) > self.config.read_batch_entries_max or min(ids) < -1:
            return [(StatusCode.BAD_REQUEST, b"")] * len(ids)
        out = []
        for i, entry_id in enumerate(ids):
            status, data = self._read(b, ledger_id, entry_id, fence and i == 0, master_key)
            if fence and i == 0 and status not in FENCE_CONFIRMED:
                return [(status, b"")] * len(ids)
            out.append((status, data))
        return out

    @staticmethod
    def _read(b, ledger_id, entry_id, fence, master_key):
        if b.error is not None:
            return b.error, b""
        if fence:
            if b.keys.get(ledger_id, master_key) != master_key:
                return StatusCode.UNAUTHORIZED, b""
            if not master_key:
                return StatusCode.BAD_REQUEST, b""
            b.keys[ledger_id] = master_key
            b.fenced.add(ledger_id)
        if entry_id < -1:
            return StatusCode.BAD_REQUEST, b""
        entries = b.entries.get(ledger_id)
        if not entries:  # a ledger is known once an add or a fence stored its key
            return (StatusCode.NO_ENTRY if ledger_id in b.keys else StatusCode.NO_LEDGER), b""
        if entry_id == -1:
            entry_id = max(entries)
        data = entries.get(entry_id)
        return (StatusCode.OK, data) if data is not None else (StatusCode.NO_ENTRY, b"")

    async def read_lac(self, bookie, ledger_id):
        b = await self._reach(bookie)
        if ledger_id not in b.keys:
            return StatusCode.NO_LEDGER, -1
        return StatusCode.OK, b.lac.get(ledger_id, -1)

    async def list_entries(self, bookie, ledger_id):
        """The ranges of the bookie's entries of the ledger, in one answer (the fake has no pages to join)."""
        b = await self._reach(bookie)
        if b.error is not None:
            return b.error, []
        if ledger_id < 0:
            return StatusCode.BAD_REQUEST, []
        entries = b.entries.get(ledger_id)
        if not entries:
            return (StatusCode.OK if ledger_id in b.keys else StatusCode.NO_LEDGER), []
        ranges: list[tuple[int, int]] = []
        for entry_id in sorted(entries):
            if ranges and entry_id == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], entry_id)
            else:
                ranges.append((entry_id, entry_id))
        return StatusCode.OK, ranges

    async def close(self):
        self.closed = True
