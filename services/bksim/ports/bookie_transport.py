"""How the ledger client reaches bookies: the calls of proto/bookie.proto, addressed by bookie id.

Implementations: `adapters.bookie_transport.GrpcBookieTransport` (real gRPC: one pipelined AddEntries stream
per bookie) and the simulator's network (`sim.network`), which delivers the same calls to in-process bookie
engines with delays, losses, duplicates, reordering and partitions.

Contract:
- A bookie's answer comes back as StatusCode values, never as an exception.
- No answer (connection refused or broken, deadline passed, partition) raises BookieUnreachable. For an add
  that means the outcome is unknown: the entry may be on the bookie's disk.
- Calls are bounded: each waits at most the implementation's deadline (the broker's `bookie_timeout_ms`).
- `add` takes a batch for ONE bookie; entries of one batch are journaled in order (they go on one stream).
- `read_entries` reads several entries of one ledger from ONE bookie in one call (one message each way):
  result i answers entry_ids[i] exactly as `read_entry` would, except that with `fence` the fence is applied
  once, before any entry is read (a fence that fails gives every entry its status). At most
  READ_BATCH_ENTRIES_MAX ids per call (callers split longer lists; no ids: an empty list, no call). The
  transport asks again for entries a bookie left unread because its answer was full (TOO_MANY_REQUESTS:
  bookie/requests.py), so a caller sees TOO_MANY_REQUESTS only when no progress was possible. No answer at
  all raises BookieUnreachable: nothing is known about any of the entries.
- `list_entries` returns the whole list. A bookie answers it in pages (ListEntries: at most the bookie's
  `list_entries_ids_max` ids, and as many ranges as fit in its frame_bytes_max, per answer: its work per call
  and the answer's size stay bounded however large the ledger), and the transport asks for pages until the
  ledger's end and joins them; each page is one call within the deadline. A page answered other than OK ends
  the listing with that status and []; no answer to a page raises BookieUnreachable. A negative ledger id is
  BAD_REQUEST.
- A request a bookie refuses as overload (an add batch past its in-flight bounds) is answered
  TOO_MANY_REQUESTS for every entry; nothing of it was stored.

tests/bookie_transport_contract.py checks this contract on every implementation (the gRPC transport, the
simulator's, and the unit tests' fake).
"""
from __future__ import annotations

from typing import Protocol, Sequence

from bksim.model.status import StatusCode

# entry ids per read_entries call: the callers' bound (keep it <= the bookies' read_batch_entries_max, 1024 by
# default; a longer list is refused with BAD_REQUEST for every id)
READ_BATCH_ENTRIES_MAX = 256


class BookieTransport(Protocol):
    async def add(self, bookie: str, entries: Sequence[tuple[bytes, bytes, int]]) -> list[StatusCode]:
        """Add (entry bytes, master key, flags) to `bookie`; one status per entry, in order."""

    async def read_entry(self, bookie: str, ledger_id: int, entry_id: int, *, fence: bool = False,
                         master_key: bytes = b"") -> tuple[StatusCode, bytes]:
        """(status, entry bytes); entry_id -1 = the bookie's last entry of the ledger."""

    async def read_entries(self, bookie: str, ledger_id: int, entry_ids: Sequence[int], *, fence: bool = False,
                           master_key: bytes = b"") -> list[tuple[StatusCode, bytes]]:
        """[(status, entry bytes)] with result i for entry_ids[i] (1..READ_BATCH_ENTRIES_MAX ids), in one call
        to `bookie`; with `fence` the ledger is fenced once, first. See the module docstring."""

    async def read_lac(self, bookie: str, ledger_id: int) -> tuple[StatusCode, int]:
        """(status, the bookie's known LAC of the ledger)."""

    async def list_entries(self, bookie: str, ledger_id: int) -> tuple[StatusCode, list[tuple[int, int]]]:
        """(status, the entry ids of the ledger the bookie holds, as sorted, disjoint, non-adjacent inclusive
        ranges [(first, last), ...]) (BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER). OK with [] for a ledger the
        bookie knows without entries; NO_LEDGER for one it does not know; UNKNOWN_STATE for a limbo ledger of
        a formatted bookie (it cannot say what it lost). What the autorecovery auditor's check of all ledgers
        asks each replica."""

    async def close(self) -> None:
        """Release connections; later calls raise BookieUnreachable."""
