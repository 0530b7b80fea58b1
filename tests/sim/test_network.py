"""The simulated network (bksim.sim.network), the BookieTransport over it and the multi-bookie cluster
(bksim.sim.cluster): determinism, loss, duplication, partitions (one-way too), FIFO streams, slow nodes,
transport timeouts, crashes and restarts of a bookie behind the transport, registrations and session expiry.
Everything runs on the virtual-time SimLoop: timeouts cost no real time."""
from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from helpers import wait_until_async

from bksim.formats.entry import encode_entry, master_key
from bksim.metadata import paths
from bksim.model.config import KiB, BookieConfig
from bksim.model.errors import BookieUnreachable
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S
from bksim.sim import loop as sim_loop
from bksim.sim.cluster import START_CRASHES_MAX, BookieSpec, SimCluster
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults
from bksim.sim.network import LinkFaults, SimBookieTransport, SimNetwork
from bksim.sim.plan import rng_for

KEY = master_key(b"pw")
TIMEOUT_MS = 50.0


def _drained(net: SimNetwork) -> bool:
    """Every copy of every message sent has arrived or been dropped."""
    st = net.stats
    return st["delivered"] + st["dropped_cut"] + st["dropped_down"] + st["lost"] == st["sent"] + st["duplicated"]


def _now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


