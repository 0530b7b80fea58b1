"""The ZooKeeper layout (PROTOCOL.md §3): every path bksim reads or writes, as pure string functions.

    /ledgers/INSTANCEID                          cluster UUID
    /ledgers/available/<bookie id>               ephemeral: writable bookie
    /ledgers/available/readonly/<bookie id>      ephemeral: read-only bookie ("readonly" is not a bookie)
    /ledgers/cookies/<bookie id>                 a bookie's cookie
    /ledgers/idgen/ID-<10 digits>                ephemeral-sequential nodes that hand out ledger ids
    /ledgers/00/0000/L0016                       metadata of ledger 16 (the short form, ids < 10^10)
    /ledgers/000/0000/0100/0000/L0000            metadata of ledger 10^10 (the long form, ids >= 10^10)
    /ledgers/underreplication/ledgers/0000/0000/0000/0010/urL0000000016
                                                 under-replication mark of ledger 16 (missing bookies)
    /ledgers/underreplication/locks/urL0000000016   ephemeral: the worker copying ledger 16
    /ledgers/underreplication/auditorelection/V_<10 digits>   ephemeral-sequential auditor votes
    /ledgers/underreplication/disable            exists = marking and replication paused
    /ledgers/underreplication/checkallledgersctime   wall ms of the last check of all ledgers (0: asked for)
    /brokers/available/<broker id>               ephemeral broker registration
    /managed-ledgers/<tenant>/<ns>/persistent/<topic>[/<cursor>]   managed ledger and cursor info (§5)
    /ownership/<tenant>/<ns>/<topic>             ephemeral topic owner

Ledger paths. An id below 10^10 is zero-padded to 10 digits and split 2/4/4 with an ``L`` before the last
part (BookKeeper's ``getShortHierarchicalLedgerPath``): 16 -> ``/ledgers/00/0000/L0016``. An id of 10^10
or more is zero-padded to 19 digits (2^63 - 1 has 19) and split 3/4/4/4/4 (BookKeeper's
``getLongHierarchicalLedgerPath``): ``/ledgers/000/0000/0100/0000/L0000``. The two forms never collide:
the first level has 2 digits in one and 3 in the other. **(bksim)** BookKeeper's hybrid manager switches
to the long form at 2^31 - 1, bksim at 10^10, so every id a 10-digit path can spell keeps the short form.
Each id has exactly one path: ``ledger_id_from_path`` rejects a path that does not round-trip (e.g. a
long-form path of a small id), so the walk in ``metadata.ledger_manager.list_ledger_ids`` never counts one ledger
twice.

Under-replication marks (BookKeeper's ZkLedgerUnderreplicationManager): the 64-bit id as four 16-bit hex
chunks, then ``urL`` and the id zero-padded to 10 digits (more digits for larger ids).

Pure: no I/O. ``metadata.ledger_manager`` walks these paths over the MetadataStore port.
"""
from __future__ import annotations

import re

LEDGERS_ROOT = "/ledgers"
INSTANCEID = f"{LEDGERS_ROOT}/INSTANCEID"
AVAILABLE = f"{LEDGERS_ROOT}/available"
READONLY_CHILD = "readonly"  # the child of AVAILABLE that is a directory, not a bookie
READONLY = f"{AVAILABLE}/{READONLY_CHILD}"
COOKIES = f"{LEDGERS_ROOT}/cookies"
IDGEN = f"{LEDGERS_ROOT}/idgen"
IDGEN_PREFIX = f"{IDGEN}/ID-"  # create(..., sequential=True) appends ZooKeeper's 10-digit counter
UNDERREPLICATION = f"{LEDGERS_ROOT}/underreplication"
UNDERREPLICATED_LEDGERS = f"{UNDERREPLICATION}/ledgers"
UNDERREPLICATION_LOCKS = f"{UNDERREPLICATION}/locks"
AUDITOR_ELECTION = f"{UNDERREPLICATION}/auditorelection"
AUDITOR_VOTE_PREFIX = f"{AUDITOR_ELECTION}/V_"  # create(..., ephemeral=True, sequential=True); lowest wins
UNDERREPLICATION_DISABLE = f"{UNDERREPLICATION}/disable"
CHECK_ALL_LEDGERS_CTIME = f"{UNDERREPLICATION}/checkallledgersctime"  # BookKeeper's name
UNDERREPLICATED_LEAF_PREFIX = "urL"

