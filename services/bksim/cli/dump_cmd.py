"""`bksim journal dump`, `bksim entrylog dump`, `bksim lastmark`: read-only views of a bookie's files.

Owns nothing on disk and changes nothing: it reads files through the same format functions the bookie uses
(formats.journal.scan_journal, formats.entry_log.scan, bookie.lastmark.read_lastmark), so what it prints is
what replay would see. It never prints a master key, only its length.

Damage is reported, never a traceback. Exit codes:
  journal dump   0 = clean, or only a torn tail in the newest journal (replay truncates it: normal after a
                 crash); 1 = corruption replay would refuse (or no journal file found); 2 = PATH missing.
  entrylog dump  0 = readable (a scan that stops early in a log without a ledger map is only a warning:
                 that log was open when the bookie stopped); 1 = damage or no entry log found; 2 = PATH missing.
  lastmark       0 = printed; 1 = absent or unreadable; 2 = DIR missing.
With --json every output line is one JSON object with a "kind" (header, record, ledger_map, torn,
corruption, problem, summary, live); text mode prints one line per record.

Live ratio (`entrylog dump`, one "live" line per log, after its summary): the bytes of the log's ledgers that are
still in the bookie's ledger index over all its entry-record bytes, as garbage collection counts them
(bookie/engine.py entry_log_stats). Where each number comes from is printed with it: the ledgers present are the
bookie's ledger index (<ledger dir>/index/ledgers, as of its last checkpoint: a ledger deleted from the metadata
store counts as live until the bookie's garbage collection removes it); the bytes per ledger are the bookie's
entry-log metadata (<ledger dir>/index/entrylogs) when it has a record of the log, else the log's own ledger map,
else its records as scanned. Both stores are RocksDB, opened read-only (no lock: the bookie may be running). A log
with no index beside it (a copied file) gets "live: unknown" and why; the live ratio never changes the exit code.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable

from bksim.formats import entry as entry_fmt
from bksim.formats import entry_log as log_fmt
from bksim.formats import journal as jfmt
from bksim.model.errors import FormatError
from bksim.model.status import FLAG_RECOVERY_ADD

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE = 0, 1, 2


def register(subparsers) -> None:
    journal = subparsers.add_parser("journal", help="inspect journal (write-ahead log) files")
    journal_sub = journal.add_subparsers(dest="journal_command", required=True)
    p = journal_sub.add_parser("dump", help="print every record of a journal file or directory",
                               description="Print the header (instance id) and one line per record. A torn "
                               "tail of the newest journal is reported (exit 0); corruption replay would "
                               "refuse is reported and exits 1. Master keys are never printed.")
    p.add_argument("path", metavar="PATH", help="a <16 hex id>.txn file or a journal directory")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=journal_dump)

    entrylog = subparsers.add_parser("entrylog", help="inspect entry log files")
    entrylog_sub = entrylog.add_subparsers(dest="entrylog_command", required=True)
    p = entrylog_sub.add_parser("dump", help="print the header, records, ledger map and live ratio of entry logs",
                                description="PATH is a <hex id>.log file, an entrylogs directory, or a ledger "
                                "directory (its entrylogs/ is used). After each log a 'live' line gives its live "
                                "ratio from the bookie's index beside it (read-only: the bookie may be running), "
                                "and where the numbers come from.")
    p.add_argument("path", metavar="PATH", help="a .log file, an entrylogs directory or a ledger directory")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=entrylog_dump)

    p = subparsers.add_parser("lastmark", help="print a ledger directory's checkpoint mark",
                              description="Print the journal id and offset up to which everything is "
                              "checkpointed (replay starts there).")
    p.add_argument("dir", metavar="DIR", help="a bookie ledger directory (holds the lastmark file)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=lastmark)


# -- output ---------------------------------------------------------------------------------------------------
class _Out:
    """Text or JSON-lines output; `damaged` is set by whatever makes the exit code 1."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.damaged = False

    def emit(self, kind: str, text: str, **fields) -> None:
        if self.as_json:
            print(json.dumps({"kind": kind, **fields}))
        else:
            print(text)


