"""LedgerMetadata (PROTOCOL.md §3): validation, the protocol's transitions, write sets, and its bytes."""
from __future__ import annotations

import dataclasses
import json

import pytest

from bksim.metadata.ledger_metadata import (FORMAT_VERSION, LedgerMetadata, LedgerState, Segment, decode, encode,
                                            write_set_indexes)
from bksim.model.errors import FormatError, LedgerStateError, MetadataFormatError

A, B, C, D, E5 = "a:1", "b:1", "c:1", "d:1", "e:1"


def meta(**overrides) -> LedgerMetadata:
    values = dict(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, segments=(Segment(0, (A, B, C)),),
                  password=b"secret", ctime_ms=1700000000000, custom={"owner": "topic-1"})
    values.update(overrides)
    return LedgerMetadata(**values)


# -- validation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, words", [
    (dict(ensemble_size=2, segments=(Segment(0, (A, B)),), write_quorum_size=3, ack_quorum_size=2), "ensemble_size >="),
    (dict(ack_quorum_size=3), "write_quorum_size >= ack_quorum_size"),
    (dict(ack_quorum_size=0), ">= 1"),
    (dict(write_quorum_size=True), "ensemble_size"),
    (dict(segments=()), "at least one segment"),
    (dict(segments=(Segment(1, (A, B, C)),)), "starts at entry 1, not 0"),
    (dict(segments=(Segment(0, (A, B, C)), Segment(0, (A, B, D)))), "strictly increase"),
    (dict(segments=(Segment(0, (A, B, C)), Segment(5, (A, B, D)), Segment(3, (A, C, D)))), "strictly increase"),
    (dict(segments=(Segment(0, (A, B)),)), "has 2 bookies, ensemble_size is 3"),
    (dict(state=LedgerState.OPEN, last_entry_id=4, length=10), "only a CLOSED ledger has an end"),
    (dict(state=LedgerState.IN_RECOVERY, length=3), "only a CLOSED ledger has an end"),
    (dict(state=LedgerState.CLOSED, last_entry_id=-2), "< -1"),
    (dict(state=LedgerState.CLOSED, last_entry_id=-1, length=5), "empty ledger"),
    (dict(state=LedgerState.CLOSED, last_entry_id=3, length=-1), "length"),
    (dict(state=LedgerState.CLOSED, last_entry_id=3, length=9,
          segments=(Segment(0, (A, B, C)), Segment(5, (A, B, D)))), "a segment starts at 5"),
    (dict(state="OPEN"), "not a LedgerState"),
    (dict(digest_type="crc32"), "digest_type"),
    (dict(password="secret"), "password must be bytes"),
    (dict(ctime_ms=-1), "ctime_ms"),
    (dict(custom={"k": 1}), "str -> str"),
    (dict(custom=[1, 2]), "str -> str"),
    (dict(format_version=2), "format_version"),
])
def test_invalid_metadata_is_refused_with_the_reason(overrides, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        meta(**overrides)


@pytest.mark.parametrize("first, ensemble, words", [
    (-1, (A,), "first_entry_id"),
    (0, (), "empty ensemble"),
    (0, (A, A), "names a bookie twice"),
    (0, (A, ""), "non-empty string"),
])
def test_invalid_segments_are_refused(first, ensemble, words):
    with pytest.raises(ValueError, match=words):
        Segment(first, ensemble)


def test_values_are_frozen_and_custom_is_read_only():
    m = meta()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.state = LedgerState.CLOSED  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.custom["x"] = "y"  # type: ignore[index]
    assert "secret" not in repr(m)  # the password never reaches a log line
    assert hash(m) == hash(meta())


def test_closed_ledgers_that_are_valid():
    empty = meta(state=LedgerState.CLOSED, last_entry_id=-1, length=0)
    assert empty.is_closed
    # a writer changed the ensemble at LAC + 1 = 5 and closed at LAC 4: the last segment holds nothing
    meta(state=LedgerState.CLOSED, last_entry_id=4, length=0, segments=(Segment(0, (A, B, C)), Segment(5, (A, B, D))))


# -- transitions ----------------------------------------------------------------------------------------------

def test_recovery_transitions():
    m = meta()
    recovering = m.with_state(LedgerState.IN_RECOVERY)
    assert recovering.state is LedgerState.IN_RECOVERY and m.state is LedgerState.OPEN  # a new value
    assert recovering.with_state(LedgerState.IN_RECOVERY) is recovering  # a second recoverer: same value
    closed = recovering.closed(9, 90)
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 9, 90)
    assert closed.segments == m.segments and closed.password == m.password and closed.custom == m.custom


