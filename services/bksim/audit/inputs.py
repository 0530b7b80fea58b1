"""The audit's inputs: which files exist, which bookie each belongs to, and what order and evidence they give.

Arguments are directories (local paths, or any Hadoop URI in Spark mode), searched recursively:
`--journals DIR...` for journal files (`<16 hex>.txn`: live journal directories, `journal_archive_dir`s, or a
whole run directory) and `--entrylogs DIR...` for entry logs (`entrylogs/<hex>.log` under ledger
directories; also a finished compaction's new log not yet renamed, `N-from-O.compacted`, read as log N: its old
log may already be deleted, bookie/compaction.py; never an unfinished `.compacting` one, which nothing
references). `BOOKIE=DIR` names the bookie of every file under DIR.

Which bookie a directory belongs to: `BOOKIE=DIR` if given; else the bookie's cookie (`COOKIE`, which the
bookie writes into its journal and ledger directories) in the same directory (journals), or in the ledger
directory above `entrylogs/` (entry logs); else, for a directory without a cookie (an archive), the one
bookie whose cookie lies in a sibling directory (`bookie-1/journal` next to `bookie-1/journal-archive`).
Otherwise the input is unusable (AuditInputError naming the directory). A `lastmark` file found in a
listed directory gives that bookie's checkpoint mark.

Re-initialised bookies. A cookie carries the bookie's incarnation (bookie/cookie.py: 1, then one more per
`bksim bookie format`). A bookie whose cookie says incarnation > 1 was emptied and started again as a new
bookie with the same id: its journal ids restart at 1, and its evidence is judged on them like any other's
("complete" from 1), which is right: it does not hold what its earlier incarnations held, so entries whose
write sets name it and that it lacks are its missing copies (under_replicated, below_ack_quorum), not
unverifiable. Its inputs carry `incarnation` and a note saying so. Journals of an earlier incarnation must not
be among the inputs (they would count copies the bookie no longer has): `bksim bookie format --force` empties
the journal archive directory too, and journal ids found twice for one bookie are warned about.

Per bookie: journals in journal-id order (live and archived together); the newest is the highest id (its
tail may be torn); a journal entirely below the checkpoint mark has been replayed past. Evidence is
"complete" when the journal ids run 1, 2, ... without a hole, or when entry logs were supplied for the bookie
(the entries a deleted journal held are in them); otherwise "partial" (older journals were deleted: keep
`journal_archive_dir`, or pass `--entrylogs`).

Pure: the listing and the reading of small files (cookies, lastmarks) come in through a FileSource.
"""
from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlparse

from bksim.bookie.cookie import COOKIE_FILE
from bksim.bookie.cookie import decode as decode_cookie
from bksim.bookie.lastmark import LASTMARK_FILE, decode_lastmark
from bksim.formats.entry_log import COMPACTED, parse_compaction_file_name, parse_entry_log_file_name
from bksim.formats.journal import parse_journal_file_name
from bksim.model.errors import CookieError, FormatError

from bksim.audit.parse import ENTRYLOG, JOURNAL, FileTask
from bksim.audit.rules import COMPLETE, PARTIAL
from bksim.audit.snapshot import AuditInputError

JOURNALS = "journals"
ENTRYLOGS = "entrylogs"
ENTRYLOG_DIR = "entrylogs"


@dataclass(frozen=True, slots=True)
class DirArg:
    path: str
    role: str  # JOURNALS | ENTRYLOGS
    bookie: str | None = None  # from BOOKIE=DIR


def parse_dir_arg(text: str, role: str) -> DirArg:
    """`DIR` or `BOOKIE=DIR` (a bookie id has no '/', so `/a=b/c` is a path)."""
    head, sep, tail = text.partition("=")
    if sep and head and "/" not in head and tail:
        return DirArg(tail, role, head)
    return DirArg(text, role)


