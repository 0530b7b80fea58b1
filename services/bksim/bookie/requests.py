"""The bookie's request rules above the engine, shared by the gRPC server (adapters/bookie_server.py) and the
simulator's transport (sim/network.py): one implementation, so the simulator runs what production runs.

ReadEntries (several entries of one ledger in one call), `read_entries`:
- at most `read_batch_entries_max` ids; none, more, or an id below -1: BAD_REQUEST for every result (one
  result when there are no ids), and nothing is read;
- with FENCE the fence is applied once, by the first id's read, before any other entry is read; when that
  read does not confirm the fence (any status outside model/status.py FENCE_CONFIRMED) every result carries
  its status and nothing more is read;
- result i answers entry_ids[i] as the engine's read_entry does, in id order;
- the response stays within `frame_bytes_max`: once the next entry would not fit, it and every later id are
  answered TOO_MANY_REQUESTS (not sent: the client asks for them again). The first result always goes, so
  each call makes progress; `answered_count` is the client's side of that rule.

ListEntries (which entries of a ledger a bookie holds, as sorted, disjoint, non-adjacent inclusive ranges), one
page per call: a page covers the ids from the asked `first_entry` up to its `next_entry` (exclusive; -1: the
ledger's end) with at most `list_entries_ids_max` ids (the bookie's work per call) in at most
`list_ranges_max` ranges (what fits in `frame_bytes_max`). The engine's list_entries makes the pages;
`list_all_entries` is the client's side: it asks from 0 until a page reaches the end and joins a range that a
page boundary cut in two.

Adds, `AddAdmission`: `add_inflight_per_stream_max` unacknowledged entries per add stream and
`add_inflight_total_max` for the whole bookie. A request that would pass either bound is answered
TOO_MANY_REQUESTS for every entry, without reaching the engine; an admitted request counts until its answer
leaves (`answered`) or its stream ends (`close`).

Must not: import gRPC or read clocks; the callers own transport, ordering and what an engine bug becomes.
"""
from __future__ import annotations

from typing import Awaitable, Callable, Protocol, Sequence

from bksim.model.config import BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import FENCE_CONFIRMED, StatusCode

_TOO_MANY = StatusCode.TOO_MANY_REQUESTS
_BAD_REQUEST = StatusCode.BAD_REQUEST
_IO_ERROR = StatusCode.IO_ERROR
RESULT_OVERHEAD = 48  # protobuf bytes of one ReadEntryResult besides its entry and message (tags, lengths, LAC)
RESPONSE_OVERHEAD = 64  # slack for the ReadEntriesResponse framing

RANGE_BYTES_MAX = 22  # protobuf bytes of one EntryRange at most: tag and length, two int64 fields (tag + varint)

# (status, entry bytes, known LAC, message): what the engine's read_entry returns, per id
ReadResult = tuple[StatusCode, bytes, int, str]


class EntryReader(Protocol):
    async def read_entry(self, ledger_id: int, entry_id: int, fence: bool = False,
                         master_key: bytes = b"") -> ReadResult: ...


def read_batch_refusal(ledger_id: int, entry_ids: Sequence[int], batch_entries_max: int) -> str | None:
    """Why a ReadEntries request is refused (BAD_REQUEST for every id), or None when it is well formed."""
    n = len(entry_ids)
    if n == 0 or n > batch_entries_max:
        return (f"ReadEntries asks for {n} entries of ledger {ledger_id}; "
                f"1..read_batch_entries_max={batch_entries_max} allowed")
    low = min(entry_ids)
    if low < -1:
        return f"ReadEntries of ledger {ledger_id}: invalid entry id {low} (ids are >= -1)"
    return None


async def read_entries(engine: EntryReader, config: BookieConfig, ledger_id: int, entry_ids: Sequence[int],
                       fence: bool = False, master_key: bytes = b"", *,
                       on_read: Callable[[int, bool, ReadResult], None] | None = None,
                       internal_error: Callable[[Exception], str] | None = None) -> list[ReadResult]:
    """The results of one ReadEntries request (see the module docstring), result i for entry_ids[i].

    `on_read(entry_id, fenced, result)` sees every answer the engine gives, as it gives it. An exception from
    the engine propagates, unless `internal_error` is given: then it returns the message, and that id and
    every later one are answered IO_ERROR with it.
    """
    n = len(entry_ids)
    why = read_batch_refusal(ledger_id, entry_ids, config.read_batch_entries_max)
    if why is not None:
        return [(_BAD_REQUEST, b"", -1, why)] * max(n, 1)
    response_bytes_max = config.frame_bytes_max - RESPONSE_OVERHEAD
    read_entry = engine.read_entry
    results: list[ReadResult] = []
    size = 0
    try:
        for i, entry_id in enumerate(entry_ids):
            fenced = fence and i == 0  # the fence, once, before any entry is read
            if fenced:
                result = await read_entry(ledger_id, entry_id, True, master_key)
            else:
                result = await read_entry(ledger_id, entry_id)
            if on_read is not None:
                on_read(entry_id, fenced, result)
            status, entry, _lac, message = result
            if fenced and status not in FENCE_CONFIRMED:
                return [(status, b"", -1, f"fence not confirmed: {message}")] * n
            size += len(entry) + len(message) + RESULT_OVERHEAD
            if size > response_bytes_max and results:
                why = (f"entries {ledger_id}:{entry_id} and after not read: the answer would pass "
                       f"frame_bytes_max={config.frame_bytes_max}; ask again")
                results += [(_TOO_MANY, b"", -1, why)] * (n - i)
                break
            results.append(result)
    except Exception as e:  # noqa: BLE001 - the caller decides what an engine bug becomes
        if internal_error is None:
            raise
        why = internal_error(e)
        results += [(_IO_ERROR, b"", -1, why)] * (n - len(results))
    return results