@pytest.mark.parametrize("start, target", [
    (LedgerState.OPEN, LedgerState.OPEN),
    (LedgerState.OPEN, LedgerState.CLOSED),
    (LedgerState.IN_RECOVERY, LedgerState.OPEN),
    (LedgerState.CLOSED, LedgerState.OPEN),
    (LedgerState.CLOSED, LedgerState.IN_RECOVERY),
])
def test_illegal_transitions_name_both_states(start, target):
    m = meta() if start is not LedgerState.CLOSED else meta().closed(-1, 0)
    if start is LedgerState.IN_RECOVERY:
        m = m.with_state(start)
    with pytest.raises(LedgerStateError, match=f"from {start.name} to {target.name}"):
        m.with_state(target)


def test_closing_a_closed_ledger_is_idempotent_only_for_the_same_end():
    closed = meta().closed(4, 40)
    assert closed.closed(4, 40) is closed
    for end in ((5, 40), (4, 41), (3, 30)):
        with pytest.raises(LedgerStateError, match="already CLOSED at last_entry_id 4 length 40"):
            closed.closed(*end)
    with pytest.raises(LedgerStateError):
        closed.with_new_segment(5, (A, B, D))


def test_new_segment_appends_or_replaces_the_last_one():
    m = meta()
    # a failure before anything was acknowledged: LAC = -1, the new segment starts at 0 and replaces
    at0 = m.with_new_segment(0, (D, B, C))
    assert at0.segments == (Segment(0, (D, B, C)),)
    changed = m.with_new_segment(5, (A, D, C))
    assert changed.segments == (Segment(0, (A, B, C)), Segment(5, (A, D, C)))
    again = changed.with_new_segment(5, (A, D, E5))  # a second failure before entry 5 is confirmed
    assert again.segments == (Segment(0, (A, B, C)), Segment(5, (A, D, E5)))
    later = again.with_new_segment(8, (B, D, E5))
    assert [s.first_entry_id for s in later.segments] == [0, 5, 8]
    assert later.ensemble == (B, D, E5) and later.last_segment == Segment(8, (B, D, E5))
    assert m.with_state(LedgerState.IN_RECOVERY).with_new_segment(3, (A, B, D)).state is LedgerState.IN_RECOVERY
    with pytest.raises(ValueError, match="before the last segment"):
        later.with_new_segment(7, (A, B, C))
    with pytest.raises(ValueError, match="has 2 bookies"):
        m.with_new_segment(5, (A, B))
    with pytest.raises(ValueError, match="twice"):
        m.with_new_segment(5, (A, A, B))


def test_replacing_a_bookie_of_one_segment_keeps_everything_else_in_every_state():
    two = meta().with_new_segment(5, (A, D, C))
    closed = two.closed(9, 100)
    for m in (two, two.with_state(LedgerState.IN_RECOVERY), closed):
        replaced = m.with_replaced_bookie(0, B, E5)
        assert replaced.segments == (Segment(0, (A, E5, C)), Segment(5, (A, D, C)))
        assert (replaced.state, replaced.last_entry_id, replaced.length) == (m.state, m.last_entry_id, m.length)
    assert closed.with_replaced_bookie(5, C, B).segments[1] == Segment(5, (A, D, B))
    with pytest.raises(ValueError, match="no segment starts at entry 3"):
        closed.with_replaced_bookie(3, A, E5)
    with pytest.raises(ValueError, match="does not name"):
        closed.with_replaced_bookie(5, B, E5)
    with pytest.raises(ValueError, match="twice"):
        closed.with_replaced_bookie(0, B, C)


