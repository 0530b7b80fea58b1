"""broker.bookie_address_overrides: parsing (bad pairs are named) and the resolver dialling an override
without reading the bookie's registration, while other bookies still resolve through it."""
from __future__ import annotations

import asyncio
import json

import pytest

from bksim.adapters.bookie_transport import registration_resolver
from bksim.model.config import parse_address_overrides
from bksim.model.errors import ConfigError, NoNodeError


class RegistrationsFake:
    """A read-only stand-in for the MetadataStore port: registration nodes by path; counts reads."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = nodes
        self.reads = 0

    async def get(self, path: str):
        self.reads += 1
        if path not in self.nodes:
            raise NoNodeError(path)
        return self.nodes[path], 0


def test_parse_pairs_and_name_a_bad_one():
    assert parse_address_overrides("") == {}
    assert parse_address_overrides(" 127.0.0.1:3181=127.0.0.1:9001 , b2=[::1]:9002") == {
        "127.0.0.1:3181": "127.0.0.1:9001", "b2": "[::1]:9002"}
    for bad in ("b1", "b1=host", "=h:1", "b1=h:0", "b1=h:x", "b1=h:70000"):
        with pytest.raises(ConfigError, match="bookie_address_overrides"):
            parse_address_overrides(bad)


def test_an_overridden_bookie_is_dialled_where_the_override_says():
    registered = {"/ledgers/available/b2": json.dumps({"host": "127.0.0.1", "port": 4002}).encode()}
    store = RegistrationsFake(registered)
    resolver = registration_resolver(store, overrides={"b1": "127.0.0.1:9001"})

    async def scenario():
        return await resolver("b1"), store.reads, await resolver("b2")
    b1, reads_for_b1, b2 = asyncio.run(scenario())
    assert (b1, reads_for_b1) == ("127.0.0.1:9001", 0)  # no registration read, even though b1 has none
    assert b2 == "127.0.0.1:4002"
