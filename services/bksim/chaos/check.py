"""The checks after healing (PROTOCOL.md section 7, Jepsen vocabulary), on what the workload recorded.

Ledgers (`check_ledgers`): every ledger the writers created is read back after the cluster healed.
- A ledger still OPEN (its writer died, or its hand-over failed) is recovered now through a broker (fence,
  recover the tail, close): counted in `recovered_at_end`; one that cannot be brought to CLOSED is `not_closed`.
- Two readers (one per broker) read 0..last_entry_id.
- lost: an acknowledged entry id above last_entry_id (truncated after ack), missing, or whose bytes are not the
  bytes acknowledged for it;
- reordered: an entry read at id i whose payload names another ledger or index j != i, plus every
  AppendResponse whose ids were not the ones expected (`ack_mismatch`);
- divergent: the two readers disagree on an id (different bytes, or one could not read it);
- unconfirmed_present: entries beyond the acknowledged ones that recovery kept (appends whose outcome was
  unknown: allowed, they must still be the right payload at the right id).

Topic (`check_topic`): two subscriptions (Exclusive, from the earliest message) read the whole topic.
- lost: a receipted message (seq) that a reader never received;
- duplicates: a seq at two positions (the namespace has dedup on, so none are documented: any is reported);
- reordered: along the log's positions, a message whose seq is below one already stored (first occurrences);
- divergent: the readers disagree on a position, or a receipt names a position that holds another message.

Fault checks: `broker_fenced` (a broker back from a pause answers NOT_OWNER for the topic: it was fenced and
serves nothing), `check_flip` (an entry log byte flipped on one bookie: that bookie still serves the entry,
with a digest that fails, and every broker reads the acknowledged bytes), `ledger_infos` (metadata for the
fault that picks which stored entry to damage).

Each check returns a dict of counts plus at most FINDINGS_MAX findings (strings) that say which id/position.
Every call has a deadline; a read that fails is a finding (`read_errors`), never silently "no entry".
"""
from __future__ import annotations

import asyncio
import time

from bksim.adapters.broker_client import BrokerCallError, BrokerClient, LedgerInfo
from bksim.chaos.credentials import PLAIN, Credentials
from bksim.chaos.workload import (LEDGER_PASSWORD, TOPIC, LedgerRecord, ledger_payload, parse_ledger_payload,
                                  parse_topic_payload)
from bksim.client import Client, ClientError, InitialPosition, SubscriptionType
from bksim.formats.entry import decode_entry
from bksim.model.errors import FormatError
from bksim.model.status import StatusCode, TopicStatus

FINDINGS_MAX = 50
CALL_DEADLINE_S = 10.0
RECOVER_DEADLINE_S = 60.0
RECOVER_ATTEMPTS = 4  # rounds over the brokers to bring one ledger to CLOSED
TOPIC_READ_TIMEOUT_S = 90.0  # one reader's whole pass over the topic
RECEIVE_IDLE_MS = 1500  # once every receipted message was seen: stop after this long without a message
FENCED_POLL_S = 0.2
MISSING_IDLE_S = 10.0  # some receipted message not seen yet: give up after this long without any message


class Findings(list):
    def add(self, text: str) -> None:
        if len(self) < FINDINGS_MAX:
            self.append(text)


