"""bookie/caches.py: the double-buffered write cache (bounds, idempotent re-adds, swap with read-your-writes
during a flush) and the two-generation read cache."""
from __future__ import annotations

from bksim.bookie.caches import ReadCache, WriteCache


def e(n: int, tag: bytes = b"") -> bytes:
    return (tag or b"e") * n


# -- WriteCache -----------------------------------------------------------------------------------------------
def test_put_get_and_miss():
    cache = WriteCache(1000)
    assert cache.put(1, 0, b"a" * 10)
    assert cache.get(1, 0) == b"a" * 10
    assert cache.get(1, 1) is None and cache.get(2, 0) is None
    assert (cache.active_bytes, cache.flushing_bytes, len(cache)) == (10, 0, 1)


def flat(runs):
    """swap()'s per-ledger runs as one sorted list of ((ledger, entry), bytes)."""
    return [((lid, eid), data) for lid, entries in runs for eid, data in entries]


def test_each_half_is_bounded_by_half_of_bytes_max():
    cache = WriteCache(100)
    assert cache.half_bytes_max == 50
    assert cache.put(1, 0, e(30))
    assert cache.put(1, 1, e(20))  # exactly full
    assert not cache.put(1, 2, e(1))
    assert cache.get(1, 2) is None and cache.active_bytes == 50 and cache.last_entry_id(1) == 1
    assert not WriteCache(100).put(1, 0, e(51))  # larger than a half never fits
    cache.swap()  # the flushing half keeps its bytes; the fresh active half has room again
    assert cache.put(1, 2, e(50)) and not cache.put(1, 3, e(1))
    assert (cache.active_bytes, cache.flushing_bytes) == (50, 50)


def test_a_shortened_active_half_fills_sooner_and_the_next_half_is_whole_again():
    cache = WriteCache(100)
    cache.put(1, 0, e(10))
    cache.shorten_active(25)
    assert cache.has_room(15) and not cache.has_room(16)
    assert cache.put(1, 1, e(15)) and not cache.put(1, 2, e(1))
    cache.swap()
    assert cache.has_room(50) and cache.put(1, 2, e(50))
    cache.shorten_active(500)  # clamped to a half
    assert cache.active_bytes == 50 and not cache.has_room(1)


def test_each_entry_counts_its_overhead_and_a_re_add_only_its_length_difference():
    cache = WriteCache(1000, entry_overhead=100)
    assert cache.put(1, 0, e(50)) and cache.active_bytes == 150
    assert cache.put(1, 0, e(80)) and cache.active_bytes == 180  # the same entry again: its objects are reused
    assert cache.has_room(220) and not cache.has_room(221)  # 180 + 220 + 100 = 500, a half
    assert cache.put(1, 1, e(220)) and not cache.put(1, 2, e(0))


def test_a_run_goes_in_whole_or_not_at_all_and_counts_as_its_puts_would():
    cache = WriteCache(1000, entry_overhead=10)
    assert cache.put(1, 4, e(20))
    assert not cache.put_run(1, [4, 5], [e(5), e(5)], 10)  # an id it holds: re-adds go one by one
    assert not cache.put_run(1, [2, 9], [e(5), e(5)], 10)  # below the ledger's last id
    assert not cache.put_run(2, [0, 1], [e(260), e(200)], 460)  # 30 + 480 > 500: no room for the whole run
    assert cache.get(2, 0) is None and cache.active_bytes == 30 and cache.last_entry_id(2) == -1
    assert cache.put_run(1, [5, 7], [e(5, b"a"), e(6, b"b")], 11) and cache.put_run(2, [0], [e(9)], 9)
    assert cache.active_bytes == 30 + 31 + 19 and cache.last_entry_id(1) == 7 and cache.get(1, 7) == e(6, b"b")
    assert flat(cache.swap()) == [((1, 4), e(20)), ((1, 5), e(5, b"a")), ((1, 7), e(6, b"b")), ((2, 0), e(9))]


def test_re_add_replaces_and_accounts_the_difference():
    cache = WriteCache(100)
    assert cache.put(1, 0, e(40, b"a"))
    assert cache.put(1, 0, e(50, b"b"))  # 40 -> 50 fits in 50 though 40 + 50 would not
    assert cache.get(1, 0) == e(50, b"b") and cache.active_bytes == 50 and len(cache) == 1
    assert cache.put(1, 0, e(10, b"c"))
    assert cache.active_bytes == 10 and cache.put(1, 1, e(40))
    assert not cache.put(1, 0, e(11))  # the replacement itself must fit


