"""Engine fixtures: a real BookieEngine over real files and RocksDB in a tmp dir (no fakes)."""
from __future__ import annotations

import dataclasses
import uuid

import pytest

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.formats.entry import encode_entry
from bksim.model.config import BookieConfig

KEY = b"k" * 32


class EngineFactory:
    """Builds engines on one pair of directories, so a test can 'crash' one and start the next."""

    def __init__(self, base) -> None:
        self.journal_dir = str(base / "journal")
        self.ledger_dir = str(base / "ledgers")
        self.instance_id = str(uuid.uuid4())
        self.logs: list[str] = []

    def make(self, fault_hook=None, clock=None, first_checkpoint_ms=None, first_half_fraction=None,
             **overrides) -> BookieEngine:
        overrides.setdefault("write_cache_entry_overhead_bytes", 0)  # these tests size caches in entry bytes
        config = dataclasses.replace(BookieConfig(), **overrides)
        return BookieEngine(config, disk=LocalDisk(), clock=clock or SystemClock(), open_kv=open_rocks,
                            instance_id=self.instance_id, journal_dir=self.journal_dir, ledger_dir=self.ledger_dir,
                            log=self.logs.append, fault_hook=fault_hook, first_checkpoint_ms=first_checkpoint_ms,
                            first_half_fraction=first_half_fraction)

    async def started(self, **overrides) -> BookieEngine:
        engine = self.make(**overrides)
        await engine.start()
        return engine


@pytest.fixture
def engines(tmp_path) -> EngineFactory:
    return EngineFactory(tmp_path)


def entry(ledger_id: int, entry_id: int, payload: bytes = b"", lac: int = -1) -> bytes:
    return encode_entry(ledger_id, entry_id, lac, 0, payload or f"payload {ledger_id}:{entry_id}".encode())
