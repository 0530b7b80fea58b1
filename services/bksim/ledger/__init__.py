"""The replication protocol (PROTOCOL.md §4): pure decisions, no clock, no I/O."""
