"""Journal replay on start-up (PROTOCOL.md §2.2 "Replay on restart").

Reads journals from the checkpoint mark (a group boundary), in order, and hands each record to
`apply(record, mark_after)`. The torn last group of the newest journal (formats/journal.py says exactly what
that is) ends replay and is truncated away (reported, not fatal: it was never acknowledged). Damage before
it, or in an older journal, refuses start-up (JournalCorruptError), unless `skip_corruption` is set: then
the damaged groups are skipped LOUDLY, keeping their records that pass their own CRC. A record whose CRC
holds but whose body does not have the size its type needs (`formats.journal.check_body`) is corruption too:
`apply` only ever gets bodies it can unpack.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from bksim.bookie.journal import JournalMark, list_journal_ids
from bksim.formats import journal as fmt
from bksim.model.errors import FormatError, JournalCorruptError
from bksim.ports.disk import Disk


@dataclass(slots=True)
class ReplayReport:
    journals: list[int] = field(default_factory=list)
    records: int = 0
    end: JournalMark = JournalMark(0, 0)  # position after the last replayed record
    torn: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


async def replay(disk: Disk, journal_dir: str, mark: JournalMark, instance_id: str,
                 apply: Callable[[fmt.JournalRecord, JournalMark], Awaitable[None]],
                 skip_corruption: bool = False, log: Callable[[str], None] = print) -> ReplayReport:
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
        result = fmt.scan_journal(data, start, newest, skip_corruption, name=path)
        for problem in result.skipped:
            log(f"JOURNAL CORRUPTION SKIPPED (journal_skip_corruption=true), data may be lost: {problem}")
        report.skipped.extend(result.skipped)
        report.journals.append(journal_id)
        for record in result.records:
            end = JournalMark(journal_id, record.end)
            try:
                fmt.check_body(record)
            except JournalCorruptError as e:  # its CRC holds but its body does not fit its type
                if not skip_corruption:
                    raise JournalCorruptError(f"{path}: corruption: {e}") from None
                report.skipped.append(f"{path}: corruption: {e}")
                log(f"JOURNAL CORRUPTION SKIPPED (journal_skip_corruption=true), data may be lost: "
                    f"{report.skipped[-1]}")
            else:
                await apply(record, end)
                report.records += 1
            report.end = end
        if report.end < JournalMark(journal_id, start):
            report.end = JournalMark(journal_id, start)
        if result.torn is not None:
            report.torn.append(f"{path}: {result.torn}")
            log(f"journal replay: {report.torn[-1]}; truncating {len(data) - result.end} bytes")
            await disk.truncate(path, result.end)
    return report
