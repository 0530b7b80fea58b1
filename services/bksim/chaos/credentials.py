"""What the chaos run's own clients present to a secured cluster (`bksim chaos run --secure`): the cluster's
client certificate and CA (TLS) and the super-user's token. `Credentials()` (PLAIN) is a plain cluster's.

Every BrokerClient, topic Client and bookie client the workload, the checks and the actions make goes through
`broker()`, `topic()`, `bookie()` / `sync_bookie()`, so a secured run exercises the same code paths as a plain
one. Must not: show the token (repr names only whether there is one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bksim.adapters.bookie_client import BookieClient, SyncBookieClient
from bksim.adapters.broker_client import BrokerClient
from bksim.client import Client
from bksim.security.tls import ChannelSecurity


@dataclass(frozen=True)
class Credentials:
    tls: ChannelSecurity | None = None
    token: str | None = field(default=None, repr=False)

    def broker(self, address: str, **kwargs) -> BrokerClient:
        return BrokerClient(address, tls=self.tls, token=self.token, **kwargs)

    def topic(self, addresses, **kwargs) -> Client:
        return Client(addresses, tls=self.tls, token=self.token, **kwargs)

    def bookie(self, address: str, **kwargs) -> BookieClient:
        return BookieClient(address, tls=self.tls, **kwargs)

    def sync_bookie(self, address: str, **kwargs) -> SyncBookieClient:
        return SyncBookieClient(address, tls=self.tls, **kwargs)


PLAIN = Credentials()
