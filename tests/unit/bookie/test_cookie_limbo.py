"""bookie/cookie.py, limbo: the bound a format records, how old cookies read, and that every copy agrees on it."""
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
FORMATTED = dataclasses.replace(FIRST, incarnation=2, limbo_ledger_id_max=41)


def verify(zk=None, jc=None, lc=None):
    return ck.verify(BOOKIE, INSTANCE, (J, L), zk, {J: jc, L: lc}, {J: False, L: False})


def test_the_bound_round_trips_and_decides_which_ledgers_are_in_limbo():
    assert ck.decode(ck.encode(FORMATTED)) == FORMATTED
    assert [FORMATTED.in_limbo(i) for i in (0, 41, 42)] == [True, True, False]
    assert FIRST.limbo_ledger_id_max == ck.NO_LIMBO and not FIRST.in_limbo(0)


def test_a_cookie_without_the_bound_reads_as_no_limbo_when_first_and_every_ledger_when_re_initialised():
    doc = {"bookie_id": BOOKIE, "instance_id": INSTANCE, "journal_dir": J, "ledger_dir": L, "version": 1}
    assert ck.decode(json.dumps(doc).encode()).limbo_ledger_id_max == ck.NO_LIMBO
    old_format = ck.decode(json.dumps(doc | {"incarnation": 2}).encode())
    assert old_format.limbo_ledger_id_max == ck.LIMBO_EVERY_LEDGER and old_format.in_limbo(2**62)


@pytest.mark.parametrize("bad", [-2, "5", 1.5, None, 2**63])
def test_a_bad_bound_is_not_a_cookie(bad):
    doc = json.loads(ck.encode(FORMATTED)) | {"limbo_ledger_id_max": bad}
    with pytest.raises(CookieError, match=r"/j/COOKIE is not a valid cookie: .*limbo_ledger_id_max .* is not an "
                                          r"integer in \[-1, 9223372036854775807\]"):
        ck.decode(json.dumps(doc).encode(), source="/j/COOKIE")


def test_a_first_incarnation_has_nothing_in_limbo():
    with pytest.raises(CookieError, match="a first incarnation has nothing in limbo, but limbo_ledger_id_max is 7"):
        dataclasses.replace(FIRST, limbo_ledger_id_max=7)


def test_every_copy_must_agree_on_the_bound():
    edited = dataclasses.replace(FORMATTED, limbo_ledger_id_max=3)
    assert verify(zk=FORMATTED, jc=FORMATTED, lc=FORMATTED) == "ok"
    with pytest.raises(CookieError, match=f"journal directory {J} records limbo_ledger_id_max 3 for incarnation 2 .* "
                                          f"ZooKeeper's cookie records 41: a cookie was edited"):
        verify(zk=FORMATTED, jc=edited, lc=edited)
    with pytest.raises(CookieError, match="hold cookies of incarnation 2 of bookie .* with different "
                                          r"limbo_ledger_id_max \(41, 3\)"):
        verify(jc=FORMATTED, lc=edited)
    # the formatted bookie's first start writes the directories' cookie, bound included, to ZooKeeper
    assert verify(jc=FORMATTED, lc=FORMATTED) == "new"
    assert ck.cookie_to_write(BOOKIE, INSTANCE, (J, L), {J: FORMATTED, L: FORMATTED}) == FORMATTED
