"""Journal replay on start-up (PROTOCOL.md §2.2 "Replay on restart").

Reads journals from the checkpoint mark (a group boundary), in order, and hands the records to the caller: to
`apply_batch(journal_id, records)` a list at a time (whole groups, about BATCH_BYTES of journal: the list is dropped
before the next is parsed, so a journal's records are never all held at once, and a caller that awaits between
lists lets other tasks run, such as the engine's replay checkpoints), or to `apply(record, mark_after)` one at a
time. The torn last group of the newest journal (formats/journal.py says exactly what that is) ends replay and is
truncated away (reported, not fatal: it was never acknowledged). Damage before it, or in an older journal,
refuses start-up (JournalCorruptError) when the scan reaches it (the records before it have been applied by then),
unless `skip_corruption` is set: then the damaged groups are skipped LOUDLY, keeping their records that pass their
own CRC. A record whose CRC holds but whose body does not have the size its type needs
(`formats.journal.check_body`) is corruption too: the caller only ever gets bodies it can unpack.

Marks: a record's group starts at `JournalMark(journal_id, record.group)`, a group boundary (for records salvaged
from damage, where the damaged bytes start), so a checkpoint taken before a record is applied may persist that
mark: replay resumes there and applies the group's earlier records again (applying is idempotent).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from bksim.bookie.journal import JournalMark, list_journal_ids
from bksim.formats import journal as fmt
from bksim.model.errors import FormatError, JournalCorruptError
from bksim.ports.disk import Disk

BATCH_BYTES = 256 << 10  # journal bytes per list of records handed to `apply_batch`
ApplyRecord = Callable[[fmt.JournalRecord, JournalMark], Awaitable[None]]
ApplyBatch = Callable[[int, list[fmt.JournalRecord]], Awaitable[None]]


@dataclass(slots=True)
class ReplayReport:
    journals: list[int] = field(default_factory=list)
    records: int = 0
    end: JournalMark = JournalMark(0, 0)  # position after the last replayed record
    torn: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


async def replay(disk: Disk, journal_dir: str, mark: JournalMark, instance_id: str, apply: ApplyRecord | None,
                 skip_corruption: bool = False, log: Callable[[str], None] = print, *,
                 apply_batch: ApplyBatch | None = None) -> ReplayReport:
    """Replay every journal from `mark` (module docstring). Give `apply` (one record at a time, with the mark just
    after it) or `apply_batch` (the records in lists, in order, with the id of the journal they are in)."""
    if (apply is None) == (apply_batch is None):
        raise ValueError("replay needs exactly one of apply and apply_batch")
    if apply_batch is None:
        apply_batch = _one_at_a_time(apply)
    report = ReplayReport(end=mark)
    ids = [i for i in list_journal_ids(disk, journal_dir) if i >= mark.journal_id]
    if mark.journal_id > 0 and (not ids or ids[0] != mark.journal_id):
        raise JournalCorruptError(
            f"journal {fmt.journal_file_name(mark.journal_id)} named by the checkpoint mark is missing from "
            f"{journal_dir}: refusing to start (entries acknowledged after the last checkpoint would be lost)")
    for position, journal_id in enumerate(ids):
        newest = position == len(ids) - 1
        path = os.path.join(journal_dir, fmt.journal_file_name(journal_id))
        data = disk.read_all(path)
        try:
            file_instance = fmt.decode_file_header(data)
        except FormatError as e:
            if newest and (len(data) < fmt.FILE_HEADER_BYTES or not any(data)):
                # maybe: a crash between creating the newest file and syncing its header; nothing in it
                # was ever acknowledged, so the file goes (a later start must not see it as an older file)
                report.torn.append(f"{path}: torn header ({len(data)} bytes): {e}")
                log(f"journal replay: {report.torn[-1]}; removing the file")
                disk.remove(path)
                await disk.sync_dir(journal_dir)
                continue
            raise JournalCorruptError(f"{path}: {e}") from None
        if not fmt.same_instance(file_instance, instance_id):
            raise JournalCorruptError(f"{path} belongs to cluster instance {file_instance}, not {instance_id}")
        start = mark.offset if journal_id == mark.journal_id else fmt.FILE_HEADER_BYTES
        start = max(start, fmt.FILE_HEADER_BYTES)
        report.journals.append(journal_id)
        scan = fmt.JournalScan(data, start, newest, skip_corruption, name=path, batch_bytes=BATCH_BYTES)
        logged = 0  # of scan.skipped
        for batch in scan:
            logged = _log_skipped(scan.skipped, logged, report, log)
            end = JournalMark(journal_id, batch[-1].end)
            batch = _checked(batch, path, skip_corruption, report, log)
            if batch:
                await apply_batch(journal_id, batch)
                report.records += len(batch)
            report.end = end
            del batch
        _log_skipped(scan.skipped, logged, report, log)
        if report.end < JournalMark(journal_id, start):
            report.end = JournalMark(journal_id, start)
        if scan.torn is not None:
            report.torn.append(f"{path}: {scan.torn}")
            log(f"journal replay: {report.torn[-1]}; truncating {len(data) - scan.end} bytes")
            await disk.truncate(path, scan.end)
        del data, scan
    return report


def _one_at_a_time(apply: ApplyRecord) -> ApplyBatch:
    async def apply_batch(journal_id: int, records: list[fmt.JournalRecord]) -> None:
        for record in records:
            await apply(record, JournalMark(journal_id, record.end))
    return apply_batch


def _log_skipped(problems: list[str], logged: int, report: ReplayReport, log: Callable[[str], None]) -> int:
    """Report and log the scan's skipped damage from `problems[logged:]` on; returns how many are logged."""
    for problem in problems[logged:]:
        report.skipped.append(problem)
        log(f"JOURNAL CORRUPTION SKIPPED (journal_skip_corruption=true), data may be lost: {problem}")
    return len(problems)


def _checked(batch: list[fmt.JournalRecord], path: str, skip_corruption: bool, report: ReplayReport,
             log: Callable[[str], None]) -> list[fmt.JournalRecord]:
    """The batch's records whose bodies fit their types (`check_body`); a record whose CRC holds but whose body does
    not fit is corruption: refused, or skipped loudly with `skip_corruption`."""
    check_body = fmt.check_body
    try:
        for record in batch:
            check_body(record)
        return batch
    except JournalCorruptError:
        pass
    kept = []
    for record in batch:
        try:
            check_body(record)
        except JournalCorruptError as e:
            if not skip_corruption:
                raise JournalCorruptError(f"{path}: corruption: {e}") from None
            report.skipped.append(f"{path}: corruption: {e}")
            log(f"JOURNAL CORRUPTION SKIPPED (journal_skip_corruption=true), data may be lost: {report.skipped[-1]}")
        else:
            kept.append(record)
    return kept
