"""The broker's pure core: the ledger client (PROTOCOL.md §4), the shells that run the sans-I/O state machines
of bksim.ledger against bookies and metadata. The topic layer above it is bksim.topics (§5); the gRPC servers
that expose both are in bksim.adapters.

Modules:
- ledgers.py: LedgerService, what the broker's gRPC API calls (create, write, close, recover, read, delete,
  list), with bookie placement, password checks and the bound on open ledgers.
- handle.py: LedgerHandle, a ledger this broker writes (futures per append, in-flight bound).
- driver.py: LedgerDriver, executes a ledger state machine's commands (per-bookie batched adds, metadata CAS).
- recovery.py: RecoveryRun, open-with-recovery around ledger/recovery.py (fencing, read-forward, write-back,
  the closing CAS).
- reader.py: LAC reads and windowed entry reads around ledger/reader.py; ReadOutbox batches the reads of one
  event-loop turn into one read_entries call per bookie.

Everything here talks to the world only through ports (MetadataStore, BookieTransport, Clock), so the same
code runs in the broker process and in the simulator. It never imports bookie/ (the dependency rule).
"""