def normalize(uri: str) -> str:
    """The path a report shows: a local file URI becomes its absolute path; other URIs stay as they are."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path or "/"
    return uri


class FileSource(Protocol):
    def list(self, root: str) -> list[tuple[str, int]]:
        """(uri, size) of every file under `root`, recursively; AuditInputError if `root` is not a directory."""

    def read(self, uris: list[str]) -> dict[str, bytes]:
        """The bytes of small files."""


@dataclass(slots=True)
class BookieInputs:
    bookie: str
    instance_id: str | None = None
    incarnation: int | None = None  # from its cookies (the highest, when they disagree)
    journal_dirs: list[str] = field(default_factory=list)
    journal_ids: list[int] = field(default_factory=list)
    journal_bytes: int = 0
    entry_logs: int = 0
    entry_log_bytes: int = 0
    lastmark: tuple[int, int] | None = None
    evidence: str = PARTIAL
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        ids = self.journal_ids
        return {"bookie": self.bookie, "instance_id": self.instance_id, "incarnation": self.incarnation,
                "journal_dirs": sorted(self.journal_dirs),
                "journals": len(ids), "journal_ids": [ids[0], ids[-1]] if ids else None,
                "journal_bytes": self.journal_bytes, "entry_logs": self.entry_logs,
                "entry_log_bytes": self.entry_log_bytes,
                "lastmark": {"journal_id": self.lastmark[0], "offset": self.lastmark[1]} if self.lastmark else None,
                "evidence": self.evidence, "notes": self.notes}


@dataclass(slots=True)
class Plan:
    tasks: list[FileTask]
    bookies: dict[str, BookieInputs]
    warnings: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.tasks)

    def evidence(self) -> dict[str, str]:
        return {b: inputs.evidence for b, inputs in self.bookies.items()}


def make_plan(args: list[DirArg], source: FileSource, snapshot_instance: str | None = None) -> Plan:
    listed: dict[str, tuple[str, int, dict[str, DirArg]]] = {}  # path -> (uri, size, {role: the argument})
    for arg in args:
        for uri, size in source.list(arg.path):
            path = normalize(uri)
            uri, size, found = listed.setdefault(path, (uri, size, {}))
            if arg.role not in found or (found[arg.role].bookie is None and arg.bookie is not None):
                found[arg.role] = arg
    by_dir: dict[str, dict[str, str]] = {}  # directory -> {file name: path}
    for path in listed:
        by_dir.setdefault(posixpath.dirname(path), {})[posixpath.basename(path)] = path

    warnings: list[str] = []
    small = [listed[p][0] for names in by_dir.values() for n, p in names.items() if n in (COOKIE_FILE, LASTMARK_FILE)]
    contents = {normalize(uri): data for uri, data in source.read(small).items()} if small else {}
    cookies = {}
    for directory, names in by_dir.items():
        if COOKIE_FILE in names:
            try:
                cookies[directory] = decode_cookie(contents[names[COOKIE_FILE]], source=names[COOKIE_FILE])
            except CookieError as e:
                warnings.append(f"ignored an unreadable cookie: {e}")

    def bookie_of(directory: str, arg: DirArg, cookie_dirs: tuple[str, ...]) -> str | None:
        cookie = next((cookies[d] for d in cookie_dirs if d in cookies), None)
        if arg.bookie is not None:
            if cookie is not None and cookie.bookie_id != arg.bookie:
                raise AuditInputError(f"{directory} was given as bookie {arg.bookie}, but its cookie names bookie "
                                      f"{cookie.bookie_id}")
            return arg.bookie
        if cookie is not None:
            return cookie.bookie_id
        parent = posixpath.dirname(directory)
        siblings = {c.bookie_id for d, c in cookies.items() if posixpath.dirname(d) == parent and d != directory}
        return siblings.pop() if len(siblings) == 1 else None

    bookies: dict[str, BookieInputs] = {}
    journals: list[tuple[str, str, int, int]] = []  # (bookie, path, id, size)
    logs: list[tuple[str, str, int, int]] = []
    unknown: list[str] = []
    for directory, names in sorted(by_dir.items()):
        journal_names = {n: p for n, p in names.items() if parse_journal_file_name(n) is not None
                         and JOURNALS in listed[p][2]}
        log_names = {n: p for n, p in names.items() if _entry_log_id(n) is not None
                     and posixpath.basename(directory) == ENTRYLOG_DIR and ENTRYLOGS in listed[p][2]}
        if journal_names:
            arg = listed[next(iter(journal_names.values()))][2][JOURNALS]
            bookie = bookie_of(directory, arg, (directory,))
            if bookie is None:
                unknown.append(directory)
                continue
            inputs = bookies.setdefault(bookie, BookieInputs(bookie))
            inputs.journal_dirs.append(directory)
            for name, path in journal_names.items():
                journals.append((bookie, path, parse_journal_file_name(name), listed[path][1]))
        if log_names:
            arg = listed[next(iter(log_names.values()))][2][ENTRYLOGS]
            ledger_dir = posixpath.dirname(directory)
            if ledger_dir not in cookies and ledger_dir not in by_dir:  # an entrylogs/ directory given on its own
                cookie = _read_cookie(source, posixpath.dirname(listed[next(iter(log_names.values()))][0]))
                if cookie is not None:
                    cookies[ledger_dir] = cookie
            bookie = bookie_of(directory, arg, (ledger_dir, directory))
            if bookie is None:
                unknown.append(directory)
                continue
            for name, path in log_names.items():
                logs.append((bookie, path, _entry_log_id(name), listed[path][1]))
        if LASTMARK_FILE in names:
            arg = next(iter(listed[names[LASTMARK_FILE]][2].values()))
            bookie = bookie_of(directory, arg, (directory,))
            if bookie is None:
                warnings.append(f"ignored {names[LASTMARK_FILE]}: no cookie tells whose checkpoint mark it is")
                continue
            try:
                mark = decode_lastmark(contents[names[LASTMARK_FILE]])
            except FormatError as e:
                warnings.append(f"ignored {names[LASTMARK_FILE]}: {e}")
                continue
            inputs = bookies.setdefault(bookie, BookieInputs(bookie))
            value = (mark.journal_id, mark.offset)
            if inputs.lastmark is not None and inputs.lastmark != value:
                warnings.append(f"bookie {bookie} has two checkpoint marks ({inputs.lastmark} and {value}); using "
                                f"the higher")
            inputs.lastmark = max(inputs.lastmark or value, value)
    if unknown:
        raise AuditInputError(f"cannot tell which bookie these directories belong to (no COOKIE in them or a "
                              f"sibling directory): {', '.join(unknown)}; pass them as BOOKIE=DIR")
    if not journals:
        raise AuditInputError(f"no journal files (<16 hex digits>.txn) under {', '.join(a.path for a in args if a.role == JOURNALS)}")

    incarnations: dict[str, set[int]] = {}
    for directory, cookie in cookies.items():
        if cookie.bookie_id in bookies:
            bookies[cookie.bookie_id].instance_id = cookie.instance_id
            incarnations.setdefault(cookie.bookie_id, set()).add(cookie.incarnation)
    for bookie, seen in sorted(incarnations.items()):
        inputs = bookies[bookie]
        inputs.incarnation = max(seen)
        if len(seen) > 1:
            warnings.append(f"bookie {bookie}: its cookies name incarnations {sorted(seen)}: directories of an earlier "
                            f"incarnation are among the inputs; using {inputs.incarnation}")
        if inputs.incarnation > 1:
            inputs.notes.append(f"re-initialised (cookie incarnation {inputs.incarnation}, bksim bookie format): it "
                                f"holds nothing its earlier incarnation held; entries that lack that copy are "
                                f"reported as missing copies of this bookie")
    tasks: list[FileTask] = []
    for bookie, inputs in bookies.items():
        ids = sorted(i for b, _, i, _ in journals if b == bookie)
        inputs.journal_ids = sorted(set(ids))
        if len(ids) != len(inputs.journal_ids):
            warnings.append(f"bookie {bookie}: some journal ids appear in more than one directory")
        instance = inputs.instance_id or snapshot_instance
        if snapshot_instance and inputs.instance_id and inputs.instance_id != snapshot_instance:
            warnings.append(f"bookie {bookie}: its cookie names cluster instance {inputs.instance_id}, the snapshot "
                            f"{snapshot_instance}")
        newest = max(ids) if ids else None
        mark = inputs.lastmark
        for b, path, journal_id, size in journals:
            if b != bookie:
                continue
            inputs.journal_bytes += size
            tasks.append(FileTask(path, listed[path][0], bookie, JOURNAL, journal_id, size, newest=journal_id == newest,
                                  below_mark=mark is not None and journal_id < mark[0],
                                  mark_offset=mark[1] if mark is not None and journal_id == mark[0] else -1,
                                  instance_id=instance))
        for b, path, log_id, size in logs:
            if b == bookie:
                inputs.entry_logs += 1
                inputs.entry_log_bytes += size
                tasks.append(FileTask(path, listed[path][0], bookie, ENTRYLOG, log_id, size))
        contiguous = bool(inputs.journal_ids) and inputs.journal_ids == list(range(1, len(inputs.journal_ids) + 1))
        if contiguous:
            inputs.evidence = COMPLETE
        elif inputs.entry_logs:
            inputs.evidence = COMPLETE
            inputs.notes.append("older journals are missing; the entry logs hold what they held")
        else:
            inputs.evidence = PARTIAL
            first = inputs.journal_ids[0] if inputs.journal_ids else None
            inputs.notes.append(f"journal history incomplete (journal ids {_ranges(inputs.journal_ids)}, the first "
                                f"journal is id 1): entries it lacks cannot be judged missing; keep "
                                f"journal_archive_dir, or pass --entrylogs" if first is not None else
                                "no journals in the inputs")
    missing_logs = {b for b, *_ in logs} - set(bookies)
    for bookie in sorted(missing_logs):
        warnings.append(f"entry logs of bookie {bookie} were given but none of its journals")
    for bookie in sorted(set(bookies)):
        if not bookies[bookie].journal_ids:
            del bookies[bookie]
    tasks = [t for t in tasks if t.bookie in bookies]
    tasks.sort(key=lambda t: t.path)
    return Plan(tasks, dict(sorted(bookies.items())), warnings)


def _entry_log_id(name: str) -> int | None:
    """The log id of an entry-log file name (`<hex>.log`, or `N-from-O.compacted` as N), else None."""
    log_id = parse_entry_log_file_name(name)
    if log_id is None and (compaction := parse_compaction_file_name(name)) is not None and compaction[2] == COMPACTED:
        log_id = compaction[0]
    return log_id


def _read_cookie(source: FileSource, directory_uri: str):
    """The cookie in the directory above `directory_uri` (a ledger directory), or None."""
    uri = f"{posixpath.dirname(directory_uri)}/{COOKIE_FILE}"
    try:
        return decode_cookie(source.read([uri])[uri], source=uri)
    except Exception:  # noqa: BLE001 - maybe: no cookie there (or unreadable): the caller says what is missing
        return None


def _ranges(ids: list[int]) -> str:
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(out)
