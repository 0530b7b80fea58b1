"""bookie/cookie.py, the incarnation: old cookies read as 1; a re-initialised bookie (directories holding the next
incarnation's cookie, no ZooKeeper cookie) starts as new with that cookie; every copy must agree on it."""
from __future__ import annotations

import dataclasses
import json

import pytest

from bksim.bookie import cookie as ck
from bksim.bookie.cookie import Cookie
from bksim.model.errors import CookieError

J, L = "/data/b1/journal", "/data/b1/ledgers"
BOOKIE, INSTANCE = "127.0.0.1:3181", "inst-1"
FIRST = Cookie(BOOKIE, INSTANCE, J, L)
SECOND = dataclasses.replace(FIRST, incarnation=2)


def verify(zk=None, jc=None, lc=None, jdata=False, ldata=False):
    return ck.verify(BOOKIE, INSTANCE, (J, L), zk, {J: jc, L: lc}, {J: jdata, L: ldata})


def test_incarnation_round_trips_and_a_cookie_without_it_is_the_first():
    assert FIRST.incarnation == 1
    assert ck.decode(ck.encode(SECOND)) == SECOND
    old = {"bookie_id": BOOKIE, "instance_id": INSTANCE, "journal_dir": J, "ledger_dir": L, "version": 1}
    assert ck.decode(json.dumps(old).encode()) == FIRST


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_a_bad_incarnation_is_not_a_cookie(bad):
    doc = json.loads(ck.encode(FIRST)) | {"incarnation": bad}
    with pytest.raises(CookieError, match=r"/j/COOKIE is not a valid cookie: .*incarnation .* not an integer >= 1"):
        ck.decode(json.dumps(doc).encode(), source="/j/COOKIE")


def test_a_formatted_bookie_starts_as_new_with_the_cookie_its_directories_hold():
    assert verify(jc=SECOND, lc=SECOND) == "new"
    assert ck.cookie_to_write(BOOKIE, INSTANCE, (J, L), {J: SECOND, L: SECOND}) == SECOND
    assert ck.cookie_to_write(BOOKIE, INSTANCE, (J, L), {J: None, L: SECOND}) == SECOND
    assert ck.cookie_to_write(BOOKIE, INSTANCE, (J, L), {J: None, L: None}) == FIRST


def test_next_incarnation_is_one_above_every_known_cookie():
    assert ck.next_incarnation([]) == 1
    assert ck.next_incarnation([None, None]) == 1
    assert ck.next_incarnation([FIRST, None]) == 2
    assert ck.next_incarnation([SECOND, FIRST, dataclasses.replace(FIRST, incarnation=5)]) == 6


def test_the_same_incarnation_everywhere_is_ok():
    assert verify(zk=SECOND, jc=SECOND, lc=SECOND, jdata=True, ldata=True) == "ok"


def test_directories_of_two_incarnations_refuse():
    with pytest.raises(CookieError) as e:
        verify(zk=SECOND, jc=SECOND, lc=FIRST, jdata=True, ldata=True)
    msg = str(e.value)
    assert f"journal directory {J} holds the cookie of incarnation 2 of bookie {BOOKIE}" in msg
    assert f"ledger directory {L} that of incarnation 1" in msg
    with pytest.raises(CookieError, match="one directory was re-initialised"):  # also before ZooKeeper has one
        verify(jc=FIRST, lc=SECOND)


def test_a_formatted_directory_facing_the_old_zookeeper_cookie_refuses():
    with pytest.raises(CookieError) as e:
        verify(zk=FIRST, jc=SECOND, lc=SECOND)
    msg = str(e.value)
    assert f"re-initialised as incarnation 2 of bookie {BOOKIE}, but ZooKeeper still holds the cookie of " \
           f"incarnation 1" in msg
    assert "bksim bookie format --delete-cookie" in msg


def test_a_directory_of_an_earlier_incarnation_refuses():
    with pytest.raises(CookieError) as e:
        verify(zk=SECOND, jc=FIRST, lc=FIRST, jdata=True, ldata=True)
    msg = str(e.value)
    assert "belongs to an earlier incarnation of this bookie" in msg and "NO_ENTRY" in msg


def test_a_wiped_directory_is_still_named_as_wiped_whatever_the_incarnation():
    with pytest.raises(CookieError, match=f"ledger directory {L} has no cookie .* wiped or replaced"):
        verify(zk=SECOND, jc=SECOND, lc=None, jdata=True)