async def _read_all(client: BrokerClient, ledger_id: int, last: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    if last < 0:
        return out
    async for entry_id, payload in client.read_entries(ledger_id, 0, last, password=LEDGER_PASSWORD):
        out[entry_id] = payload
    return out


async def check_ledgers(records: list[LedgerRecord], brokers: list[str], credentials: Credentials = PLAIN) -> dict:
    counts = {"ledgers": len(records), "acknowledged": 0, "lost": 0, "reordered": 0, "divergent": 0,
              "duplicates": 0, "recovered_at_end": 0, "not_closed": 0, "read_errors": 0, "unconfirmed_present": 0,
              "recover_s": []}
    findings = Findings()
    clients = [credentials.broker(a, deadline_s=CALL_DEADLINE_S, recover_deadline_s=RECOVER_DEADLINE_S)
               for a in brokers]
    readers = clients if len(clients) >= 2 else clients * 2
    try:
        for record in records:
            lid = record.ledger_id
            counts["acknowledged"] += len(record.acked)
            counts["reordered"] += record.ack_mismatch
            if record.ack_mismatch:
                findings.add(f"ledger {lid}: {record.ack_mismatch} append response(s) named other entry ids than sent")
            info, error = None, ""
            for attempt in range(RECOVER_ATTEMPTS * len(clients)):
                client = clients[attempt % len(clients)]
                try:
                    info = await client.get_metadata(lid)
                    if info.state != "CLOSED":
                        t = time.monotonic()
                        info, _ = await client.open_ledger(lid, password=LEDGER_PASSWORD, recover=True)
                        counts["recovered_at_end"] += 1
                        counts["recover_s"].append(round(time.monotonic() - t, 3))
                    break
                except BrokerCallError as e:
                    error = f"{client.address}: {e.status}: {e}"
                    info = None
            if info is None or info.state != "CLOSED":
                counts["not_closed"] += 1
                findings.add(f"ledger {lid}: not CLOSED after recovery attempts ({error or info.state})")
                counts["lost"] += len(record.acked)
                continue
            last = info.last_entry_id
            reads: list[dict[int, bytes] | None] = []
            for reader in readers[:2]:
                try:
                    reads.append(await _read_all(reader, lid, last))
                except BrokerCallError as e:
                    counts["read_errors"] += 1
                    findings.add(f"ledger {lid}: read 0..{last} through {reader.address} failed: {e.status}: {e}")
                    reads.append(None)
            first = next((r for r in reads if r is not None), None)
            if first is None:
                counts["lost"] += len(record.acked)
                continue
            for entry_id, index in sorted(record.acked.items()):
                if entry_id > last:
                    counts["lost"] += 1
                    findings.add(f"ledger {lid}: entry {entry_id} acknowledged but the ledger closed at {last} "
                                 "(truncated after ack)")
                elif first.get(entry_id) != ledger_payload(lid, index):
                    counts["lost"] += 1
                    findings.add(f"ledger {lid}: entry {entry_id} acknowledged as index {index} but read back as "
                                 f"{first.get(entry_id, b'<missing>')[:24]!r}")
            for entry_id, data in first.items():
                if parse_ledger_payload(data) != (lid, entry_id):
                    counts["reordered"] += 1
                    findings.add(f"ledger {lid}: entry {entry_id} holds {data[:24]!r}")
                elif entry_id not in record.acked:
                    counts["unconfirmed_present"] += 1
            if len(reads) == 2 and all(r is not None for r in reads) and reads[0] != reads[1]:
                a, b = reads
                for entry_id in sorted(set(a) | set(b)):
                    if a.get(entry_id) != b.get(entry_id):
                        counts["divergent"] += 1
                        findings.add(f"ledger {lid}: entry {entry_id} differs between {readers[0].address} and "
                                     f"{readers[1].address}")
    finally:
        for c in clients:
            await c.close()
    counts["findings"] = list(findings)
    return counts


def _read_topic(client: Client, subscription: str, wanted: set[int], count_max: int,
                missing_idle_s: float) -> tuple[dict, str]:
    """position -> payload as one Exclusive subscription from the earliest message sees the topic."""
    consumer = client.subscribe(TOPIC, subscription, SubscriptionType.Exclusive,
                                initial_position=InitialPosition.Earliest)
    positions: dict[tuple[int, int, int], bytes] = {}
    seen: set[int] = set()
    deadline = time.monotonic() + TOPIC_READ_TIMEOUT_S
    note = ""
    last_message = time.monotonic()
    try:
        while len(positions) < count_max:
            if time.monotonic() >= deadline:
                note = f"{subscription}: stopped after {TOPIC_READ_TIMEOUT_S:.0f} s"
                break
            done = wanted <= seen
            try:
                m = consumer.receive(RECEIVE_IDLE_MS if done else 1_000)
            except ClientError as e:
                if e.status is TopicStatus.TIMEOUT:
                    if done or time.monotonic() - last_message >= missing_idle_s:
                        break  # all seen and drained; or nothing more is coming (the rest is lost)
                    continue
                note = f"{subscription}: {e.status}: {e}"
                break
            last_message = time.monotonic()
            mid = m.message_id()
            positions[(mid.ledger, mid.entry, mid.batch_index)] = m.data()
            seq = parse_topic_payload(m.data())
            if seq is not None:
                seen.add(seq)
            consumer.acknowledge(m)
    finally:
        try:
            consumer.close()
        except ClientError:
            pass
    return positions, note


def check_topic(brokers: list[str], receipts: dict[int, tuple[int, int, int]], duplicate_receipts: set[int],
                sent: int, reader_suffix: str = "", missing_idle_s: float = MISSING_IDLE_S,
                credentials: Credentials = PLAIN) -> dict:
    counts = {"acknowledged": len(receipts) + len(duplicate_receipts), "sent": sent, "lost": 0, "duplicates": 0,
              "reordered": 0, "divergent": 0, "read_errors": 0, "unconfirmed_present": 0}
    findings = Findings()
    wanted = set(receipts) | duplicate_receipts
    with credentials.topic(brokers, operation_timeout_ms=30_000) as client:
        reads = []
        for name in ("reader-a", "reader-b"):
            positions, note = _read_topic(client, name + reader_suffix, wanted, 3 * sent + 100, missing_idle_s)
            if note:
                counts["read_errors"] += 1
                findings.add(note)
            reads.append(positions)
    for name, positions in zip(("reader-a", "reader-b"), reads):
        seqs = {parse_topic_payload(p) for p in positions.values()}
        missing = sorted(wanted - seqs)
        if len(missing) > counts["lost"]:
            counts["lost"] = len(missing)
        if missing:
            findings.add(f"{name}: {len(missing)} receipted message(s) never read, first seqs {missing[:5]}")
    a, b = reads
    by_seq: dict[int, list] = {}
    highest = -1
    for position in sorted(a):
        seq = parse_topic_payload(a[position])
        if seq is None:
            counts["reordered"] += 1
            findings.add(f"position {position} holds {a[position][:20]!r}")
            continue
        first_time = seq not in by_seq
        by_seq.setdefault(seq, []).append(position)
        if first_time:
            if seq < highest:
                counts["reordered"] += 1
                findings.add(f"seq {seq} stored at {position} after seq {highest}")
            highest = max(highest, seq)
            if seq not in wanted:
                counts["unconfirmed_present"] += 1
    for seq, where in by_seq.items():
        if len(where) > 1:
            counts["duplicates"] += 1
            findings.add(f"seq {seq} stored at {len(where)} positions {where[:3]}")
    for position in sorted(set(a) | set(b)):
        if a.get(position) != b.get(position):
            counts["divergent"] += 1
            findings.add(f"position {position}: readers disagree ({a.get(position, b'<none>')[:16]!r} vs "
                         f"{b.get(position, b'<none>')[:16]!r})")
    for seq, position in receipts.items():
        stored = a.get(position)
        if stored is not None and parse_topic_payload(stored) != seq:
            counts["divergent"] += 1
            findings.add(f"receipt of seq {seq} named {position}, which holds {stored[:16]!r}")
    counts["findings"] = list(findings)
    return counts


# ------------------------------------------------------------------------------------------- fault checks
async def ledger_infos(ledger_ids: list[int], brokers: list[str], credentials: Credentials = PLAIN) -> dict[int, LedgerInfo]:
    """Metadata of each ledger (from the first broker that answers); a ledger no broker can describe is left out."""
    out: dict[int, LedgerInfo] = {}
    clients = [credentials.broker(a, deadline_s=CALL_DEADLINE_S) for a in brokers]
    try:
        for lid in ledger_ids:
            for client in clients:
                try:
                    out[lid] = await client.get_metadata(lid)
                    break
                except BrokerCallError:
                    continue
    finally:
        for c in clients:
            await c.close()
    return out


def broker_fenced(address: str, topic: str, timeout_s: float, credentials: Credentials = PLAIN) -> tuple[bool, str]:
    """Wait until the broker at `address` no longer serves `topic`: it answers TopicStats with NOT_OWNER (the
    other broker took the topic over while this one was away). Returns (fenced, what it said)."""
    deadline = time.monotonic() + timeout_s
    with credentials.topic(address, operation_timeout_ms=int(CALL_DEADLINE_S * 1000), reconnect_attempts_max=1) as client:
        while True:
            try:
                client.topic_stats(topic, follow_owner=False)
                said = "it still serves the topic (TopicStats answered)"
            except ClientError as e:
                said = f"{e.status}: {e}"
                if e.status is TopicStatus.NOT_OWNER:
                    return True, said
            if time.monotonic() >= deadline:
                return False, f"after {timeout_s:.0f} s: {said}"
            time.sleep(FENCED_POLL_S)


def single_owner(brokers: list[str], topic: str, timeout_s: float, credentials: Credentials = PLAIN) -> tuple[bool, str]:
    """Wait until exactly one of `brokers` serves `topic` (answers TopicStats) and every other one refuses it
    with NOT_OWNER: the topic is never handed out twice. Returns (settled, the owner or what the brokers said)."""
    deadline = time.monotonic() + timeout_s
    clients = [credentials.topic(a, operation_timeout_ms=int(CALL_DEADLINE_S * 1000), reconnect_attempts_max=1)
               for a in brokers]
    try:
        while True:
            serving, said = [], []
            for client in clients:
                address = client.addresses[0]
                try:
                    client.topic_stats(topic, follow_owner=False)
                    serving.append(address)
                except ClientError as e:
                    if e.status is not TopicStatus.NOT_OWNER:
                        said.append(f"{address}: {e.status}")
            if len(serving) == 1 and not said:
                return True, serving[0]
            if time.monotonic() >= deadline:
                return False, (f"after {timeout_s:.0f} s: serving it: {', '.join(serving) or 'none'}"
                               + (f"; {', '.join(said)}" if said else ""))
            time.sleep(FENCED_POLL_S)
    finally:
        for client in clients:
            client.close()


def load_topic(brokers: list[str], topic: str, timeout_s: float, credentials: Credentials = PLAIN) -> tuple[bool, str]:
    """Ask `brokers` in turn for the topic's stats until one answers: a broker asked for a topic nobody owns
    takes it over (recovers and fences the previous owner's ledger). Returns (done, which broker or why not)."""
    deadline = time.monotonic() + timeout_s
    said = "no broker to ask"
    clients = [credentials.topic(a, operation_timeout_ms=int(CALL_DEADLINE_S * 1000), reconnect_attempts_max=1)
               for a in brokers]
    try:
        while clients:
            for client in clients:
                try:
                    client.topic_stats(topic, follow_owner=False)
                    return True, client.addresses[0]
                except ClientError as e:
                    said = f"{client.addresses[0]}: {e.status}: {e}"
            if time.monotonic() >= deadline:
                break
            time.sleep(FENCED_POLL_S)
        return False, said
    finally:
        for client in clients:
            client.close()


def check_flip(bookie_address: str, brokers: list[str], flip, credentials: Credentials = PLAIN) -> list[str]:
    """A flipped entry-log byte (chaos.disk.Flip): the bookie still serves the entry (never "no entry") with
    the damaged bytes, whose digest fails; every broker reads the acknowledged payload (it failed over)."""
    problems = []
    bookie = credentials.sync_bookie(bookie_address, deadline_s=CALL_DEADLINE_S)
    try:
        got = bookie.read_entry(flip.ledger_id, flip.entry_id)
    except Exception as e:  # noqa: BLE001 - reported as what it is
        got = None
        problems.append(f"direct read from the bookie failed: {type(e).__name__}: {e}")
    finally:
        bookie.close()
    if got is not None:
        if got.status is not StatusCode.OK:
            problems.append(f"the bookie answered {got.status.name} for its damaged copy (expected OK with bad bytes)")
        elif got.entry != flip.corrupted:
            problems.append("the bookie served other bytes than the damaged copy (the flip did not take)")
        else:
            try:
                decode_entry(got.entry, ledger_id=flip.ledger_id, entry_id=flip.entry_id)
                problems.append("the damaged copy passes its digest check")
            except FormatError:
                pass
    expected = decode_entry(flip.original, ledger_id=flip.ledger_id, entry_id=flip.entry_id).payload

    async def read_all() -> None:
        for address in brokers:
            async with credentials.broker(address, deadline_s=CALL_DEADLINE_S) as client:
                try:
                    got = [p async for _, p in client.read_entries(flip.ledger_id, flip.entry_id, flip.entry_id,
                                                                   password=LEDGER_PASSWORD)]
                except BrokerCallError as e:
                    problems.append(f"read through {address} failed: {e.status}: {e}")
                    continue
                if got != [expected]:
                    problems.append(f"read through {address} returned {[g[:24] for g in got]!r}, not the "
                                    f"acknowledged payload")
    asyncio.run(read_all())
    return problems


MISSING_COPY_RULES = ("below_ack_quorum", "under_replicated", "gap")


def judge_truncation(report: dict, lost: dict[str, set[tuple[int, int]]]) -> tuple[list[str], dict]:
    """The audit after journals were truncated into synced records (`lost`: bookie id -> the (ledger, entry)
    copies the cut removed): every violation must be a missing copy on that bookie of an entry the cut removed
    (or the cut itself, `torn_tail_below_checkpoint`, on that bookie); anything else is a problem. Reported
    findings (under-replication: normal after any kill -9, as in every other scenario) are not problems; those
    naming removed copies are counted. Returns (problems, figures)."""
    problems: list[str] = []
    figures = {"removed_copies": sum(len(c) for c in lost.values()), "reported_missing": 0, "below_checkpoint": 0}
    for kind, f in [(kind, f) for kind in ("violations", "reported") for f in report.get(kind, [])]:
        rule = f.get("rule")
        if rule == "torn_tail_below_checkpoint" and f.get("bookie") in lost:
            figures["below_checkpoint"] += 1
            continue
        missing = f.get("missing") or []
        ids = [(f.get("ledger"), e) for e in range(f.get("first_entry", 0), f.get("last_entry", -1) + 1)]
        if (rule in MISSING_COPY_RULES and len(missing) == 1 and missing[0] in lost
                and ids and all(i in lost[missing[0]] for i in ids)):
            figures["reported_missing"] += len(ids)
        elif kind == "violations" and len(problems) < FINDINGS_MAX:
            problems.append(f"audit {rule} ledger {f.get('ledger')} entries {f.get('first_entry')}.."
                            f"{f.get('last_entry')} missing on {missing or '-'} bookie {f.get('bookie', '-')}: not "
                            f"a copy the truncation removed")
    counted = sum(c.get("findings", 0) for c in report.get("rule_counts", {}).values() if c.get("class") == "violation")
    if counted > len(report.get("violations", [])):
        problems.append(f"the report lists {len(report.get('violations', []))} of its {counted} violations: the rest "
                        f"cannot be judged")
    return problems, figures


def check_security(cluster) -> list[str]:
    """A secured cluster (`--secure`) refuses what it must: a topic call without a token (UNAUTHENTICATED), a
    plaintext call to a broker (no TLS handshake), an anonymous ZooKeeper read of /ledgers (NoAuth). The
    problems found (empty: every refusal seen)."""
    from kazoo.exceptions import NoAuthError

    from bksim.adapters.zk_client import new_client

    problems = []
    address = cluster.brokers[0].address
    # the token-less call must reach the broker and be refused there; the plaintext one must not get an answer
    for label, creds, wanted in (("no token", Credentials(cluster.credentials.tls, None), TopicStatus.UNAUTHENTICATED),
                                 ("plaintext", Credentials(None, cluster.credentials.token), None)):
        with creds.topic(address, operation_timeout_ms=int(CALL_DEADLINE_S * 1000), reconnect_attempts_max=1) as c:
            try:
                c.list_tenants()
                problems.append(f"{label}: the broker at {address} answered ListTenants")
            except ClientError as e:
                if wanted is not None and e.status is not wanted:
                    problems.append(f"{label}: the broker answered {e.status.name}, expected {wanted.name}")
                if wanted is None and e.status in (TopicStatus.UNAUTHENTICATED, TopicStatus.PERMISSION_DENIED):
                    problems.append(f"{label}: the broker answered {e.status.name} over plaintext")
    zk = new_client(",".join(z.connect for z in cluster.zookeepers), timeout=CALL_DEADLINE_S)
    try:
        zk.start(timeout=CALL_DEADLINE_S)
        try:
            zk.get_children("/ledgers")
            problems.append("an anonymous ZooKeeper client listed /ledgers")
        except NoAuthError:
            pass
    finally:
        zk.stop()
        zk.close()
    return problems