def _guard(command: Callable) -> Callable:
    """Turn a closed pipe (`bksim journal dump ... | head`) into a quiet exit instead of a traceback."""

    def run(args) -> int:
        try:
            code = command(args)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_DAMAGED
    run.__name__ = command.__name__
    run.__doc__ = command.__doc__
    return run


def _missing(path: str) -> int:
    print(f"bksim: error: {path}: no such file or directory", file=sys.stderr)
    return EXIT_USAGE


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- journal dump ---------------------------------------------------------------------------------------------
def _flags_text(flags: int) -> str:
    if flags == 0:
        return "0"
    names = ["RECOVERY_ADD"] if flags & FLAG_RECOVERY_ADD else []
    rest = flags & ~FLAG_RECOVERY_ADD
    return "|".join(names + ([f"{rest:#x}"] if rest else []))


def describe_journal_record(record: jfmt.JournalRecord) -> tuple[str, dict]:
    """(text, fields) for one record. MASTER_KEY shows the key's length only."""
    body = record.body
    fields: dict = {"offset": record.offset, "end": record.end, "type": record.type.name, "flags": record.flags,
                    "recovery_add": bool(record.flags & FLAG_RECOVERY_ADD)}
    try:
        if record.type == jfmt.RecordType.ENTRY:
            if len(body) < entry_fmt.HEADER_BYTES:
                raise FormatError(f"entry body of {len(body)} bytes is shorter than the entry header")
            lid, eid, lac, length, _digest = entry_fmt.HEADER.unpack_from(body)
            fields.update(ledger_id=lid, entry_id=eid, last_add_confirmed=lac, ledger_length=length,
                          payload_bytes=len(body) - entry_fmt.HEADER_BYTES)
            detail = f"ledger={lid} entry={eid} lac={lac} payload_bytes={fields['payload_bytes']}"
        elif record.type == jfmt.RecordType.MASTER_KEY:
            if len(body) < jfmt.LEDGER_ID.size:
                raise FormatError(f"MASTER_KEY body of {len(body)} bytes")
            (lid,) = jfmt.LEDGER_ID.unpack_from(body)
            fields.update(ledger_id=lid, master_key_bytes=len(body) - jfmt.LEDGER_ID.size)
            detail = f"ledger={lid} key_bytes={fields['master_key_bytes']}"
        elif record.type == jfmt.RecordType.FENCE:
            if len(body) != jfmt.LEDGER_ID.size:
                raise FormatError(f"FENCE body of {len(body)} bytes")
            (lid,) = jfmt.LEDGER_ID.unpack(body)
            fields.update(ledger_id=lid)
            detail = f"ledger={lid}"
        elif record.type == jfmt.RecordType.EXPLICIT_LAC:
            if len(body) != jfmt.LEDGER_LAC.size:
                raise FormatError(f"EXPLICIT_LAC body of {len(body)} bytes")
            lid, lac = jfmt.LEDGER_LAC.unpack(body)
            fields.update(ledger_id=lid, lac=lac)
            detail = f"ledger={lid} lac={lac}"
        else:
            fields.update(body_bytes=len(body))
            detail = f"body_bytes={len(body)}"
    except FormatError as e:
        fields.update(malformed=str(e))
        detail = f"MALFORMED: {e}"
    return f"offset={record.offset} type={record.type.name} flags={_flags_text(record.flags)} {detail}", fields


