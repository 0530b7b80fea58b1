"""The message entry format (formats/message.py): every record decodes to what was encoded, whichever path reads
it (a record without key bytes and properties in one unpack, the others field by field), in the flat layout of
decode_records; a damaged or truncated entry is a FormatError, never a wrong message."""
from __future__ import annotations

import pytest

from bksim.formats.message import RECORD_FIELDS, Message, decode_entry, decode_records, encode_entry, read_header
from bksim.model.errors import FormatError

MIXED = [Message(b"plain", sequence_id=0),
         Message(b"keyed", key="k1", sequence_id=1, event_time_ms=7),
         Message(b"", key="", sequence_id=2),                      # an empty key is a key, not None
         Message(b"props", properties={"a": "1", "b\u00e9": "\u00fc"}, sequence_id=3),
         Message(b"both", key="k4", properties={"x": ""}, sequence_id=4),
         Message(b"\x00" * 300, sequence_id=5, event_time_ms=-1)]


def test_every_kind_of_record_decodes_to_what_was_encoded_flat_and_as_messages():
    entry = encode_entry(MIXED, producer_name="p", publish_time_ms=11, batch=True)
    fields = decode_records(entry, read_header(entry))
    assert len(fields) == RECORD_FIELDS * len(MIXED)
    it = iter(fields)
    flat = [(payload, key, props or {}, event, seq) for payload, key, props, event, seq in zip(*[it] * RECORD_FIELDS)]
    assert flat == [(m.payload, m.key, m.properties, m.event_time_ms, m.sequence_id) for m in MIXED]
    assert fields[2] is None and fields[RECORD_FIELDS * 3 + 2] == {"a": "1", "b\u00e9": "\u00fc"}
    header, messages = decode_entry(entry)
    assert (header.publish_time_ms, header.num_messages, header.is_batch) == (11, len(MIXED), True)
    assert messages == MIXED
    messages[0].properties["mine"] = "x"  # each decoded message has its own properties dict
    assert decode_entry(entry)[1][0].properties == {}


@pytest.mark.parametrize("cut", [1, 5, 20, 29, 40])
def test_a_truncated_entry_is_a_format_error(cut):
    entry = encode_entry(MIXED, producer_name="p", publish_time_ms=0, batch=True)
    with pytest.raises(FormatError):
        decode_entry(entry[:-cut])


def test_stray_bytes_and_an_inconsistent_record_length_are_format_errors():
    entry = encode_entry([Message(b"abc", sequence_id=0)], producer_name="p", publish_time_ms=0, batch=False)
    with pytest.raises(FormatError, match="stray bytes"):
        decode_entry(entry + b"\x00")
    body = read_header(entry).body_offset
    longer = bytearray(entry)
    longer[body + 3] += 1  # the record claims one byte more than its payload length says
    with pytest.raises(FormatError):
        decode_entry(bytes(longer) + b"\x00")
