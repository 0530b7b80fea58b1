"""A bookie's registration in ZooKeeper (adapters/registration.py) against the real server: every state a reader
can see between the registration's ZooKeeper calls holds the bookie in exactly one list."""
from __future__ import annotations

import uuid

from bksim.adapters.registration import Registration, registration_path


class ObservedClient:
    """The bookie's kazoo client, seen through: after every call that went through `retry` (all of
    Registration's), a second client records which of the bookie's two registration nodes exist."""

    def __init__(self, client, observer, bookie_id: str) -> None:
        self._client, self._observer, self._bookie_id = client, observer, bookie_id
        self.seen: list[tuple[str, bool, bool]] = []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def retry(self, fn, *args, **kwargs):
        result = self._client.retry(fn, *args, **kwargs)
        self.seen.append((getattr(fn, "__name__", repr(fn)),
                          self._observer.exists(registration_path(self._bookie_id, False)) is not None,
                          self._observer.exists(registration_path(self._bookie_id, True)) is not None))
        return result


def test_switching_state_never_shows_the_bookie_in_both_lists_or_in_neither(zk_client, zookeeper):
    from kazoo.client import KazooClient

    bookie_id = f"127.0.0.1:{uuid.uuid4().int % 50_000 + 10_000}"
    own = KazooClient(hosts=zookeeper.connect, timeout=5.0)
    own.start(timeout=10.0)
    try:
        own.ensure_path(registration_path(bookie_id, True).rsplit("/", 1)[0])
        client = ObservedClient(own, zk_client, bookie_id)
        lines: list[str] = []
        reg = Registration(client, bookie_id, "127.0.0.1", 1, registration_wait_ms_max=2000, log=lines.append)
        reg.register(read_only=False)
        for read_only in (True, False, True):
            client.seen.clear()
            reg.switch_state(read_only)
            both_or_neither = [s for s in client.seen if s[1] == s[2]]
            assert not both_or_neither, client.seen
            writable, readonly = client.seen[-1][1:]
            assert (writable, readonly) == (not read_only, read_only), client.seen
            node = zk_client.exists(registration_path(bookie_id, read_only))
            assert node.ephemeralOwner == own.client_id[0]
        assert f"registration moved to {registration_path(bookie_id, True)}" in lines
        reg.deregister()
        assert zk_client.exists(registration_path(bookie_id, False)) is None
        assert zk_client.exists(registration_path(bookie_id, True)) is None
        reg.close()
    finally:
        own.stop()
        own.close()