def _journal_files(path: str) -> list[tuple[str, int | None, bool]]:
    """[(file path, journal id or None, newest)] in replay order."""
    if os.path.isdir(path):
        named = sorted((i, n) for n in os.listdir(path) if (i := jfmt.parse_journal_file_name(n)) is not None)
        return [(os.path.join(path, n), i, i == named[-1][0]) for i, n in named]
    journal_id = jfmt.parse_journal_file_name(os.path.basename(path))
    if journal_id is None:
        return [(path, None, True)]  # maybe: a copied file; treat its tail as the newest journal's
    siblings = (jfmt.parse_journal_file_name(n) for n in os.listdir(os.path.dirname(path) or "."))
    return [(path, journal_id, journal_id >= max(i for i in siblings if i is not None))]


def _dump_journal_file(out: _Out, path: str, journal_id: int | None, newest: bool) -> None:
    data = _read(path)
    try:
        instance_id = jfmt.decode_file_header(data)
    except FormatError as e:
        if newest and len(data) < jfmt.FILE_HEADER_BYTES:  # replay removes such a file: nothing was acked
            out.emit("torn", f"journal {path}: torn header ({len(data)} bytes): {e}", file=path, offset=0,
                     message=f"torn header ({len(data)} bytes): {e}")
        else:
            out.damaged = True
            out.emit("corruption", f"journal {path}: CORRUPTION: {e}", file=path, offset=0, message=str(e))
        return
    out.emit("header", f"journal {path}: instance {instance_id}, {len(data)} bytes"
             + ("" if newest else " (older journal)"),
             file=path, journal_id=journal_id, instance_id=instance_id, bytes=len(data), newest=newest)
    result = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest, skip_corruption=True, name=path)
    counts: dict[str, int] = {}
    for record in result.records:
        text, fields = describe_journal_record(record)
        out.emit("record", "  " + text, file=path, **fields)
        counts[record.type.name] = counts.get(record.type.name, 0) + 1
    for problem in result.skipped:
        out.damaged = True
        out.emit("corruption", f"  CORRUPTION (replay refuses to start): {problem}", file=path, message=problem)
    if result.torn is not None:
        out.emit("torn", f"  {result.torn}; replay truncates the file to {result.end} bytes "
                 f"({len(data) - result.end} bytes dropped)", file=path, offset=result.end, message=result.torn)
    by_type = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    out.emit("summary", f"  {len(result.records)} records" + (f" ({by_type})" if by_type else "")
             + f", good up to offset {result.end}", file=path, records=len(result.records), counts=counts,
             end=result.end, torn=result.torn is not None, corruptions=len(result.skipped))


@_guard
def journal_dump(args) -> int:
    """bksim journal dump PATH [--json]"""
    if not os.path.exists(args.path):
        return _missing(args.path)
    out = _Out(args.json)
    files = _journal_files(args.path)
    if not files:
        out.emit("problem", f"no journal files (<16 hex id>.txn) in {args.path}", message="no journal files",
                 path=args.path)
        return EXIT_DAMAGED
    for path, journal_id, newest in files:
        _dump_journal_file(out, path, journal_id, newest)
    return EXIT_DAMAGED if out.damaged else EXIT_OK


# -- entrylog dump --------------------------------------------------------------------------------------------
def _entry_log_files(path: str) -> list[tuple[str, int | None]]:
    if not os.path.isdir(path):
        return [(path, log_fmt.parse_entry_log_file_name(os.path.basename(path)))]
    if os.path.isdir(os.path.join(path, "entrylogs")):
        path = os.path.join(path, "entrylogs")
    named = sorted((i, n) for n in os.listdir(path) if (i := log_fmt.parse_entry_log_file_name(n)) is not None)
    return [(os.path.join(path, n), i) for i, n in named]


