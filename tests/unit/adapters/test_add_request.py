"""bookie_client.make_request: the compact AddRequest form (one master key and flags, entries as `data`) for a batch
whose entries share them, one AddEntry per entry otherwise; both decode to the same (entry, key, flags) list."""
from __future__ import annotations

from bksim.adapters.bookie_client import make_request
from bksim.gen import bookie_pb2

KEY, OTHER = b"k" * 32, b"o" * 32


def items_of(request: bookie_pb2.AddRequest) -> list[tuple[bytes, bytes, int]]:
    """What the bookie's server reads from either form."""
    if request.data:
        return [(e, request.master_key, request.flags) for e in request.data]
    return [(e.entry, e.master_key, e.flags) for e in request.entries]


def test_a_batch_of_one_key_and_flags_goes_in_the_compact_form():
    items = [(b"entry-%d" % i, KEY, 1) for i in range(5)]
    request = bookie_pb2.AddRequest.FromString(make_request(9, items).SerializeToString())
    assert request.batch_id == 9 and len(request.data) == 5 and not request.entries
    assert (request.master_key, request.flags) == (KEY, 1)
    assert items_of(request) == items


def test_a_batch_mixing_keys_or_flags_keeps_one_add_entry_each():
    for items in ([(b"a", KEY, 0), (b"b", OTHER, 0)], [(b"a", KEY, 0), (b"b", KEY, 1)]):
        request = bookie_pb2.AddRequest.FromString(make_request(1, items).SerializeToString())
        assert len(request.entries) == 2 and not request.data and not request.master_key
        assert items_of(request) == items


def test_the_compact_form_is_smaller_on_the_wire():
    items = [(b"x" * 1024, KEY, 0)] * 100
    compact = make_request(1, items).ByteSize()
    each = bookie_pb2.AddRequest(batch_id=1, entries=[bookie_pb2.AddEntry(entry=e, master_key=k, flags=f)
                                                      for e, k, f in items]).ByteSize()
    assert compact < each - 99 * len(KEY), (compact, each)
