"""Fuzzing of the JSON values read from ZooKeeper and from bookie directories: ledger metadata
(metadata/ledger_metadata.py, MetadataFormatError), cookies (bookie/cookie.py, CookieError: a cookie that does
not parse refuses start-up like one that disagrees), the managed-ledger znode (topics/managed_ledger.py,
FormatError) and under-replication marks (autorecovery/marks.py: never an error, a mark without bookies).

Generated inputs: arbitrary bytes, valid encodings mutated byte-wise, valid documents with one field replaced
by another JSON value (wrong types, huge and non-finite numbers, deep nesting), and round trips.
"""
from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from bksim.autorecovery.marks import Mark, decode_mark, encode_mark
from bksim.bookie import cookie as cookies
from bksim.metadata import ledger_metadata as lm
from bksim.model.errors import CookieError, FormatError, MetadataFormatError
from bksim.topics.managed_ledger import LedgerInfo, ManagedLedgerInfo
from fuzz.mutations import mutated, raw_bytes

DEEP = b"[" * 100_000 + b"]" * 100_000  # json.loads: RecursionError
HUGE_INT = b"1" * 5_000  # int() of more than 4,300 digits: ValueError (not a JSONDecodeError)


def json_values() -> st.SearchStrategy:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


@st.composite
def field_replaced(draw, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid document with one field (or one segment field) replaced by another JSON value, or raw text."""
    doc = json.loads(draw(valid))
    target = doc
    if "segments" in doc and doc["segments"] and draw(st.booleans()):
        target = draw(st.sampled_from(doc["segments"]))
    key = draw(st.sampled_from(sorted(target) + ["unknown"]))
    raw = draw(st.sampled_from([None, "1e999", "-1e999", "NaN", "Infinity", HUGE_INT.decode(), "[[[[[[[[1]]]]]]]]",
                                DEEP.decode()]))
    if raw is None:
        target[key] = draw(json_values())
        return json.dumps(doc).encode()
    target[key] = "\0RAW\0"
    return json.dumps(doc).encode().replace(b'"\\u0000RAW\\u0000"', raw.encode())


# ---------------------------------------------------------------------------------------------- ledger metadata
bookie_ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)


@st.composite
def ledger_metadata(draw) -> lm.LedgerMetadata:
    e = draw(st.integers(1, 4))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    firsts = sorted(draw(st.sets(st.integers(1, 1_000), max_size=3)))
    segments = tuple(lm.Segment(first, tuple(draw(st.lists(bookie_ids, min_size=e, max_size=e, unique=True))))
                     for first in [0] + firsts)
    state = draw(st.sampled_from(list(lm.LedgerState)))
    last, length = -1, 0
    if state is lm.LedgerState.CLOSED:
        last = draw(st.integers(max(-1, segments[-1].first_entry_id - 1), 2**63 - 1))
        length = 0 if last == -1 else draw(st.integers(0, 2**63 - 1))
    return lm.LedgerMetadata(ensemble_size=e, write_quorum_size=qw, ack_quorum_size=qa, segments=segments,
                             state=state, last_entry_id=last, length=length,
                             digest_type=draw(st.sampled_from(list(lm.DIGEST_TYPES))),
                             password=draw(st.binary(max_size=16)),
                             ctime_ms=draw(st.integers(0, 2**62)),
                             custom=draw(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2)))


metadata_bytes = ledger_metadata().map(lm.encode)


def metadata_decodes_or_format_error(data: bytes) -> None:
    try:
        lm.decode(data, "fuzz")
    except MetadataFormatError as e:
        assert "fuzz" in str(e)


@given(st.one_of(raw_bytes(), mutated(metadata_bytes), field_replaced(metadata_bytes)))
@example(DEEP)
@example(HUGE_INT)
@example(b'{"format_version":' + HUGE_INT + b'}')
def test_ledger_metadata_decode_or_format_error(data):
    metadata_decodes_or_format_error(data)


@given(ledger_metadata())
def test_ledger_metadata_round_trip(metadata):
    data = lm.encode(metadata)
    assert lm.decode(data) == metadata and lm.encode(lm.decode(data)) == data


# ---------------------------------------------------------------------------------------------- cookies
@st.composite
def cookie_values(draw) -> cookies.Cookie:
    incarnation = draw(st.integers(1, 2**40))
    limbo = cookies.NO_LIMBO if incarnation == 1 else draw(st.integers(-1, cookies.LIMBO_EVERY_LEDGER))
    return cookies.Cookie(draw(bookie_ids), draw(bookie_ids), draw(bookie_ids), draw(bookie_ids),
                          incarnation=incarnation, limbo_ledger_id_max=limbo)


cookie_bytes = cookie_values().map(cookies.encode)


def cookie_decodes_or_cookie_error(data: bytes) -> None:
    try:
        cookies.decode(data, "fuzz")
    except CookieError as e:
        assert "fuzz" in str(e)


@given(st.one_of(raw_bytes(), mutated(cookie_bytes), field_replaced(cookie_bytes)))
@example(DEEP)
@example(HUGE_INT)
@example(b'{"version":1,"bookie_id":"b","instance_id":"i","journal_dir":"j","ledger_dir":"l","incarnation":'
         + HUGE_INT + b'}')
def test_cookie_decode_or_cookie_error(data):
    cookie_decodes_or_cookie_error(data)


@given(cookie_values())
def test_cookie_round_trip(cookie):
    assert cookies.decode(cookies.encode(cookie)) == cookie


# ---------------------------------------------------------------------------------------------- other znodes
infos = st.builds(ManagedLedgerInfo, st.lists(st.builds(LedgerInfo, st.integers(0, 2**63 - 1), st.integers(0, 10**9),
                                                        st.integers(0, 2**40), st.integers(0, 2**42),
                                                        st.integers(0, 2**42)), max_size=4),
                  st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3))


@given(st.one_of(raw_bytes(), mutated(infos.map(ManagedLedgerInfo.to_bytes)),
                 field_replaced(infos.map(ManagedLedgerInfo.to_bytes))))
@example(DEEP)
@example(b'{"ledgers":[{"ledger_id":1e999}]}')  # int(inf): OverflowError
@example(b'{"ledgers":[{}]}')  # KeyError
@example(b"\xff")  # UnicodeDecodeError
def test_managed_ledger_znode_decode_or_format_error(data):
    try:
        ManagedLedgerInfo.from_bytes(data)
    except FormatError as e:
        assert "managed ledger" in str(e)


@given(infos)
def test_managed_ledger_znode_round_trip(info):
    assert ManagedLedgerInfo.from_bytes(info.to_bytes()) == info


marks_bytes = st.builds(Mark, st.integers(0, 2**63 - 1), st.lists(bookie_ids, max_size=3, unique=True).map(tuple),
                        st.integers(0, 2**42), st.integers(0, 2**40), st.text(max_size=8)).map(encode_mark)


@given(st.one_of(raw_bytes(), mutated(marks_bytes), field_replaced(marks_bytes)))
@example(DEEP)
def test_under_replication_mark_always_decodes(data):
    """A mark that does not decode still marks its ledger (autorecovery/marks.py): decode_mark never raises."""
    mark = decode_mark(7, data, 3)
    assert mark.ledger_id == 7 and mark.version == 3


# ------------------------------------------------------------------------------ bookie registrations (broker side)
@given(raw_bytes())
@example(DEEP)
@example(b'{"host": "h", "port": ' + HUGE_INT + b"}")
@example(b"[1]")
def test_a_bookie_registration_resolves_or_is_unreachable(data):
    from bksim.adapters.bookie_transport import RegistrationResolver
    from bksim.model.errors import BksimError

    try:
        address = RegistrationResolver._parse("not-an-address", "/ledgers/available/not-an-address", data)
    except BksimError:
        return  # BookieUnreachable: the znode names no usable host and port
    host, _, port = address.rpartition(":")
    assert host and 0 < int(port) < 65536