def _dump_entry_log_file(out: _Out, path: str, log_id: int | None, index: "_BookieIndex | str") -> None:
    data = _read(path)
    try:
        header, records, stopped = log_fmt.scan(data)
    except FormatError as e:
        out.damaged = True
        out.emit("problem", f"entry log {path}: UNREADABLE: {e}", file=path, message=str(e))
        return
    has_map = header.ledger_map_offset != 0
    where = (f"ledger map at offset {header.ledger_map_offset} ({header.ledger_count} ledgers)" if has_map
             else "no ledger map (the log was open, or not rolled cleanly)")
    out.emit("header", f"entry log {path}: version {header.version}, {len(data)} bytes, {where}", file=path,
             log_id=log_id, version=header.version, bytes=len(data), ledger_map_offset=header.ledger_map_offset,
             ledger_count=header.ledger_count)
    entries = 0
    maps: list[log_fmt.LogRecord] = []
    for r in records:
        if r.ledger_map is None:
            entries += 1
            length = len(r.entry)
            out.emit("record", f"  offset={r.offset} ledger={r.ledger_id} entry={r.entry_id} length={length}",
                     file=path, offset=r.offset, ledger_id=r.ledger_id, entry_id=r.entry_id, length=length)
        else:
            maps.append(r)
            pairs = " ".join(f"{lid}={n}" for lid, n in sorted(r.ledger_map.items()))
            out.emit("ledger_map", f"  offset={r.offset} LEDGER MAP {len(r.ledger_map)} ledgers (ledger=bytes): "
                     f"{pairs}", file=path, offset=r.offset,
                     ledgers=[{"ledger_id": lid, "bytes": n} for lid, n in sorted(r.ledger_map.items())])
    found = [(m.offset, len(m.ledger_map)) for m in maps]
    if has_map and found != [(header.ledger_map_offset, header.ledger_count)]:
        out.damaged = True
        out.emit("problem", f"  PROBLEM: header names a ledger map at offset {header.ledger_map_offset} with "
                 f"{header.ledger_count} ledgers; the log holds {found or 'none'}", file=path,
                 message="header and ledger map disagree")
    elif not has_map and maps:
        out.damaged = True
        out.emit("problem", f"  PROBLEM: a ledger map record at offset {maps[0].offset} but the header names "
                 f"none", file=path, message="ledger map not in header")
    if stopped is not None:
        if has_map:
            out.damaged = True
        note = "DAMAGE" if has_map else "warning (normal for the log that was open when the bookie stopped)"
        out.emit("problem", f"  scan stopped early, {note}: {stopped}", file=path, message=stopped,
                 damage=has_map)
    out.emit("summary", f"  {entries} entries", file=path, entries=entries)
    scanned: dict[int, int] = {}
    for r in records:
        if r.ledger_map is None:
            scanned[r.ledger_id] = scanned.get(r.ledger_id, 0) + log_fmt.LENGTH.size + len(r.entry)
    _emit_live(out, path, log_id, index, maps[0].ledger_map if maps else None, scanned)


# -- live ratio -----------------------------------------------------------------------------------------------
class _BookieIndex:
    """The ledger ids and the entry-log metadata of the bookie whose ledger directory is `ledger_dir`."""

    def __init__(self, ledger_dir: str) -> None:
        from bksim.adapters.rocks import open_rocks_read_only
        from bksim.bookie.index import LedgerIndex, LogMetaIndex

        self.dir = os.path.join(ledger_dir, "index")
        ledgers = LedgerIndex(open_rocks_read_only(os.path.join(self.dir, "ledgers")))
        try:
            self.ledger_ids = set(ledgers.ledger_ids())
        finally:
            ledgers.close()
        self.log_meta: dict[int, dict[int, int]] = {}
        if os.path.isdir(os.path.join(self.dir, "entrylogs")):  # absent: a bookie that predates the store
            log_meta = LogMetaIndex(open_rocks_read_only(os.path.join(self.dir, "entrylogs")))
            try:
                self.log_meta = dict(log_meta.items())
            finally:
                log_meta.close()