# -- the network alone -------------------------------------------------------------------------------------
def _traffic(seed: int, faults: LinkFaults, messages: int = 200) -> list[str]:
    """Send `messages` between three nodes (some on streams); return the delivery log with virtual times."""
    async def main() -> list[str]:
        log: list[str] = []
        net = SimNetwork(random.Random(seed), faults)
        nodes = ("a", "b", "c")
        for i in range(messages):
            src, dst = nodes[i % 3], nodes[(i + 1 + i // 3) % 3]
            if src == dst:
                dst = nodes[(i + 2) % 3]
            net.send(src, dst, lambda i=i, s=src, d=dst: log.append(f"{_now_ms():.4f} {s}->{d} m{i}"),
                     stream="s" if i % 2 else None)
            await asyncio.sleep(0.0001 * (i % 4))  # virtual: the send times are part of the traced schedule
        await wait_until_async(lambda: _drained(net), 5, interval_s=0.001, message="every message settled")
        return log
    return sim_loop.run(main())


def test_the_same_seed_gives_the_identical_delivery_trace():
    faults = LinkFaults(delay_ms=1.0, jitter_ms=5.0, loss=0.1, duplicate=0.1)
    first = _traffic(7, faults)
    assert first == _traffic(7, faults)
    assert len(first) > 150
    assert first != _traffic(8, faults)


def test_loss_drops_messages_at_the_configured_rate():
    assert _traffic(1, LinkFaults(loss=1.0)) == []
    delivered = len(_traffic(1, LinkFaults(loss=0.3), messages=1000))
    assert 600 < delivered < 800, delivered


def test_duplication_delivers_a_message_twice():
    log = _traffic(1, LinkFaults(jitter_ms=1.0, duplicate=1.0), messages=30)
    names = [line.split()[-1] for line in log]
    assert sorted(names) == sorted([f"m{i}" for i in range(30)] * 2)


def _run_two_nodes(body):
    async def main():
        log: list[str] = []
        net = SimNetwork(random.Random(3), LinkFaults(delay_ms=1.0), log=log.append)
        return await body(net, log)
    return sim_loop.run(main())


def test_a_one_way_partition_cuts_one_direction_only():
    async def body(net: SimNetwork, log: list[str]):
        got: list[str] = []
        net.partition("a", "b", one_way=True)
        assert net.send("a", "b", lambda: got.append("a->b")) == 0
        assert net.send("b", "a", lambda: got.append("b->a")) == 1
        await wait_until_async(lambda: got, 1, interval_s=0.001)
        assert got == ["b->a"]
        net.heal_partition("a", "b")
        net.send("a", "b", lambda: got.append("a->b healed"))
        await wait_until_async(lambda: len(got) == 2, 1, interval_s=0.001)
        assert got == ["b->a", "a->b healed"]
        # a message in flight when the link is cut is lost
        net.send("a", "b", lambda: got.append("in flight"))
        net.partition("a", "b")
        await wait_until_async(lambda: net.stats["dropped_cut"] == 2, 1, interval_s=0.001)
        assert got == ["b->a", "a->b healed"]
        assert any("PARTITION a <-> b" in line for line in log) and any("in flight" in line for line in log)
        net.heal()
        assert net.link("a", "b") == net.clean
    _run_two_nodes(body)


def test_a_stream_is_fifo_unless_its_link_reorders():
    async def body(net: SimNetwork, log: list[str]):
        net.set_default(jitter_ms=20.0)
        order: dict[str, list[int]] = {"stream": [], "unary": [], "reordered": []}
        for i in range(50):
            net.send("c", "b1", lambda i=i: order["stream"].append(i), stream="adds")
            net.send("c", "b1", lambda i=i: order["unary"].append(i))
            net.send("c", "b2", lambda i=i: order["reordered"].append(i), stream="adds")
            if i == 0:
                net.set_link("c", "b2", reorder=True)
        await wait_until_async(lambda: sum(map(len, order.values())) == 150, 1, interval_s=0.001)
        assert order["stream"] == list(range(50))
        assert sorted(order["unary"]) == list(range(50)) and order["unary"] != list(range(50))
        assert sorted(order["reordered"]) == list(range(50)) and order["reordered"] != list(range(50))
    _run_two_nodes(body)


def test_a_slow_node_and_a_down_node():
    async def body(net: SimNetwork, log: list[str]):
        arrived: list[tuple[str, float]] = []
        net.slow("b", 30.0)
        start = _now_ms()
        net.send("a", "b", lambda: arrived.append(("slow", _now_ms() - start)))
        net.send("a", "c", lambda: arrived.append(("normal", _now_ms() - start)))
        await wait_until_async(lambda: len(arrived) == 2, 1, interval_s=0.001)
        assert arrived == [("normal", pytest.approx(1.0)), ("slow", pytest.approx(31.0))]
        net.set_up("c", False)
        assert net.send("a", "c", lambda: arrived.append(("down", 0))) == 0
        net.set_up("c", True)
        net.send("a", "c", lambda: arrived.append(("up again", 0)))
        net.set_up("c", False)  # goes down while the message is in flight
        await wait_until_async(lambda: net.stats["dropped_down"] == 2, 1, interval_s=0.001)
        assert [what for what, _ in arrived] == ["normal", "slow"] and net.stats["dropped_down"] == 2
    _run_two_nodes(body)


# -- the transport and the cluster ---------------------------------------------------------------------------
def _cluster(n: int, log: list[str], net_faults: LinkFaults = LinkFaults(delay_ms=0.5), seed: int = 1,
             session_timeout_ms: float = 200.0, disk: DiskFaults = DiskFaults(latency_ms_max=0.2)) -> SimCluster:
    config = dataclasses.replace(BookieConfig(), write_cache_bytes_max=64 * KiB, journal_file_bytes_max=8 * KiB,
                                 entry_log_bytes_max=16 * KiB, flush_interval_ms=30)
    specs = [BookieSpec(f"bookie-{i}", config, disk, KvFaults())
             for i in range(1, n + 1)]
    network = SimNetwork(rng_for(seed, "net"), net_faults, log=log.append)
    return SimCluster(specs, network=network, rng=lambda part: rng_for(seed, part), log=log.append,
                      session_timeout_ms=session_timeout_ms, reregister_ms=10.0)


def _entry(ledger_id: int, entry_id: int, payload: bytes = b"x") -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1, entry_id + 1, payload)


def _run_cluster(body, n: int = 2, **kw):
    async def main():
        log: list[str] = []
        cluster = _cluster(n, log, **kw)
        await cluster.start_all()
        transport = SimBookieTransport(cluster.network, "broker-1", cluster.bookies, TIMEOUT_MS)
        try:
            return await body(cluster, transport, log)
        finally:
            cluster.abandon()
    return sim_loop.run(main())


def test_adds_and_reads_reach_the_real_engine_through_the_network():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        assert await cluster.registered() == ["bookie-1", "bookie-2"]
        statuses = await t.add("bookie-1", [(_entry(5, 0), KEY, 0), (_entry(5, 1), KEY, 0)])
        assert statuses == [S.OK, S.OK]
        assert await t.read_entry("bookie-1", 5, 1) == (S.OK, _entry(5, 1))
        assert await t.read_entry("bookie-2", 5, 0) == (S.NO_LEDGER, b"")
        assert await t.read_lac("bookie-1", 5) == (S.OK, 0)
        # a fencing read: later normal adds are FENCED, RECOVERY_ADDs still accepted
        assert (await t.read_entry("bookie-1", 5, -1, fence=True, master_key=KEY))[0] is S.OK
        assert await t.add("bookie-1", [(_entry(5, 2), KEY, 0)]) == [S.FENCED]
        assert await t.add("bookie-1", [(_entry(5, 2), KEY, FLAG_RECOVERY_ADD)]) == [S.OK]
        assert await t.add("bookie-1", [(_entry(5, 3), b"k" * 32, 0)]) == [S.UNAUTHORIZED]
        with pytest.raises(BookieUnreachable, match="no such bookie"):
            await t.read_lac("bookie-9", 5)
    _run_cluster(body)


def test_a_partitioned_bookie_times_out_after_timeout_ms_of_virtual_time():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        cluster.network.partition("broker-1", "bookie-2")
        start = _now_ms()
        with pytest.raises(BookieUnreachable) as info:
            await t.add("bookie-2", [(_entry(1, 0), KEY, 0)])
        assert info.value.bookie == "bookie-2" and f"within {TIMEOUT_MS:g} ms" in info.value.why
        assert _now_ms() - start == pytest.approx(TIMEOUT_MS, abs=0.01)
        assert t.stats["timeouts"] == 1
        assert await t.add("bookie-1", [(_entry(1, 0), KEY, 0)]) == [S.OK]  # other bookies unaffected
    _run_cluster(body)


def test_a_lost_answer_means_unknown_outcome_the_entry_may_be_stored():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        cluster.network.partition("bookie-1", "broker-1", one_way=True)  # requests arrive, answers do not
        with pytest.raises(BookieUnreachable):
            await t.add("bookie-1", [(_entry(3, 0), KEY, 0)])
        cluster.network.heal()
        assert await t.read_entry("bookie-1", 3, 0) == (S.OK, _entry(3, 0))
    _run_cluster(body)


def test_a_duplicated_add_reaches_the_engine_twice_and_answers_once():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        engine = cluster.bookies["bookie-1"].engine
        cluster.network.set_link("broker-1", "bookie-1", duplicate=1.0)
        assert await t.add("bookie-1", [(_entry(4, 0), KEY, 0), (_entry(4, 1), KEY, 0)]) == [S.OK, S.OK]
        await wait_until_async(lambda: engine.stats["adds"] == 4, 1, interval_s=0.001, message="the copy")
        assert any("DUPLICATED" in line for line in log)
        assert await t.read_entry("bookie-1", 4, 1) == (S.OK, _entry(4, 1))
    _run_cluster(body)


def test_answers_of_one_add_stream_come_back_in_request_order():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        cluster.network.set_default(jitter_ms=5.0)
        done: list[int] = []

        async def add(i: int) -> None:
            assert await t.add("bookie-1", [(_entry(6, i), KEY, 0)]) == [S.OK]
            done.append(i)
        await asyncio.gather(*(add(i) for i in range(30)))
        assert done == list(range(30))
    _run_cluster(body)


def test_a_crash_and_restart_behind_the_transport():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        bookie = cluster.bookies["bookie-1"]
        assert await t.add("bookie-1", [(_entry(8, i), KEY, 0) for i in range(5)]) == [S.OK] * 5
        crash_rng = random.Random(0)
        bookie.crash(crash_rng)
        with pytest.raises(BookieUnreachable):
            await t.read_entry("bookie-1", 8, 0)
        assert "bookie-1" in await cluster.registered()  # ZooKeeper has not noticed yet
        await bookie.start()  # restarts before the old session expired: registration must wait
        assert bookie.incarnation == 2 and not bookie.registered
        assert bookie.engine.replay_report.records > 0  # the real journal replay
        for i in range(5):  # every acknowledged entry is back
            assert await t.read_entry("bookie-1", 8, i) == (S.OK, _entry(8, i))
        # once the old session expired (its node vanished), the new incarnation registers
        await wait_until_async(lambda: bookie.registered, 1, interval_s=0.001, message="the new registration")
        assert "bookie-1" in await cluster.registered()
        data, _ = await cluster.store.get(paths.bookie_path("bookie-1"))
        assert b'"incarnation": 2' in data
        assert any("registration waits" in line for line in log)
        assert any("expired (process gone)" in line for line in log)
    _run_cluster(body)


def test_a_crashed_bookie_disappears_from_the_registry_after_the_session_timeout():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        cluster.bookies["bookie-2"].crash(random.Random(0))
        await asyncio.sleep(0.19)  # virtual time is what is tested: still registered just before the timeout
        assert await cluster.registered() == ["bookie-1", "bookie-2"]
        await asyncio.sleep(0.02)  # and gone just after it
        assert await cluster.registered() == ["bookie-1"]
    _run_cluster(body)


def test_an_answer_not_yet_sent_at_a_crash_never_comes_one_in_flight_does():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        # every disk call takes 5 ms: the request arrives at 0.5 ms, its journal sync returns ~5 ms later
        call = asyncio.ensure_future(t.add("bookie-1", [(_entry(9, 0), KEY, 0)]))
        await asyncio.sleep(0.002)  # virtual: crash at 2 ms, while the journal sync is in flight
        cluster.bookies["bookie-1"].crash(random.Random(0))
        with pytest.raises(BookieUnreachable):
            await call
        # an answer already on the wire when its bookie crashes still arrives
        cluster.network.set_link("bookie-2", "broker-1", delay_ms=20.0)
        call = asyncio.ensure_future(t.add("bookie-2", [(_entry(9, 0), KEY, 0)]))
        await asyncio.sleep(0.015)  # virtual: crash after the answer left, before it arrives (20 ms link)
        cluster.bookies["bookie-2"].crash(random.Random(0))
        assert await call == [S.OK]
    _run_cluster(body, disk=DiskFaults(latency_ms_min=5.0, latency_ms_max=5.0))


def test_a_live_bookie_whose_session_expires_registers_again():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        bookie = cluster.bookies["bookie-2"]
        bookie.expire_session()
        assert await cluster.registered() == ["bookie-1"]
        assert await t.read_lac("bookie-2", 1) == (S.NO_LEDGER, -1)  # still serving
        await wait_until_async(lambda: bookie.registered, 1, interval_s=0.001, message="registered again")
        assert await cluster.registered() == ["bookie-1", "bookie-2"] and bookie.stats["session_expiries"] == 1
    _run_cluster(body)


def test_a_closed_transport_refuses_calls_and_fails_waiting_ones():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        cluster.network.partition("broker-1", "bookie-1")
        waiting = asyncio.ensure_future(t.read_lac("bookie-1", 1))
        await asyncio.sleep(0.001)  # virtual: close while the call is out, unanswered (partitioned)
        await t.close()
        with pytest.raises(BookieUnreachable, match="closed"):
            await waiting
        with pytest.raises(BookieUnreachable, match="closed"):
            await t.read_lac("bookie-2", 1)
    _run_cluster(body)


def test_a_clean_stop_and_restart_replays_nothing():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        bookie = cluster.bookies["bookie-1"]
        assert await t.add("bookie-1", [(_entry(2, 0), KEY, 0)]) == [S.OK]
        await bookie.stop()
        assert await cluster.registered() == ["bookie-2"]
        with pytest.raises(BookieUnreachable):
            await t.read_lac("bookie-1", 2)
        await bookie.start()
        await wait_until_async(lambda: bookie.registered, 1, interval_s=0.001, message="registered")
        assert bookie.engine.replay_report.records == 0 and await cluster.registered() == ["bookie-1", "bookie-2"]
        assert await t.read_entry("bookie-1", 2, 0) == (S.OK, _entry(2, 0))
    _run_cluster(body)


def test_crashes_during_start_up_then_a_full_replay():
    async def body(cluster: SimCluster, t: SimBookieTransport, log: list[str]):
        bookie = cluster.bookies["bookie-2"]
        assert await t.add("bookie-2", [(_entry(7, i), KEY, 0) for i in range(20)]) == [S.OK] * 20
        rng = random.Random(5)
        bookie.crash(rng)
        await bookie.start(rng, start_crash_probability=1.0)
        assert bookie.stats["start_crashes"] == START_CRASHES_MAX and bookie.alive
        assert bookie.incarnation == 2 + START_CRASHES_MAX
        for i in range(20):
            assert await t.read_entry("bookie-2", 7, i) == (S.OK, _entry(7, i))
    _run_cluster(body, disk=DiskFaults(latency_ms_min=2.0, latency_ms_max=3.0))  # a start-up takes > 5 ms
