"""The BookieTransport contract (tests/bookie_transport_contract.py) on the simulator's SimBookieTransport:
a SimLoop, a clean simulated network and one simulated bookie (the real BookieEngine on a simulated disk)
with the contract's limits. The same checks run on the gRPC transport
(tests/integration/test_grpc_transport_contract.py) and on the broker unit tests' fake
(tests/unit/broker/test_fake_bookies_contract.py)."""
from __future__ import annotations

import pytest

from bookie_transport_contract import CONTRACT, check_id, contract_config
from bksim.sim import loop as sim_loop
from bksim.sim.cluster import BookieSpec, SimCluster
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults
from bksim.sim.network import LinkFaults, SimBookieTransport, SimNetwork
from bksim.sim.plan import rng_for

TIMEOUT_MS = 1_000.0  # virtual


class SimHarness:
    def __init__(self, cluster: SimCluster) -> None:
        self.transport = SimBookieTransport(cluster.network, "broker-1", cluster.bookies, TIMEOUT_MS)
        self.bookie = "bookie-1"
        self.missing = "bookie-9"


def run_check(check, seed: int = 1) -> None:
    async def main() -> None:
        log: list[str] = []
        network = SimNetwork(rng_for(seed, "net"), LinkFaults(delay_ms=0.5), log=log.append)
        specs = [BookieSpec("bookie-1", contract_config(), DiskFaults(latency_ms_max=0.2), KvFaults())]
        cluster = SimCluster(specs, network=network, rng=lambda part: rng_for(seed, part), log=log.append)
        await cluster.start_all()
        try:
            await check(SimHarness(cluster))
            assert not cluster.bookies["bookie-1"].handler_errors
        finally:
            cluster.abandon()
    sim_loop.run(main())


@pytest.mark.parametrize("check", CONTRACT, ids=check_id)
def test_contract(check):
    run_check(check)
