"""bookie/cookie.py: encoding and every start-up verdict (new, ok, and each reason to refuse)."""
from __future__ import annotations

import pytest

from bksim.bookie import cookie as ck
from bksim.bookie.cookie import Cookie
from bksim.model.errors import CookieError

J, L = "/data/b1/journal", "/data/b1/ledgers"
BOOKIE, INSTANCE = "127.0.0.1:3181", "inst-1"
MINE = Cookie(BOOKIE, INSTANCE, J, L)


def verify(zk=None, jc=None, lc=None, jdata=False, ldata=False, bookie=BOOKIE, instance=INSTANCE, dirs=(J, L)):
    return ck.verify(bookie, instance, dirs, zk, {dirs[0]: jc, dirs[1]: lc}, {dirs[0]: jdata, dirs[1]: ldata})


def test_encode_decode_round_trip():
    data = ck.encode(MINE)
    assert isinstance(data, bytes)
    assert ck.decode(data) == MINE
    assert ck.cookie_path(J) == J + "/COOKIE"


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe", "not a valid cookie"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"version": 7}', "version 7"),
    (b'{"version": 1, "bookie_id": "b"}', "'instance_id' missing"),
    (b'{"version": 1, "bookie_id": "b", "instance_id": "", "journal_dir": "j", "ledger_dir": "l"}', "empty instance id"),
])
def test_decode_rejects_garbage(data, words):
    with pytest.raises(CookieError, match=words):
        ck.decode(data, source="ledger directory COOKIE")


def test_fresh_bookie_is_new():
    assert verify() == "new"


def test_same_directory_for_journal_and_ledgers():
    assert ck.verify(BOOKIE, INSTANCE, (J, J), None, {J: None}, {J: False}) == "new"
    same = Cookie(BOOKIE, INSTANCE, J, J)
    assert ck.verify(BOOKIE, INSTANCE, (J, J), same, {J: same}, {J: True}) == "ok"


def test_unfinished_first_start_is_new():
    # dir cookies written, crash before the ZooKeeper cookie: nothing was ever served
    assert verify(jc=MINE, lc=MINE) == "new"
    assert verify(jc=MINE, lc=None) == "new"


def test_all_agree_is_ok():
    assert verify(zk=MINE, jc=MINE, lc=MINE, jdata=True, ldata=True) == "ok"


@pytest.mark.parametrize("which", ["journal", "ledger"])
def test_wiped_directory_refuses(which):
    kwargs = dict(zk=MINE, jc=MINE, lc=MINE, jdata=True, ldata=True)
    kwargs["jc" if which == "journal" else "lc"] = None
    kwargs["jdata" if which == "journal" else "ldata"] = False
    with pytest.raises(CookieError) as e:
        verify(**kwargs)
    msg = str(e.value)
    assert f"{which} directory {J if which == 'journal' else L} has no cookie" in msg
    assert "ZooKeeper has one for bookie 127.0.0.1:3181" in msg
    assert "wiped or replaced" in msg and "NO_ENTRY" in msg


def test_both_directories_wiped_refuses():
    with pytest.raises(CookieError, match="wiped or replaced"):
        verify(zk=MINE)


def test_swapped_directories_refuse():
    other = Cookie("127.0.0.1:3182", INSTANCE, "/data/b2/journal", "/data/b2/ledgers")
    with pytest.raises(CookieError) as e:
        verify(zk=MINE, jc=MINE, lc=other, jdata=True, ldata=True)
    msg = str(e.value)
    assert f"ledger directory {L} holds the cookie of bookie 127.0.0.1:3182, not of bookie {BOOKIE}" in msg
    assert "swapped" in msg


def test_swapped_directories_refuse_even_without_zookeeper_cookie():
    other = Cookie("127.0.0.1:3182", INSTANCE, J, L)
    with pytest.raises(CookieError, match="holds the cookie of bookie 127.0.0.1:3182"):
        verify(zk=None, jc=other, lc=other, jdata=True, ldata=True)


def test_directory_of_another_cluster_refuses():
    foreign = Cookie(BOOKIE, "inst-OTHER", J, L)
    with pytest.raises(CookieError, match="cluster instance inst-OTHER.*another cluster"):
        verify(zk=MINE, jc=foreign, lc=MINE, jdata=True, ldata=True)


def test_moved_directories_refuse():
    moved = Cookie(BOOKIE, INSTANCE, "/elsewhere/journal", L)
    with pytest.raises(CookieError, match="journal_dir=/elsewhere/journal.*moved"):
        verify(zk=MINE, jc=moved, lc=moved, jdata=True, ldata=True)


def test_reconfigured_directories_refuse_when_zookeeper_disagrees():
    # the directories were copied with their cookies edited; ZooKeeper still records the old paths
    new_dirs = ("/new/journal", "/new/ledgers")
    copied = Cookie(BOOKIE, INSTANCE, *new_dirs)
    with pytest.raises(CookieError, match="ZooKeeper's cookie .* records journal_dir=/data/b1/journal"):
        verify(zk=MINE, jc=copied, lc=copied, jdata=True, ldata=True, dirs=new_dirs)


def test_zookeeper_lost_cookie_while_directories_have_data_refuses():
    with pytest.raises(CookieError) as e:
        verify(zk=None, jc=MINE, lc=MINE, jdata=True, ldata=True)
    msg = str(e.value)
    assert "ZooKeeper has no cookie for bookie 127.0.0.1:3181" in msg
    assert "ZooKeeper lost the cookie" in msg


def test_non_empty_directories_without_cookie_refuse():
    with pytest.raises(CookieError) as e:
        verify(zk=None, ldata=True)
    assert f"ledger directory {L} is not empty but has no cookie" in str(e.value)


def test_zookeeper_cookie_of_another_instance_refuses():
    stale = Cookie(BOOKIE, "inst-OLD", J, L)
    with pytest.raises(CookieError, match="instance inst-OLD, but /ledgers/INSTANCEID is inst-1"):
        verify(zk=stale, jc=stale, lc=stale, jdata=True, ldata=True)


def test_zookeeper_cookie_naming_another_bookie_refuses():
    wrong = Cookie("127.0.0.1:9999", INSTANCE, J, L)
    with pytest.raises(CookieError, match="names bookie 127.0.0.1:9999"):
        verify(zk=wrong, jc=MINE, lc=MINE, jdata=True, ldata=True)


def test_swapped_ledger_directory_is_named_as_another_bookies_not_as_moved():
    # bookie A restarted with its own journal but B's ledger directory: A's journal cookie records A's old
    # ledger path (a "moved" mismatch), but the more specific diagnosis is B's cookie in the ledger dir
    b_ledgers = "/data/b2/ledgers"
    theirs = Cookie("127.0.0.1:3182", INSTANCE, "/data/b2/journal", b_ledgers)
    with pytest.raises(CookieError, match=f"ledger directory {b_ledgers} holds the cookie of bookie 127.0.0.1:3182"):
        verify(zk=MINE, jc=MINE, lc=theirs, jdata=True, ldata=True, dirs=(J, b_ledgers))