BROKERS_ROOT = "/brokers"
BROKERS_AVAILABLE = f"{BROKERS_ROOT}/available"
MANAGED_LEDGERS_ROOT = "/managed-ledgers"
OWNERSHIP_ROOT = "/ownership"
PERSISTENT = "persistent"  # the topic domain segment of a managed-ledger path

SHORT_LEDGER_ID_LIMIT = 10**10  # ids below use the 2/4/4 form
LEDGER_ID_MAX = 2**63 - 1  # a signed 64-bit id, as in BookKeeper; 19 digits
SHORT_DIGITS = 10
LONG_DIGITS = 19
SHORT_SPLIT = (2, 4, 4)
LONG_SPLIT = (3, 4, 4, 4, 4)
LEDGER_LEAF_PREFIX = "L"
SEQUENCE_DIGITS = 10  # ZooKeeper's sequential suffix: the parent's counter, "%010d"

# the name patterns of each level below /ledgers, for the walk that lists ledgers
SHORT_LEVELS = (re.compile(r"\d{2}"), re.compile(r"\d{4}"), re.compile(r"L\d{4}"))
LONG_LEVELS = (re.compile(r"\d{3}"), re.compile(r"\d{4}"), re.compile(r"\d{4}"), re.compile(r"\d{4}"),
               re.compile(r"L\d{4}"))

_IDGEN_NAME = re.compile(r"ID-(\d{10})")


def _check_ledger_id(ledger_id: int) -> None:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int):
        raise ValueError(f"a ledger id is an int, got {ledger_id!r}")
    if not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise ValueError(f"ledger id {ledger_id} is outside 0..{LEDGER_ID_MAX}")


def _split(digits: str, sizes: tuple[int, ...]) -> list[str]:
    parts, at = [], 0
    for size in sizes:
        parts.append(digits[at:at + size])
        at += size
    return parts


def ledger_path(ledger_id: int) -> str:
    """The metadata znode of a ledger: short form (2/4/4) below 10^10, long form (3/4/4/4/4) above."""
    _check_ledger_id(ledger_id)
    if ledger_id < SHORT_LEDGER_ID_LIMIT:
        parts = _split(f"{ledger_id:0{SHORT_DIGITS}d}", SHORT_SPLIT)
    else:
        parts = _split(f"{ledger_id:0{LONG_DIGITS}d}", LONG_SPLIT)
    parts[-1] = LEDGER_LEAF_PREFIX + parts[-1]
    return "/".join([LEDGERS_ROOT, *parts])


def ledger_id_from_path(path: str) -> int:
    """The ledger id of a ledger metadata path; ValueError if `path` is not exactly `ledger_path(id)`."""
    prefix = LEDGERS_ROOT + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path!r} is not under {LEDGERS_ROOT}")
    parts = path[len(prefix):].split("/")
    levels = SHORT_LEVELS if len(parts) == len(SHORT_LEVELS) else LONG_LEVELS
    if len(parts) != len(levels) or not all(p.fullmatch(part) for p, part in zip(levels, parts)):
        raise ValueError(f"{path!r} is not a ledger path (expected {ledger_path(16)} or "
                         f"{ledger_path(SHORT_LEDGER_ID_LIMIT)} form)")
    ledger_id = int("".join(parts[:-1]) + parts[-1][len(LEDGER_LEAF_PREFIX):])
    if ledger_id > LEDGER_ID_MAX or ledger_path(ledger_id) != path:
        raise ValueError(f"{path!r} is not the canonical path of a ledger id (ledger {ledger_id} lives at "
                         f"{ledger_path(ledger_id) if ledger_id <= LEDGER_ID_MAX else 'no path'})")
    return ledger_id


def sequence_number(created_path: str) -> int:
    """The counter ZooKeeper appended to a sequential node's name (the last 10 characters)."""
    suffix = created_path[-SEQUENCE_DIGITS:]
    if len(suffix) != SEQUENCE_DIGITS or not suffix.isdigit():
        raise ValueError(f"{created_path!r} does not end with a {SEQUENCE_DIGITS}-digit sequence number")
    return int(suffix)