def test_swap_returns_sorted_entries_and_reads_see_the_flushing_half():
    cache = WriteCache(10_000)
    puts = [((2, 1), b"2:1"), ((1, 5), b"1:5"), ((2, 0), b"2:0"), ((1, 0), b"1:0"), ((10, 0), b"10:0")]
    for (lid, eid), data in puts:
        assert cache.put(lid, eid, data)
    flushing = flat(cache.swap())
    assert flushing == sorted(puts)
    assert [k for k, _ in flushing] == [(1, 0), (1, 5), (2, 0), (2, 1), (10, 0)]
    # read-your-writes during the flush: every swapped entry is still readable ...
    for (lid, eid), data in puts:
        assert cache.get(lid, eid) == data
    assert (cache.active_bytes, cache.flushing_bytes) == (0, sum(len(d) for _, d in puts))
    # ... while a new active half takes writes, which win over the flushing half for the same key
    assert cache.put(1, 6, b"1:6") and cache.put(1, 5, b"1:5 again")
    assert cache.get(1, 6) == b"1:6" and cache.get(1, 5) == b"1:5 again" and cache.get(2, 1) == b"2:1"
    assert len(cache) == 7


def test_last_entry_id_across_halves():
    cache = WriteCache(10_000)
    assert cache.last_entry_id(1) == -1
    for eid in (0, 3, 1):
        cache.put(1, eid, b"x")
    cache.put(2, 7, b"x")
    assert (cache.last_entry_id(1), cache.last_entry_id(2)) == (3, 7)
    cache.swap()
    cache.put(1, 2, b"x")  # lower than what the flushing half holds
    cache.put(2, 8, b"x")
    cache.put(3, 0, b"x")
    assert (cache.last_entry_id(1), cache.last_entry_id(2), cache.last_entry_id(3)) == (3, 8, 0)
    cache.flushed()  # after the flush the index answers for 1:3; the cache only knows the active half
    assert (cache.last_entry_id(1), cache.last_entry_id(2), cache.last_entry_id(4)) == (2, 8, -1)


def test_flushed_clears_the_flushing_half_only():
    cache = WriteCache(1000)
    cache.put(1, 0, b"old")
    cache.swap()
    cache.put(1, 1, b"new")
    cache.flushed()
    assert cache.get(1, 0) is None and cache.get(1, 1) == b"new"
    assert (cache.flushing_bytes, cache.active_bytes, len(cache)) == (0, 3, 1)
    assert flat(cache.swap()) == [((1, 1), b"new")]  # a second cycle works
    cache.flushed()
    assert len(cache) == 0 and flat(cache.swap()) == []


# -- ReadCache ------------------------------------------------------------------------------------------------
def test_read_cache_put_get():
    cache = ReadCache(100)
    cache.put(1, 0, b"abc")
    assert cache.get(1, 0) == b"abc" and cache.get(1, 1) is None


def test_read_cache_skips_entries_larger_than_a_generation():
    cache = ReadCache(100)
    cache.put(1, 0, e(51))
    assert cache.get(1, 0) is None
    cache.put(1, 1, e(50))
    assert cache.get(1, 1) == e(50)


def test_read_cache_generation_eviction():
    cache = ReadCache(100)  # two generations of 50 bytes
    for eid in range(5):
        cache.put(1, eid, e(10))  # young = 0..4 (50 bytes)
    cache.put(1, 5, e(10))  # young full: 0..4 become old, young = 5
    assert all(cache.get(1, eid) == e(10) for eid in range(6))
    for eid in range(6, 10):
        cache.put(1, eid, e(10))  # young = 5..9
    cache.put(1, 10, e(10))  # old 0..4 dropped, old = 5..9, young = 10
    assert [eid for eid in range(11) if cache.get(1, eid) is not None] == list(range(5, 11))


def test_read_cache_holds_at_most_bytes_max():
    cache = ReadCache(1000)
    for eid in range(500):
        cache.put(7, eid, e(37))
    held = sum(37 for eid in range(500) if cache.get(7, eid) is not None)
    assert 500 <= held <= 1000
    assert cache.get(7, 499) is not None  # the newest is always held


def test_read_cache_discard_runs_forgets_both_generations_and_frees_young_bytes():
    cache = ReadCache(100)  # two generations of 50 bytes
    for eid in range(5):
        cache.put(1, eid, e(10))
    cache.put(1, 5, e(10))  # 0..4 old, 5 young
    cache.put(2, 0, e(10))  # young: 5, (2, 0)
    cache.discard_runs([(1, [(3, b""), (5, b""), (9, b"")]), (2, iter([(0, b"")]))])
    assert [eid for eid in range(6) if cache.get(1, eid) is not None] == [0, 1, 2, 4]
    assert cache.get(2, 0) is None
    for eid in range(10, 15):
        cache.put(1, eid, e(10))  # the discarded entries' bytes are free: all five fit the young generation
    assert [eid for eid in range(6) if cache.get(1, eid) is not None] == [0, 1, 2, 4]
