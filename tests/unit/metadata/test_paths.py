"""The ZooKeeper layout (PROTOCOL.md §3): ledger paths in both forms, parsing back, the other builders."""
from __future__ import annotations

import pytest

from bksim.metadata import paths
from bksim.metadata.paths import (LEDGER_ID_MAX, SHORT_LEDGER_ID_LIMIT, ledger_id_from_idgen_path,
                                  ledger_id_from_path, ledger_path)


@pytest.mark.parametrize("ledger_id, path", [
    (0, "/ledgers/00/0000/L0000"),
    (16, "/ledgers/00/0000/L0016"),
    (123456789, "/ledgers/01/2345/L6789"),
    (2**31 - 1, "/ledgers/21/4748/L3647"),
    (2**31, "/ledgers/21/4748/L3648"),  # (bksim) still short: BookKeeper switches to the long form here
    (SHORT_LEDGER_ID_LIMIT - 1, "/ledgers/99/9999/L9999"),
    (SHORT_LEDGER_ID_LIMIT, "/ledgers/000/0000/0100/0000/L0000"),
    (1234567890123456789, "/ledgers/123/4567/8901/2345/L6789"),
    (LEDGER_ID_MAX, "/ledgers/922/3372/0368/5477/L5807"),
])
def test_ledger_path_round_trips(ledger_id, path):
    assert ledger_path(ledger_id) == path
    assert ledger_id_from_path(path) == ledger_id


@pytest.mark.parametrize("bad", [-1, LEDGER_ID_MAX + 1, True, 1.0, "16", None])
def test_ledger_path_refuses_what_is_not_a_ledger_id(bad):
    with pytest.raises(ValueError):
        ledger_path(bad)


@pytest.mark.parametrize("path", [
    "/ledgers/00/0000/0016",  # no L
    "/ledgers/00/0000/L016",  # short leaf
    "/ledgers/0/0000/L0016",
    "/ledgers/00/0000",
    "/ledgers/00/0000/L0016/x",
    "/other/00/0000/L0016",
    "/ledgers/000/0000/0000/0000/L0016",  # the long form of a short id: not canonical
    "/ledgers/999/9999/9999/9999/L9999",  # beyond 2^63 - 1
    "/ledgers/aa/0000/L0016",
    "/ledgers/available/127.0.0.1:3181",
    "/ledgers/INSTANCEID",
])
def test_ledger_id_from_path_refuses_other_paths(path):
    with pytest.raises(ValueError):
        ledger_id_from_path(path)


def test_idgen_paths():
    assert paths.IDGEN_PREFIX == "/ledgers/idgen/ID-"
    assert ledger_id_from_idgen_path("/ledgers/idgen/ID-0000000042") == 42
    for bad in ("/ledgers/idgen/ID--2147483648", "/ledgers/idgen/ID-42", "/ledgers/idgen/X-0000000042",
                "/ledgers/other/ID-0000000042"):
        with pytest.raises(ValueError):
            ledger_id_from_idgen_path(bad)
    assert paths.sequence_number("/a/b/0000000007") == 7


def test_registration_and_later_paths():
    assert paths.LEDGERS_ROOT == "/ledgers"
    assert paths.INSTANCEID == "/ledgers/INSTANCEID"
    assert paths.bookie_path("127.0.0.1:3181") == "/ledgers/available/127.0.0.1:3181"
    assert paths.bookie_path("127.0.0.1:3181", read_only=True) == "/ledgers/available/readonly/127.0.0.1:3181"
    assert paths.cookie_path("127.0.0.1:3181") == "/ledgers/cookies/127.0.0.1:3181"
    assert paths.broker_path("broker-1") == "/brokers/available/broker-1"
    assert paths.managed_ledger_path("t", "ns", "topic") == "/managed-ledgers/t/ns/persistent/topic"
    assert paths.cursor_path("t", "ns", "topic", "sub") == "/managed-ledgers/t/ns/persistent/topic/sub"
    assert paths.ownership_path("t", "ns", "topic") == "/ownership/t/ns/topic"
    for bad in ("", "a/b", ".", "..", "a\0b"):
        with pytest.raises(ValueError):
            paths.broker_path(bad)
    with pytest.raises(ValueError):
        paths.bookie_path("readonly")  # that name is the read-only directory