def answered_count(statuses: Sequence[StatusCode]) -> int:
    """How many leading results of a ReadEntries answer answer their ids: all of them, except that a
    TOO_MANY_REQUESTS after at least one result marks the ids the bookie left unread (its answer was full)."""
    for i, status in enumerate(statuses):
        if status is _TOO_MANY and i > 0:
            return i
    return len(statuses)


def list_ranges_max(config: BookieConfig) -> int:
    """Ranges one ListEntries answer holds at most: as many as fit in the bookie's frame_bytes_max."""
    return max(1, (config.frame_bytes_max - RESPONSE_OVERHEAD) // RANGE_BYTES_MAX)


# one ListEntries page as a client sees it: (status, ranges, next entry: where the next page starts, -1 at the end)
ListPage = tuple[StatusCode, list[tuple[int, int]], int]


async def list_all_entries(bookie: str, ledger_id: int,
                           ask: Callable[[int], Awaitable[ListPage]]) -> tuple[StatusCode, list[tuple[int, int]]]:
    """Every range of the ledger on `bookie`: `ask(first_entry)` makes one ListEntries call; pages are asked for
    from 0 until one answers next entry -1, and a range a page boundary cut is joined again. A page answered
    other than OK ends the listing with its status and no ranges (the bookie can no longer say). A page that
    does not advance (next entry not past the one asked for) is a broken answer: BookieUnreachable."""
    status, ranges, next_entry = await ask(0)
    if status is not StatusCode.OK:
        return status, []
    ranges = list(ranges)
    first_entry = 0
    while next_entry != -1:
        if next_entry <= first_entry:
            raise BookieUnreachable(bookie, f"ListEntries {ledger_id} from {first_entry}: the answer does not "
                                            f"advance (next entry {next_entry})")
        first_entry = next_entry
        status, more, next_entry = await ask(first_entry)
        if status is not StatusCode.OK:
            return status, []
        if more and ranges and more[0][0] == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], more[0][1])
            more = more[1:]
        ranges += more
    return StatusCode.OK, ranges


class AddAdmission:
    """The add bounds of one bookie (one process, or one simulated incarnation): `open_stream()` per add
    stream; every stream's admitted, unanswered entries also count toward the bookie-wide bound."""

    __slots__ = ("bookie_id", "per_stream_max", "total_max", "inflight_total", "requests", "entries",
                 "rejected_entries")

    def __init__(self, config: BookieConfig, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.per_stream_max = config.add_inflight_per_stream_max
        self.total_max = config.add_inflight_total_max
        self.inflight_total = 0  # admitted entries not yet answered, all streams
        self.requests = 0
        self.entries = 0  # admitted
        self.rejected_entries = 0

    def open_stream(self) -> "AddStreamAdmission":
        return AddStreamAdmission(self)


class AddStreamAdmission:
    """One add stream's share of an AddAdmission."""

    __slots__ = ("_bookie", "inflight", "closed")

    def __init__(self, bookie: AddAdmission) -> None:
        self._bookie = bookie
        self.inflight = 0  # entries admitted on this stream and not yet answered
        self.closed = False

    def admit(self, n: int) -> tuple[list[StatusCode], str] | None:
        """Admit a request of `n` entries (None: it goes to the engine and counts until answered), or return
        the answer it gets instead: TOO_MANY_REQUESTS for every entry, and why."""
        b = self._bookie
        b.requests += 1
        if self.inflight + n > b.per_stream_max:
            why = (f"too many unacknowledged adds on this stream: {self.inflight} + {n} > "
                   f"add_inflight_per_stream_max={b.per_stream_max}")
        elif b.inflight_total + n > b.total_max:
            why = (f"too many adds in flight in bookie {b.bookie_id}: {b.inflight_total} + {n} > "
                   f"add_inflight_total_max={b.total_max}")
        else:
            b.entries += n
            self.inflight += n
            b.inflight_total += n
            return None
        b.rejected_entries += n
        return [_TOO_MANY] * n, why

    def answered(self, n: int) -> None:
        """An admitted request of `n` entries was answered."""
        if self.closed:
            return
        self.inflight -= n
        self._bookie.inflight_total -= n

    def close(self) -> None:
        """The stream ended: its unanswered entries stop counting."""
        if not self.closed:
            self.closed = True
            self._bookie.inflight_total -= self.inflight
            self.inflight = 0
