"""The BookieTransport contract (tests/bookie_transport_contract.py) on FakeBookies, the broker unit tests'
double: the broker's shells are tested against answers a real bookie would give. The same checks run on the
gRPC transport (tests/integration/test_grpc_transport_contract.py) and the simulator's
(tests/sim/test_sim_transport_contract.py)."""
from __future__ import annotations

import asyncio

import pytest

from bookie_transport_contract import CONTRACT, check_id, contract_config
from fakes.bookies import FakeBookies


class FakeHarness:
    def __init__(self) -> None:
        self.transport = FakeBookies(["bookie-1", "bookie-2"], contract_config())
        self.bookie = "bookie-1"
        self.missing = "bookie-9"


@pytest.mark.parametrize("check", CONTRACT, ids=check_id)
def test_contract(check):
    asyncio.run(check(FakeHarness()))
