"""Metadata (PROTOCOL.md §3), pure over the MetadataStore port (ports/metadata.py).

- paths: the ZooKeeper layout (ledger znode paths, registrations, id generation).
- ledger_metadata: the LedgerMetadata value, its transitions and its JSON bytes.
- ledger_manager: ledger ids, ledger znodes (create, read, CAS write, read-modify-CAS loop, delete, list).
- memory: InMemoryMetadataStore, ZooKeeper's data model for unit tests and the simulator.
The ZooKeeper implementation of the port is adapters/zk_metadata.py.
"""
