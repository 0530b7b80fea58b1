"""The error tree.

    BksimError                      operating errors: expected, handled, reported with a clear message
    ├── ConfigError                 a configuration value is missing, malformed or out of range
    ├── BookieError(status)         an operation answered with a non-OK StatusCode (PROTOCOL.md §2.1)
    ├── FormatError                 bytes that do not parse (bad magic, short record, bad CRC)
    │   └── JournalCorruptError     journal damage that is not a torn tail: the bookie refuses to start
    └── CookieError                 directories and ZooKeeper disagree on the bookie's identity

Bugs (a broken invariant) are not in this tree: they are ``assert`` statements and crash loudly.
"""
from __future__ import annotations

from bksim.model.status import StatusCode


class BksimError(Exception):
    """Base of every operating error."""


class ConfigError(BksimError):
    pass


class BookieError(BksimError):
    def __init__(self, status: StatusCode, message: str = "") -> None:
        self.status = StatusCode(status)
        self.message = message
        super().__init__(f"{self.status.name}: {message}" if message else self.status.name)


class FormatError(BksimError):
    pass


class JournalCorruptError(FormatError):
    pass


class CookieError(BksimError):
    pass
