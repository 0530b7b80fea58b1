"""Fixtures of the client's unit tests: a fake Topics cluster (tests/fakes/topic_brokers.py) and a Client
on it, both stopped at the end of the test."""
from __future__ import annotations

import pytest

from bksim.client import Client
from fakes.topic_brokers import FakeCluster

TOPIC = "persistent://t/ns/topic"


@pytest.fixture
def fake():
    cluster = FakeCluster().start(2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def client(fake):
    c = Client(fake.addresses, operation_timeout_ms=5_000, backoff_initial_ms=20, backoff_max_ms=100)
    try:
        yield c
    finally:
        c.close()