def _bookie_index(path: str, cache: dict) -> "_BookieIndex | str":
    """The index of the bookie holding entry log `path` (<ledger dir>/entrylogs/<id>.log), or why there is none."""
    log_dir = os.path.dirname(os.path.abspath(path))
    ledger_dir = os.path.dirname(log_dir)
    if ledger_dir not in cache:
        index_dir = os.path.join(ledger_dir, "index")
        if os.path.basename(log_dir) != "entrylogs" or not os.path.isdir(os.path.join(index_dir, "ledgers")):
            cache[ledger_dir] = f"no bookie ledger index at {index_dir} (a log outside a ledger directory?)"
        else:
            try:
                cache[ledger_dir] = _BookieIndex(ledger_dir)
            except Exception as e:  # noqa: BLE001 - RocksDB says why (damaged, another version): report it
                cache[ledger_dir] = f"the bookie's index at {index_dir} is unreadable: {e}"
    return cache[ledger_dir]


def _emit_live(out: _Out, path: str, log_id: int | None, index, ledger_map: dict[int, int] | None,
               scanned: dict[int, int]) -> None:
    if isinstance(index, str):
        out.emit("live", f"  live: unknown ({index})", file=path, log_id=log_id, live_ratio=None, message=index)
        return
    if log_id is not None and log_id in index.log_meta:
        ledger_bytes, source = index.log_meta[log_id], "entry-log metadata"
    elif ledger_map is not None:
        ledger_bytes, source = ledger_map, "ledger map"
    else:
        ledger_bytes, source = scanned, "records"
    total = sum(ledger_bytes.values())
    live_ids = [lid for lid in ledger_bytes if lid in index.ledger_ids]
    live = sum(ledger_bytes[lid] for lid in live_ids)
    ratio = live / total if total else 0.0
    where = {"entry-log metadata": f"the bookie's entry-log metadata ({index.dir}/entrylogs)",
             "ledger map": "the log's ledger map", "records": "the log's records"}[source]
    out.emit("live", f"  live: {live} of {total} bytes ({100.0 * ratio:.1f}%), {len(live_ids)} of "
             f"{len(ledger_bytes)} ledgers in the bookie's ledger index ({index.dir}/ledgers); bytes per "
             f"ledger from {where}", file=path, log_id=log_id, bytes=total, live_bytes=live, live_ratio=ratio,
             ledgers=len(ledger_bytes), live_ledgers=len(live_ids), source=source, index=index.dir)


@_guard
def entrylog_dump(args) -> int:
    """bksim entrylog dump PATH [--json]"""
    if not os.path.exists(args.path):
        return _missing(args.path)
    out = _Out(args.json)
    files = _entry_log_files(args.path)
    if not files:
        out.emit("problem", f"no entry logs (<hex id>.log) in {args.path}", message="no entry logs", path=args.path)
        return EXIT_DAMAGED
    indexes: dict = {}
    for path, log_id in files:
        _dump_entry_log_file(out, path, log_id, _bookie_index(path, indexes))
    return EXIT_DAMAGED if out.damaged else EXIT_OK


# -- lastmark -------------------------------------------------------------------------------------------------
@_guard
def lastmark(args) -> int:
    """bksim lastmark DIR [--json]"""
    from bksim.adapters.localdisk import LocalDisk
    from bksim.bookie.lastmark import LASTMARK_FILE, read_lastmark

    if not os.path.isdir(args.dir):
        return _missing(args.dir)
    path = os.path.join(args.dir, LASTMARK_FILE)
    out = _Out(args.json)
    if not os.path.exists(path):
        out.emit("problem", f"no lastmark in {args.dir}: this ledger directory was never checkpointed "
                 f"(replay would start at the oldest journal)", path=path, message="absent")
        return EXIT_DAMAGED
    try:
        mark = read_lastmark(LocalDisk(), args.dir)
    except FormatError as e:
        out.emit("problem", f"lastmark {path} is unreadable: {e}", path=path, message=str(e))
        return EXIT_DAMAGED
    name = jfmt.journal_file_name(mark.journal_id)
    out.emit("lastmark", f"lastmark {path}: journal {name} (id {mark.journal_id}) offset {mark.offset}",
             path=path, journal_id=mark.journal_id, journal_file=name, offset=mark.offset)
    return EXIT_OK
