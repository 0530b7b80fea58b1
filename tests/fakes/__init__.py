"""Test doubles, each NAMED as a fake, for unit tests only (integration tests use the real parts).

- clock: ManualClock, the Clock port on virtual time (sleeps either wait for `advance()` or move time on).
- bookies: FakeBookies, in-memory bookies behind the BookieTransport port (passes the transport contract).
- topic_brokers: FakeCluster / FakeBroker, an in-process fake of the Topics gRPC service for the client.
- layout: FakeLayout, the managed ledger as cursors see it (a list of ledgers and entry counts).
- cursor: MemoryCursor, a non-durable cursor for subscription and topic tests.
"""