def test_segment_for_and_write_sets():
    m = meta(ensemble_size=3, write_quorum_size=2).with_new_segment(5, (A, D, C)).with_new_segment(8, (B, D, E5))
    assert [m.segment_for(e).first_entry_id for e in (0, 4, 5, 7, 8, 1000)] == [0, 0, 5, 5, 8, 8]
    assert m.ensemble_for(6) == (A, D, C)
    assert write_set_indexes(0, 3, 2) == [0, 1]
    assert write_set_indexes(2, 3, 2) == [2, 0]
    assert write_set_indexes(7, 5, 3) == [2, 3, 4]
    assert m.write_set(0) == [A, B]
    assert m.write_set(4) == [B, C]  # (4 + 0) mod 3 = 1, (4 + 1) mod 3 = 2
    assert m.write_set(5) == [C, A]  # segment 5's ensemble (A, D, C): indexes 2, 0
    assert m.write_set(9) == [B, D]  # segment 8 (B, D, E5): indexes 0, 1
    assert m.write_set(11) == [E5, B]
    full = meta(write_quorum_size=3, ack_quorum_size=2)
    assert [sorted(full.write_set(e)) for e in range(3)] == [sorted((A, B, C))] * 3
    with pytest.raises(ValueError):
        m.segment_for(-1)


def test_new_builds_an_open_ledger_with_one_segment():
    m = LedgerMetadata.new([A, B, C, D], 3, 2, password=b"pw", ctime_ms=5, custom={"k": "v"})
    assert (m.ensemble_size, m.write_quorum_size, m.ack_quorum_size) == (4, 3, 2)
    assert m.segments == (Segment(0, (A, B, C, D)),)
    assert (m.state, m.last_entry_id, m.length, m.digest_type) == (LedgerState.OPEN, -1, 0, "crc32c")


# -- bytes ------------------------------------------------------------------------------------------------------

def test_round_trip_of_every_state():
    values = [meta(), meta(digest_type="none", password=b"", custom={}),
              meta(password=bytes(range(256)), custom={"ünïcode": "✓", "": ""}),
              meta().with_state(LedgerState.IN_RECOVERY).with_new_segment(7, (A, D, C)),
              meta().with_new_segment(3, (D, B, C)).closed(10, 12345)]
    for m in values:
        data = encode(m)
        assert decode(data) == m
        assert encode(decode(data)) == data  # canonical bytes


def test_encoding_is_documented_json():
    doc = json.loads(encode(meta().closed(2, 30)))
    assert doc == {
        "format_version": 1, "ensemble_size": 3, "write_quorum_size": 2, "ack_quorum_size": 2,
        "state": "CLOSED", "last_entry_id": 2, "length": 30,
        "segments": [{"first_entry_id": 0, "ensemble": [A, B, C]}],
        "digest_type": "crc32c", "password": "c2VjcmV0", "ctime_ms": 1700000000000, "custom": {"owner": "topic-1"},
    }


def _with(**changes) -> bytes:
    doc = json.loads(encode(meta()))
    doc.update(changes)
    return json.dumps(doc).encode()


def _without(name: str) -> bytes:
    doc = json.loads(encode(meta()))
    del doc[name]
    return json.dumps(doc).encode()


@pytest.mark.parametrize("data, words", [
    (b"", "not UTF-8 JSON"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"BookieMetadataFormatVersion\t3\n", "not UTF-8 JSON"),  # BookKeeper's own format
    (b"[1, 2]", "not a JSON object"),
    (b"{}", "no format_version"),
    (_with(format_version=2), "format_version 2; this bksim reads format_version 1"),
    (_with(format_version="1"), "format_version '1'"),
    (_without("password"), "missing field(s) ['password']"),
    (_with(extra=1), "unknown field(s) ['extra']"),
    (_with(ensemble_size="3"), "field 'ensemble_size' is str, expected int"),
    (_with(last_entry_id=True), "field 'last_entry_id' is bool"),
    (_with(state="DELETED"), "state 'DELETED'"),
    (_with(password="not base64!"), "password is not base64"),
    (_with(segments=[{"first_entry_id": 0}]), "is not {first_entry_id, ensemble}"),
    (_with(segments=[{"first_entry_id": 0, "ensemble": "abc"}]), "ensemble is not a list"),
    (_with(segments=[{"first_entry_id": 0, "ensemble": [A, A, B]}]), "names a bookie twice"),
    (_with(ack_quorum_size=3), "write_quorum_size >= ack_quorum_size"),
    (_with(custom={"k": 1}), "str -> str"),
])
def test_garbage_is_a_clear_format_error(data, words):
    with pytest.raises(MetadataFormatError) as e:
        decode(data, source="ledger 7 (/ledgers/00/0000/L0007)")
    assert isinstance(e.value, FormatError)
    assert words in str(e.value)
    assert "ledger 7 (/ledgers/00/0000/L0007)" in str(e.value)


def test_format_version_constant():
    assert FORMAT_VERSION == 1
