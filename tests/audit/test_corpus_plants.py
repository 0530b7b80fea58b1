"""The corpus helpers' plants themselves (tests/audit/corpus.py), on synthetic journals: a plant must do
exactly the damage it names and nothing else, or the planted-fault tests judge the audit on the wrong damage."""
from __future__ import annotations

from audit.corpus import cut_record
from bksim.formats import journal as jfmt
from bksim.formats.entry import encode_entry


def _journal(path, groups: list[list[tuple[int, int]]]) -> None:
    records = [[jfmt.entry_record(encode_entry(lid, eid, eid - 1, 0, b"p" * (20 + eid)), 0) for lid, eid in group]
               for group in groups]
    with open(path, "wb") as f:
        f.write(jfmt.encode_file("6f1c1a52-1d0b-4a5e-9b7e-0c3a2f1d4e5b", records))


def _scan(path):
    with open(path, "rb") as f:
        return jfmt.scan_journal(f.read(), jfmt.FILE_HEADER_BYTES, newest=True, skip_corruption=True)


def test_a_removed_copy_leaves_every_other_record_of_the_file_readable(tmp_path):
    """Two group writes, a record cut from the first: the second group (the file's last) must still frame and
    read, with nothing torn or skipped."""
    path = str(tmp_path / "0000000000000001.txn")
    _journal(path, [[(1, e) for e in range(8)], [(1, e) for e in range(8, 12)]])
    before = _scan(path)
    victim = next(r for r in before.records if r.type == jfmt.RecordType.ENTRY and r.body[8:16] == (3).to_bytes(8, "big"))
    cut_record(path, victim)
    after = _scan(path)
    assert after.torn is None and after.skipped == [], (after.torn, after.skipped)
    kept = [r.body for r in after.records if r.type == jfmt.RecordType.ENTRY]
    assert kept == [r.body for r in before.records if r.type == jfmt.RecordType.ENTRY and r is not victim]
