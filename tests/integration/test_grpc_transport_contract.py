"""The BookieTransport contract (tests/bookie_transport_contract.py) on GrpcBookieTransport, against an
in-process gRPC bookie (adapters/bookie_server.py over a real BookieEngine on real files and RocksDB) on
loopback with the contract's limits; each check gets a fresh bookie. Bookie ids are "host:port" addresses,
resolved to themselves. The same checks run on the simulator's transport (tests/sim/test_sim_transport_contract.py)
and on the broker unit tests' fake (tests/unit/broker/test_fake_bookies_contract.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import pytest

from bookie_transport_contract import CONTRACT, FRAME_BYTES_MAX, check_id, contract_config
from bksim.adapters.bookie_server import BookieServer
from bksim.adapters.bookie_transport import GrpcBookieTransport
from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.model.config import BookieConfig
from helpers import free_port

TIMEOUT_MS = 5_000


class RoomyDisk:
    """Disk usage for the server's monitor: always plenty free, so the machine's own disk cannot turn the
    bookie read-only under the checks."""

    def usage(self, path: str) -> tuple[int, int]:
        return 1 << 40, 1 << 40


class GrpcHarness:
    def __init__(self, bookie: str) -> None:
        async def resolve(bookie_id: str) -> str:
            return bookie_id

        self.transport = GrpcBookieTransport(resolve, timeout_ms=TIMEOUT_MS, add_window_max=64,
                                             frame_bytes_max=FRAME_BYTES_MAX)
        self.bookie = bookie
        self.missing = f"127.0.0.1:{free_port()}"  # nothing listens there


async def run_check(check, base_dir: str) -> None:
    config = contract_config(dataclasses.replace(BookieConfig(), host="127.0.0.1", port=0))
    journal_dir, ledger_dir = os.path.join(base_dir, "journal"), os.path.join(base_dir, "ledgers")
    logs: list[str] = []
    disk, clock = LocalDisk(), SystemClock()
    engine = BookieEngine(config, disk=disk, clock=clock, open_kv=open_rocks, instance_id=str(uuid.uuid4()),
                          journal_dir=journal_dir, ledger_dir=ledger_dir, log=logs.append)
    await engine.start()
    server = BookieServer(engine, config, "contract-bookie", disk=RoomyDisk(), clock=clock,
                          journal_dir=journal_dir, ledger_dir=ledger_dir, log=logs.append)
    try:
        port = await server.start()
        h = GrpcHarness(f"127.0.0.1:{port}")
        try:
            await check(h)
        finally:
            await h.transport.close()
    finally:
        await server.stop(1_000)
        await engine.close()
    assert not [line for line in logs if "internal error" in line or "failed" in line], logs


@pytest.mark.parametrize("check", CONTRACT, ids=check_id)
def test_contract(check, tmp_path):
    asyncio.run(run_check(check, str(tmp_path)))
