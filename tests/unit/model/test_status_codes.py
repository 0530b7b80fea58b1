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


def _bksim_classes() -> dict[str, type]:
    import importlib
    import pkgutil

    import bksim
    found: dict[str, type] = {}
    for m in pkgutil.walk_packages(bksim.__path__, "bksim."):
        if m.name.startswith("bksim.gen"):
            continue
        for name, value in vars(importlib.import_module(m.name)).items():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__.startswith("bksim."):
                found.setdefault(value.__name__, value)
    return found


def test_the_error_tree_in_model_errors_is_the_class_tree() -> None:
    """Every class drawn in model/errors.py's docstring derives from the one drawn above it, and every
    BksimError subclass of the package is drawn (or named among the command errors)."""
    import re

    from bksim.model import errors
    from bksim.model.errors import BksimError

    classes = _bksim_classes()
    doc = errors.__doc__
    parents: list[tuple[int, str]] = []
    drawn = set()
    for line in doc.splitlines():
        m = re.match(r"^ {4}([│ ]*)(?:[├└]── )?([A-Za-z]+(?: errors)?)\b", line)
        if not m or not (line.strip().startswith(("BksimError", "├", "└", "│"))):
            continue
        if "──" not in line and not line.strip().startswith("BksimError"):
            continue
        depth, name = len(m.group(1)) // 4 + (1 if "──" in line else 0), m.group(2)
        parents = parents[:depth]
        if name in classes:
            drawn.add(name)
            parent = next((p for _, p in reversed(parents) if p in classes), None)
            assert parent is None or issubclass(classes[name], classes[parent]), (name, parent)
        parents.append((depth, name))
    named = set(re.findall(r"\b([A-Z][A-Za-z]+Error)\b", doc[doc.index("command errors"):]))
    missing = {n for n, c in classes.items() if issubclass(c, BksimError)} - drawn - named
    assert not missing, f"BksimError subclasses not in the tree of model/errors.py: {sorted(missing)}"
    assert {"TopicError", "ZooKeeperError", "ChaosError", "BookieUnreachable"} <= drawn
    from bksim.adapters import bookie_client
    assert not hasattr(bookie_client, "BookieUnavailable")  # one class for a bookie that does not answer
