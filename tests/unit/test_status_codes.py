"""The status enums are the proto enums: same names in the same order (so a member's position is its wire
number), str-valued by name (so the trailer text, log lines and JSON keep the proto names), and the error types
refuse a status they do not know or OK."""
from __future__ import annotations

import json

import pytest

from bksim.client.errors import ClientError
from bksim.gen import bookie_pb2, broker_pb2, topic_pb2
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus, StatusCode, TopicStatus
from bksim.topics.errors import TopicError


@pytest.mark.parametrize("enum, proto", [(LedgerStatus, broker_pb2.LedgerStatus),
                                         (TopicStatus, topic_pb2.TopicStatus)])
def test_str_enums_match_the_proto(enum, proto) -> None:
    assert [m.name for m in enum] == list(proto.keys())
    assert [proto.Value(m) for m in enum] == list(range(len(enum)))
    for m in enum:
        assert m == m.name and str(m) == m.name and f"{m}" == m.name and json.dumps(m) == f'"{m.name}"'


def test_bookie_status_codes_match_the_proto() -> None:
    assert {m.name: m.value for m in StatusCode} == dict(bookie_pb2.StatusCode.items())


def test_errors_carry_enum_members_and_keep_their_text() -> None:
    ledger = LedgerError("FENCED", "ledger 7 is fenced")
    assert ledger.status is LedgerStatus.FENCED and str(ledger) == "FENCED: ledger 7 is fenced"
    topic = TopicError(TopicStatus.NOT_OWNER, "look it up again", owner_address="127.0.0.1:1")
    assert topic.status is TopicStatus.NOT_OWNER and str(topic) == "NOT_OWNER: look it up again"
    client = ClientError("TIMEOUT", "no answer")
    assert client.status is TopicStatus.TIMEOUT and str(client) == "TIMEOUT: no answer"


@pytest.mark.parametrize("make", [lambda s: LedgerError(s, "x"), lambda s: TopicError(s, "x"),
                                  lambda s: ClientError(s, "x")])
@pytest.mark.parametrize("status", ["OK", "NO_SUCH_STATUS"])
def test_errors_refuse_ok_and_unknown_statuses(make, status) -> None:
    with pytest.raises(ValueError):
        make(status)
