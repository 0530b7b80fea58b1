"""The dashboard's per-bookie add rate: the LAC advance of each ledger this broker writes between two polls,
spread over the bookies of its last segment by Qw/E; a ledger first seen, or whose LAC did not move, adds nothing."""
from __future__ import annotations

from types import SimpleNamespace

from bksim.adapters.dashboard import DashboardState
from bksim.adapters.http_server import ProcessParts
from bksim.metadata.ledger_metadata import LedgerMetadata, Segment


def handle(ledger_id: int, lac: int, ensemble: tuple[str, ...], qw: int) -> SimpleNamespace:
    metadata = LedgerMetadata(ensemble_size=len(ensemble), write_quorum_size=qw, ack_quorum_size=qw,
                              segments=(Segment(0, ensemble),))
    return SimpleNamespace(ledger_id=ledger_id, last_add_confirmed=lac, metadata=metadata)


def test_add_rate_is_the_lac_advance_striped_over_the_ensemble():
    service = SimpleNamespace(open_handles=[])
    config = SimpleNamespace(broker=SimpleNamespace(broker_id="b1"))
    state = DashboardState(ProcessParts("broker", config, {"service": service}))
    service.open_handles = [handle(1, 99, ("a", "b", "c"), 2), handle(2, 10, ("c", "d"), 2)]
    state._sample_add_rates(100.0)
    assert state._add_rates == {}  # one sample is no rate
    service.open_handles = [handle(1, 399, ("a", "b", "c"), 2), handle(2, 10, ("c", "d"), 2),
                            handle(3, 50, ("a", "d"), 1)]
    state._sample_add_rates(102.0)
    # ledger 1: 300 entries in 2 s, each on 2 of 3 bookies -> 100/s per bookie; ledger 2 idle; ledger 3 new
    assert state._add_rates == {"a": 100.0, "b": 100.0, "c": 100.0}