def ledger_id_from_idgen_path(created_path: str) -> int:
    """The ledger id handed out by an /ledgers/idgen/ID-<seq> node: the sequence number itself."""
    if not created_path.startswith(IDGEN + "/") or not _IDGEN_NAME.fullmatch(created_path[len(IDGEN) + 1:]):
        raise ValueError(f"{created_path!r} is not an id node {IDGEN_PREFIX}<10 digits>")
    return sequence_number(created_path)


def bookie_path(bookie_id: str, read_only: bool = False) -> str:
    """The ephemeral registration of a bookie: /ledgers/available[/readonly]/<bookie id>."""
    _check_name(bookie_id, "bookie id")
    if bookie_id == READONLY_CHILD and not read_only:
        raise ValueError(f"{READONLY_CHILD!r} cannot be a bookie id (it is the read-only directory)")
    return f"{READONLY if read_only else AVAILABLE}/{bookie_id}"


def cookie_path(bookie_id: str) -> str:
    _check_name(bookie_id, "bookie id")
    return f"{COOKIES}/{bookie_id}"


def broker_path(broker_id: str) -> str:
    """The ephemeral registration of a broker: /brokers/available/<broker id>."""
    _check_name(broker_id, "broker id")
    return f"{BROKERS_AVAILABLE}/{broker_id}"


def managed_ledger_path(tenant: str, namespace: str, topic: str) -> str:
    """The managed ledger of a persistent topic: /managed-ledgers/<tenant>/<ns>/persistent/<topic>."""
    for value, what in ((tenant, "tenant"), (namespace, "namespace"), (topic, "topic")):
        _check_name(value, what)
    return f"{MANAGED_LEDGERS_ROOT}/{tenant}/{namespace}/{PERSISTENT}/{topic}"


def cursor_path(tenant: str, namespace: str, topic: str, cursor: str) -> str:
    """A subscription's cursor: a child of its topic's managed-ledger node."""
    _check_name(cursor, "cursor")
    return f"{managed_ledger_path(tenant, namespace, topic)}/{cursor}"


def ownership_path(tenant: str, namespace: str, topic: str) -> str:
    """The ephemeral owner (broker id) of a topic: /ownership/<tenant>/<ns>/<topic>."""
    for value, what in ((tenant, "tenant"), (namespace, "namespace"), (topic, "topic")):
        _check_name(value, what)
    return f"{OWNERSHIP_ROOT}/{tenant}/{namespace}/{topic}"


def _check_name(name: str, what: str) -> None:
    """One path component: non-empty, no '/', not '.' or '..', no NUL (ZooKeeper's rules)."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"{what} {name!r} cannot be a ZooKeeper path component")


def underreplicated_name(ledger_id: int) -> str:
    """``urL0000000016`` for ledger 16: the leaf of its mark, and the name of its lock."""
    _check_ledger_id(ledger_id)
    return f"{UNDERREPLICATED_LEAF_PREFIX}{ledger_id:010d}"


def underreplicated_path(ledger_id: int) -> str:
    """The mark of `ledger_id`: /ledgers/underreplication/ledgers/<4 hex>/<4 hex>/<4 hex>/<4 hex>/urL<id>."""
    _check_ledger_id(ledger_id)
    digits = f"{ledger_id:016x}"
    chunks = "/".join(digits[i:i + 4] for i in range(0, 16, 4))
    return f"{UNDERREPLICATED_LEDGERS}/{chunks}/{underreplicated_name(ledger_id)}"


def underreplication_lock_path(ledger_id: int) -> str:
    return f"{UNDERREPLICATION_LOCKS}/{underreplicated_name(ledger_id)}"


def ledger_id_from_underreplicated_name(name: str) -> int | None:
    """16 for ``urL0000000016``; None for a name that is not a mark's or a lock's."""
    if not name.startswith(UNDERREPLICATED_LEAF_PREFIX):
        return None
    digits = name[len(UNDERREPLICATED_LEAF_PREFIX):]
    if not digits.isdigit() or len(digits) < SHORT_DIGITS:
        return None
    ledger_id = int(digits)
    return ledger_id if underreplicated_name(ledger_id) == name else None
