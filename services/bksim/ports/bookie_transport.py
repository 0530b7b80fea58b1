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
"""
from __future__ import annotations

from typing import Protocol, Sequence

from bksim.model.status import StatusCode


class BookieTransport(Protocol):
    async def add(self, bookie: str, entries: Sequence[tuple[bytes, bytes, int]]) -> list[StatusCode]:
        """Add (entry bytes, master key, flags) to `bookie`; one status per entry, in order."""

    async def read_entry(self, bookie: str, ledger_id: int, entry_id: int, *, fence: bool = False,
                         master_key: bytes = b"") -> tuple[StatusCode, bytes]:
        """(status, entry bytes); entry_id -1 = the bookie's last entry of the ledger."""

    async def read_lac(self, bookie: str, ledger_id: int) -> tuple[StatusCode, int]:
        """(status, the bookie's known LAC of the ledger)."""

    async def close(self) -> None:
        """Release connections; later calls raise BookieUnreachable."""
