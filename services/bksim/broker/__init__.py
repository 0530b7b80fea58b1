"""The broker's pure core: the ledger client (PROTOCOL.md §4); the topic layer above it is bksim.topics (§5).

Modules:
- ledgers.py: LedgerService, what the broker's gRPC API calls (create, write, close, recover, read, delete).
- handle.py: LedgerHandle, a ledger this broker writes (futures per append, in-flight bound).
- driver.py: LedgerDriver, executes a ledger state machine's commands (batched adds, metadata CAS).
- recovery.py: RecoveryRun, open-with-recovery around ledger/recovery.py.
- reader.py: LAC reads and windowed entry reads around ledger/reader.py.

Everything here talks to the world only through ports (MetadataStore, BookieTransport, Clock), so the same
code runs in the broker process and in the simulator.
"""
