"""Synthetic bookie files for the audit's rule tests: journals, entry logs, cookies, lastmarks and a metadata
snapshot written with the project's own format code (formats.journal, formats.entry, formats.entry_log), so the
audit reads exactly what a bookie would have written, without running one.

`Synth` keeps, per bookie and journal id, the list of records in order; `save()` writes the files:

    <root>/<bookie name>/journal/<16 hex>.txn + COOKIE   (and journal-archive/ for ids moved there)
    <root>/<bookie name>/ledgers/entrylogs/<hex>.log + COOKIE (+ lastmark)
    <root>/snapshot.json

and returns the path of each journal file, so a test can damage bytes afterwards.
"""
from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field

from bksim.bookie.cookie import Cookie
from bksim.bookie.cookie import encode as encode_cookie
from bksim.bookie.journal import JournalMark
from bksim.bookie.lastmark import encode_lastmark
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry, master_key
from bksim.metadata.ledger_metadata import LedgerMetadata, encode as encode_metadata
from bksim.model.status import FLAG_RECOVERY_ADD

KEY = master_key(b"synth")


def payload(ledger_id: int, entry_id: int, variant: int = 0) -> bytes:
    return f"ledger {ledger_id} entry {entry_id} v{variant}|".encode() * 3


@dataclass
class Synth:
    root: str
    bookies: tuple[str, ...] = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183", "127.0.0.1:3184")
    instance_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    archived: dict[str, set[int]] = field(default_factory=dict)  # bookie -> journal ids in journal-archive/
    lastmarks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.journals: dict[str, dict[int, list[bytes]]] = {b: {1: []} for b in self.bookies}
        self.entry_logs: dict[str, list[bytes]] = {}
        self.metadata: dict[int, LedgerMetadata] = {}
        self.lengths: dict[int, int] = {}

    def name(self, bookie: str) -> str:
        return "bookie-" + bookie.rsplit(":", 1)[1]

    # -- records --------------------------------------------------------------------------------------------
    def record(self, bookie: str, data: bytes, journal: int | None = None) -> None:
        files = self.journals[bookie]
        files.setdefault(journal if journal is not None else max(files), []).append(data)

    def entry(self, ledger_id: int, entry_id: int, lac: int | None = None, variant: int = 0) -> bytes:
        return encode_entry(ledger_id, entry_id, entry_id - 1 if lac is None else lac, (entry_id + 1) * 100,
                            payload(ledger_id, entry_id, variant))

    def add(self, bookie: str, ledger_id: int, entry_id: int, lac: int | None = None, *, flags: int = 0,
            variant: int = 0, journal: int | None = None) -> None:
        self.record(bookie, jfmt.entry_record(self.entry(ledger_id, entry_id, lac, variant), flags), journal)

    def recovery_add(self, bookie: str, ledger_id: int, entry_id: int, lac: int | None = None, **kw) -> None:
        self.add(bookie, ledger_id, entry_id, lac, flags=FLAG_RECOVERY_ADD, **kw)

    def fence(self, bookie: str, ledger_id: int, journal: int | None = None) -> None:
        self.record(bookie, jfmt.fence_record(ledger_id), journal)

    def explicit_lac(self, bookie: str, ledger_id: int, lac: int) -> None:
        self.record(bookie, jfmt.explicit_lac_record(ledger_id, lac))

    def roll(self, bookie: str) -> int:
        """Start the bookie's next journal file; returns its id."""
        files = self.journals[bookie]
        new = max(files) + 1
        files[new] = []
        return new

    def log_entry(self, bookie: str, ledger_id: int, entry_id: int, **kw) -> None:
        self.entry_logs.setdefault(bookie, []).append(log_fmt.encode_record(self.entry(ledger_id, entry_id, **kw)))

    # -- ledgers --------------------------------------------------------------------------------------------
    def ledger(self, ledger_id: int, e: int, qw: int, qa: int, entries: int, *, segments: list[tuple[int, tuple[str, ...]]]
               | None = None, close: bool = True, skip: dict[int, set[str]] | None = None) -> LedgerMetadata:
        """Create ledger metadata and write entries 0..entries-1 to their write sets (minus `skip[e]` bookies);
        CLOSED at entries-1 when `close`."""
        segments = segments or [(0, self.bookies[:e])]
        md = LedgerMetadata.new(segments[0][1], qw, qa, password=b"synth")
        for first, ensemble in segments[1:]:
            md = md.with_new_segment(first, ensemble)
        skip = skip or {}
        for entry_id in range(entries):
            for bookie in md.write_set(entry_id):
                if bookie not in skip.get(entry_id, set()):
                    self.add(bookie, ledger_id, entry_id)
        if close:
            md = md.closed(entries - 1, entries * 100 if entries else 0)
        self.metadata[ledger_id] = md
        return md

    # -- files ----------------------------------------------------------------------------------------------
    def journal_path(self, bookie: str, journal_id: int) -> str:
        sub = "journal-archive" if journal_id in self.archived.get(bookie, set()) else "journal"
        return os.path.join(self.root, self.name(bookie), sub, jfmt.journal_file_name(journal_id))

    def save(self) -> dict[tuple[str, int], str]:
        paths = {}
        for bookie in self.bookies:
            home = os.path.join(self.root, self.name(bookie))
            journal_dir, ledger_dir = os.path.join(home, "journal"), os.path.join(home, "ledgers")
            cookie = encode_cookie(Cookie(bookie, self.instance_id, journal_dir, ledger_dir))
            for d in (journal_dir, ledger_dir):
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "COOKIE"), "wb") as f:
                    f.write(cookie)
            for journal_id, records in self.journals[bookie].items():
                path = self.journal_path(bookie, journal_id)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(jfmt.encode_file(self.instance_id, [[r] for r in records]))  # a group per record
                paths[(bookie, journal_id)] = path
            if bookie in self.entry_logs:
                log_dir = os.path.join(ledger_dir, "entrylogs")
                os.makedirs(log_dir, exist_ok=True)
                with open(os.path.join(log_dir, log_fmt.entry_log_file_name(1)), "wb") as f:
                    f.write(log_fmt.encode_header() + b"".join(self.entry_logs[bookie]))
            if bookie in self.lastmarks:
                with open(os.path.join(ledger_dir, "lastmark"), "wb") as f:
                    f.write(encode_lastmark(JournalMark(*self.lastmarks[bookie])))
        with open(self.snapshot_path, "w") as f:
            json.dump(self.snapshot(), f)
        return paths

    @property
    def snapshot_path(self) -> str:
        return os.path.join(self.root, "snapshot.json")

    def snapshot(self) -> dict:
        ledgers = []
        for ledger_id, md in sorted(self.metadata.items()):
            doc = json.loads(encode_metadata(md))
            doc.pop("password")
            ledgers.append({"ledger_id": ledger_id, "path": f"/ledgers/L{ledger_id}", "version": 1, "metadata": doc})
        return {"format": "bksim-metadata-snapshot", "version": 1, "source": "synth", "exported_at_ms": 0,
                "instance_id": self.instance_id, "passwords": "omitted", "ledgers": ledgers, "managed_ledgers": [],
                "managed_ledgers_truncated": False}


def record_offsets(path: str) -> list[jfmt.JournalRecord]:
    """The records of a journal file as the bookie's scanner sees them (offsets for damaging them)."""
    with open(path, "rb") as f:
        data = f.read()
    return jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=True).records


def patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def cut(path: str, start: int, end: int) -> None:
    """Remove bytes [start, end) (a whole record: the file stays well framed)."""
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:start] + data[end:])
