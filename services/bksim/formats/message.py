"""Message entry format: what a topic stores in one ledger entry (PROTOCOL.md §5, "Message id").

One entry = one producer Send = one message or a batch of messages. The broker writes it (it stamps the
publish time) and peeks only the fixed header on its hot paths (dedup, Key_Shared routing, TTL, permits);
consumers decode the messages. Every message keeps its own key, properties, event time and sequence id.

    header:  magic "BKM1" | flags u16 | publish_time_ms i64 | first_sequence_id i64 | highest_sequence_id i64
             | num_messages u32 | producer_name (u16 length + UTF-8) | sticky key (u16 length + UTF-8)
             | deliver_at_ms i64 (only with flag bit 2)
    then num_messages times:
             record_length u32 | sequence_id i64 | event_time_ms i64 | has_key u8 | key (u16 + UTF-8)
             | property count u16 | (name u16 + UTF-8, value u32 + UTF-8) * count | payload u32 + bytes

flags: bit 0 = batch (the entry was sent as a batch, message ids carry a batch index even for one message),
bit 1 = the sticky key is set (the first message's key; producers batch by key so every message of a batch
shares it, which keeps Key_Shared per-key order), bit 2 = delayed delivery: deliver_at_ms follows the sticky key
(Pulsar's deliverAt; wall-clock ms since the epoch). A delayed message is never batched (as in Pulsar): the
flag is only valid on a non-batch entry, so the time is the entry's and the broker reads it from the header.
Entries without bit 2 are laid out exactly as before it existed. All integers big-endian. The bookie's own entry header
and digest wrap these bytes, so no checksum here.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from bksim.model.errors import FormatError

MAGIC = b"BKM1"
FLAG_BATCH = 0x1
FLAG_KEY = 0x2
FLAG_DELIVER_AT = 0x4
_I64 = struct.Struct(">q")
_FIXED = struct.Struct(">4sHqqqI")  # magic, flags, publish time, first seq, highest seq, num messages
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_RECORD = struct.Struct(">IqqB")    # record length, sequence id, event time, has_key
RECORD_FIELDS = 5  # values per message in decode_records
_PLAIN = struct.Struct(">IqqBHHI")  # ... then key length, property count and payload length when both are 0


@dataclass(slots=True)
class Message:
    """One message as produced and as consumed."""
    payload: bytes
    key: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    event_time_ms: int = 0
    sequence_id: int = -1
    deliver_at_ms: int = 0   # 0 = at once; else not before this wall-clock time (Shared / Key_Shared only)


@dataclass(frozen=True, slots=True)
class EntryHeader:
    flags: int
    publish_time_ms: int
    first_sequence_id: int
    highest_sequence_id: int
    num_messages: int
    producer_name: str
    sticky_key: str | None
    body_offset: int  # where the first message record starts
    deliver_at_ms: int = 0  # 0 = not delayed

    @property
    def is_batch(self) -> bool:
        return bool(self.flags & FLAG_BATCH)


def _str16(text: str, what: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise FormatError(f"{what} is {len(raw)} bytes; at most 65535")
    return _U16.pack(len(raw)) + raw


def encode_entry(messages: list[Message], *, producer_name: str, publish_time_ms: int, batch: bool) -> bytes:
    """The entry bytes of one Send. `batch` False requires exactly one message; a delayed message
    (deliver_at_ms > 0) is never part of a batch."""
    if not messages:
        raise FormatError("an entry holds at least one message")
    if not batch and len(messages) != 1:
        raise FormatError(f"a non-batch entry holds exactly one message, not {len(messages)}")
    deliver_at = messages[0].deliver_at_ms
    if any(m.deliver_at_ms < 0 for m in messages):
        raise FormatError("deliver_at_ms is 0 (at once) or a time in ms since the epoch, never negative")
    if batch and any(m.deliver_at_ms for m in messages):
        raise FormatError("a delayed message (deliver_at_ms) is never batched: send it alone")
    first_key = messages[0].key
    flags = ((FLAG_BATCH if batch else 0) | (FLAG_KEY if first_key is not None else 0)
             | (FLAG_DELIVER_AT if deliver_at else 0))
    seqs = [m.sequence_id for m in messages]
    parts = [_FIXED.pack(MAGIC, flags, publish_time_ms, seqs[0], max(seqs), len(messages)),
             _str16(producer_name, "producer name"), _str16(first_key or "", "key")]
    if deliver_at:
        parts.append(_I64.pack(deliver_at))
    for m in messages:
        props = [_U16.pack(len(m.properties))]
        for name, value in m.properties.items():
            raw = value.encode()
            props.append(_str16(name, "property name"))
            props.append(_U32.pack(len(raw)) + raw)
        key = _str16(m.key or "", "key")
        tail = b"".join(props) + _U32.pack(len(m.payload))
        length = _RECORD.size - 4 + len(key) + len(tail) + len(m.payload)
        parts.append(_RECORD.pack(length, m.sequence_id, m.event_time_ms, m.key is not None))
        parts.append(key)
        parts.append(tail)
        parts.append(m.payload)
    return b"".join(parts)


def read_header(entry: bytes) -> EntryHeader:
    """The fixed header of a message entry, without touching the messages; FormatError if it is not one."""
    try:
        magic, flags, publish, first, highest, count = _FIXED.unpack_from(entry, 0)
        if magic != MAGIC:
            raise FormatError(f"not a message entry (magic {magic!r})")
        offset = _FIXED.size
        (n,) = _U16.unpack_from(entry, offset)
        producer = bytes(entry[offset + 2: offset + 2 + n]).decode()
        offset += 2 + n
        (n,) = _U16.unpack_from(entry, offset)
        key = bytes(entry[offset + 2: offset + 2 + n]).decode() if flags & FLAG_KEY else None
        offset += 2 + n
        deliver_at = 0
        if flags & FLAG_DELIVER_AT:
            (deliver_at,) = _I64.unpack_from(entry, offset)
            offset += _I64.size
            if flags & FLAG_BATCH or deliver_at <= 0:
                raise FormatError(f"a delayed entry is a single message with a positive time, not "
                                  f"{'a batch' if flags & FLAG_BATCH else deliver_at}")
    except (struct.error, UnicodeDecodeError) as e:
        raise FormatError(f"message entry header is damaged: {e}") from None
    if offset > len(entry):
        raise FormatError("message entry header is truncated")
    return EntryHeader(flags, publish, first, highest, count, producer, key, offset, deliver_at)


def decode_entry(entry: bytes) -> tuple[EntryHeader, list[Message]]:
    """Header and every message of an entry; FormatError names what is wrong."""
    header = read_header(entry)
    deliver_at = header.deliver_at_ms
    fields = iter(decode_records(entry, header))
    return header, [Message(payload, key, props if props is not None else {}, event_time, seq, deliver_at)
                    for payload, key, props, event_time, seq in zip(fields, fields, fields, fields, fields)]


def decode_records(entry: bytes, header: EntryHeader) -> list:
    """Every message of an entry whose header is `header`, flat: payload, key, properties, event_time_ms,
    sequence_id of the first message, then of the second, ... (RECORD_FIELDS values each; properties None when
    there are none). What a consumer needs without an object per record (read it with
    zip(it, it, it, it, it) over one iterator). FormatError names what is wrong. A record without key bytes and
    properties (the common case) is read with one unpack."""
    if not isinstance(entry, bytes):
        entry = bytes(entry)
    size = len(entry)
    offset = header.body_offset
    out: list = []
    extend = out.extend
    plain_from = _PLAIN.unpack_from
    plain_size = _PLAIN.size
    done = 0
    try:
        for done in range(header.num_messages):
            length, seq, event_time, has_key, n, count, payload_len = plain_from(entry, offset)
            end = offset + 4 + length
            if end > size:
                raise FormatError(f"message {done} runs past the end of the entry")
            if n == 0 and count == 0:  # no key bytes, no properties: the payload follows at once
                pos = offset + plain_size
                if pos + payload_len != end:
                    raise FormatError(f"message {done} has an inconsistent length")
                extend((entry[pos:end], "" if has_key else None, None, event_time, seq))
                offset = end
                continue
            pos = offset + _RECORD.size
            key = entry[pos + 2: pos + 2 + n].decode() if has_key else None
            pos += 2 + n
            (count,) = _U16.unpack_from(entry, pos)
            pos += 2
            props: dict[str, str] | None = {} if count else None
            for _p in range(count):
                (n,) = _U16.unpack_from(entry, pos)
                name = entry[pos + 2: pos + 2 + n].decode()
                pos += 2 + n
                (n,) = _U32.unpack_from(entry, pos)
                props[name] = entry[pos + 4: pos + 4 + n].decode()
                pos += 4 + n
            (n,) = _U32.unpack_from(entry, pos)
            pos += 4
            if pos + n != end:
                raise FormatError(f"message {done} has an inconsistent length")
            extend((entry[pos:end], key, props, event_time, seq))
            offset = end
    except (struct.error, UnicodeDecodeError) as e:
        raise FormatError(f"message {done} of the entry is damaged: {e}") from None
    if offset != size:
        raise FormatError(f"{size - offset} stray bytes after the last message")
    return out
