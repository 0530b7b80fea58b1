"""`bksim tenant|namespace|topic|produce|consume|read`: the topic layer from the command line, over bksim.client.

    bksim tenant create NAME [--admin-roles R1,R2] | list   (get, set-admin-roles: cli/security_cmd.py)
    bksim namespace create TENANT/NS [--retention MS|-1] [--retention-bytes B|-1] [--ttl MS] [--dedup|--no-dedup]
    bksim namespace get TENANT/NS | list TENANT
    bksim namespace set-backlog-quota TENANT/NS (--limit-size BYTES | --limit-time MS) --policy POLICY
    bksim namespace get-backlog-quotas TENANT/NS | remove-backlog-quota TENANT/NS [--type TYPE]
    bksim topic create TOPIC [--partitions N] | list TENANT/NS | delete TOPIC [--force] | lookup TOPIC
    bksim topic stats TOPIC | stats-internal TOPIC
    bksim produce TOPIC -m MSG [-m ...] [--separator ,] [--file F ...] [--count N] [--rate R] [--key K] [-p k=v ...]
                  [--deliver-after MS]
    bksim consume TOPIC -s SUB [--type Exclusive|Failover|Shared|Key_Shared] [-n N] [--position earliest|latest]
                  [--hex] [--timeout S] [--sticky-range START-END ...]
    bksim read TOPIC [--start-message-id ID | --earliest | --latest] [--inclusive] [-n N] [--hex] [--timeout S]

Every command talks to the brokers named by `--broker HOST:PORT` (repeatable or comma-separated; any broker
answers admin calls and lookups, the client follows redirects to a topic's owner); default: the brokers
`bksim cluster up` starts, <broker.host>:<cluster.broker_port_base + i> for i < cluster.brokers. Brokers that
require a token get the one of `--token-file FILE`, else $BKSIM_TOKEN, else security.token_file. `--json`
prints data as JSON (one object; `consume` prints one object per message, one per line). A refusal prints
`bksim: error: <TopicStatus>: <the broker's text>` and exits 2.

`consume` prints each message like pulsar-client ("----- got message -----", then key, properties and
content) and acknowledges it; `-n 0` consumes until interrupted. `produce` sends every message `--count` times
(at most `--rate` messages/s; 0 = as fast as the producer's pending bound allows) and waits for every receipt;
on a terminal, without --json, a status line on stderr counts the receipts (rate, ETA; cli/progress.py).
`read` prints messages as `consume` does, through a reader (a non-durable cursor: nothing is acknowledged and
nothing stays on the broker) from a message id as `consume --json` prints it (LEDGER:ENTRY[:PARTITION[:BATCH]];
the message after it, or that message with --inclusive), or the earliest or latest (default) message.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
import time

from bksim.cli import config as cfgload
from bksim.cli.progress import Progress
from bksim.model.errors import BksimError
from bksim.model.status import TopicStatus

CONSUME_POLL_MS = 500  # consume waits for messages in steps this long (so Ctrl-C is prompt)
PRODUCE_IDS_SHOWN = 10  # `produce --json` lists at most this many message ids
CONTENT_PREVIEW_MAX = 1 << 20  # consume prints at most this many bytes of a payload
QUOTA_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")


class TopicCommandError(BksimError):
    """A `bksim tenant/namespace/topic/produce/consume` argument problem (not a broker refusal)."""


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    common.add_argument("--broker", action="append", metavar="HOST:PORT",
                        help="broker(s) to ask (repeatable or comma-separated; default: the brokers of "
                             "`bksim cluster up`, <broker.host>:<cluster.broker_port_base + i>)")
    common.add_argument("--json", action="store_true", help="print JSON")
    common.add_argument("--token-file", default=argparse.SUPPRESS, metavar="FILE",
                        help="file of the token to present (default: $BKSIM_TOKEN, then security.token_file)")

    tenant = subparsers.add_parser("tenant", help="create and list tenants")
    fam = tenant_family = tenant.add_subparsers(dest="tenant_command", required=True)
    p = fam.add_parser("create", parents=[common], help="create a tenant")
    p.add_argument("tenant")
    p.add_argument("--admin-roles", default="", metavar="R1,R2",
                   help="comma-separated roles that administer the tenant (namespaces, topics, grants)")
    p.set_defaults(func=cmd_tenant_create)
    p = fam.add_parser("list", parents=[common], help="list the tenants")
    p.set_defaults(func=cmd_tenant_list)

    ns = subparsers.add_parser("namespace", help="create, show and list namespaces (retention, TTL, dedup)")
    fam = namespace_family = ns.add_subparsers(dest="namespace_command", required=True)
    p = fam.add_parser("create", parents=[common], help="create TENANT/NS with its policies")
    p.add_argument("namespace", metavar="TENANT/NS")
    p.add_argument("--retention", type=int, default=0, metavar="MS",
                   help="keep acknowledged messages this long (ms; -1 = forever; default 0 = trim once consumed)")
    p.add_argument("--retention-bytes", type=int, default=-1, metavar="BYTES",
                   help="... or while the topic is under this size (-1 = no size limit, the default)")
    p.add_argument("--ttl", type=int, default=0, metavar="MS",
                   help="acknowledge messages older than this automatically (ms; default 0 = off)")
    p.add_argument("--dedup", action=argparse.BooleanOptionalAction, default=False,
                   help="drop messages whose (producer name, sequence id) was already persisted (default off)")
    p.set_defaults(func=cmd_namespace_create)
    p = fam.add_parser("get", parents=[common], help="a namespace's policies")
    p.add_argument("namespace", metavar="TENANT/NS")
    p.set_defaults(func=cmd_namespace_get)
    p = fam.add_parser("list", parents=[common], help="the namespaces of a tenant")
    p.add_argument("tenant")
    p.set_defaults(func=cmd_namespace_list)
    p = fam.add_parser("set-backlog-quota", parents=[common],
                       help="limit each topic's backlog by size or by the age of its oldest message")
    p.add_argument("namespace", metavar="TENANT/NS")
    limit = p.add_mutually_exclusive_group(required=True)
    limit.add_argument("--limit-size", type=int, metavar="BYTES", help="destination_storage quota: backlog bytes")
    limit.add_argument("--limit-time", type=int, metavar="MS",
                       help="message_age quota: age of the oldest unacknowledged message (ms)")
    p.add_argument("--policy", required=True, choices=QUOTA_POLICIES,
                   help="what happens over the limit: sends wait, sends fail, or the slowest subscriptions skip")
    p.set_defaults(func=cmd_namespace_set_backlog_quota)
    p = fam.add_parser("get-backlog-quotas", parents=[common], help="a namespace's backlog quotas")
    p.add_argument("namespace", metavar="TENANT/NS")
    p.set_defaults(func=cmd_namespace_get_backlog_quotas)
    p = fam.add_parser("remove-backlog-quota", parents=[common], help="remove a namespace's backlog quota")
    p.add_argument("namespace", metavar="TENANT/NS")
    p.add_argument("--type", default="destination_storage", choices=("destination_storage", "message_age"),
                   help="which quota (default destination_storage)")
    p.set_defaults(func=cmd_namespace_remove_backlog_quota)

    topic = subparsers.add_parser("topic", help="create, list, delete, look up topics and show their stats")
    fam = topic_family = topic.add_subparsers(dest="topic_command", required=True)
    p = fam.add_parser("create", parents=[common], help="create a topic (persistent://tenant/ns/name)")
    p.add_argument("topic")
    p.add_argument("--partitions", type=_non_negative, default=0, metavar="N",
                   help="partitions (default 0: non-partitioned)")
    p.set_defaults(func=cmd_topic_create)
    p = fam.add_parser("list", parents=[common], help="the topics of a namespace (partitioned topics once)")
    p.add_argument("namespace", metavar="TENANT/NS")
    p.set_defaults(func=cmd_topic_list)
    p = fam.add_parser("delete", parents=[common], help="delete a topic (all its partitions) and its ledgers")
    p.add_argument("topic")
    p.add_argument("--force", action="store_true", help="also when it has subscriptions")
    p.set_defaults(func=cmd_topic_delete)
    p = fam.add_parser("lookup", parents=[common], help="the broker that owns a topic (each partition)")
    p.add_argument("topic")
    p.set_defaults(func=cmd_topic_lookup)
    p = fam.add_parser("stats", parents=[common], help="rates, backlog, producers, subscriptions, consumers (JSON)")
    p.add_argument("topic")
    p.set_defaults(func=cmd_topic_stats, internal=False)
    p = fam.add_parser("stats-internal", parents=[common],
                       help="ledgers and cursors (mark-delete, read position, acked ranges, batch indexes) (JSON)")
    p.add_argument("topic")
    p.set_defaults(func=cmd_topic_stats, internal=True)
    from bksim.cli.security_cmd import register_permissions
    register_permissions(tenant_family, namespace_family, topic_family, common)

    p = subparsers.add_parser("produce", parents=[common], help="publish messages to a topic")
    p.add_argument("topic")
    p.add_argument("-m", "--messages", action="append", default=[], metavar="MSG",
                   help="message(s) to send (repeatable; each split on --separator)")
    p.add_argument("-s", "--separator", default=",", help="splits each -m value (default ','; '' = no split)")
    p.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                   help="send a file's content as one message (repeatable)")
    p.add_argument("-n", "--count", type=_positive, default=1, metavar="N", help="send every message N times (default 1)")
    p.add_argument("-r", "--rate", type=float, default=0.0, metavar="R",
                   help="messages per second (default 0: as fast as possible)")
    p.add_argument("-k", "--key", help="key of every message (routes to a partition, Key_Shared order)")
    p.add_argument("-p", "--property", action="append", default=[], metavar="K=V",
                   help="a property of every message (repeatable, or K=V,K2=V2)")
    p.add_argument("--producer-name", help="a stable producer name (dedup continues after its last sequence id)")
    p.add_argument("--no-batching", action="store_true", help="one entry per message")
    p.add_argument("--deliver-after", type=_non_negative, default=0, metavar="MS",
                   help="delayed delivery: Shared and Key_Shared subscriptions get each message only MS ms after "
                        "it is sent (Exclusive and Failover at once); delayed messages are never batched")
    p.set_defaults(func=cmd_produce)

    p = subparsers.add_parser("consume", parents=[common], help="receive (and acknowledge) messages of a subscription")
    p.add_argument("topic")
    p.add_argument("-s", "--subscription", required=True, help="subscription name")
    p.add_argument("-t", "--type", default="Exclusive", metavar="TYPE",
                   help="Exclusive (default), Failover, Shared or Key_Shared")
    p.add_argument("-n", "--num-messages", type=_non_negative, default=1, metavar="N",
                   help="messages to consume (default 1; 0 = until interrupted)")
    p.add_argument("-p", "--position", choices=("earliest", "latest"), default="latest",
                   help="where a new subscription starts (default latest)")
    p.add_argument("--consumer-name", help="consumer name (Failover orders consumers by priority, then name)")
    p.add_argument("--priority", type=int, default=0, help="Failover: lower is preferred (default 0)")
    p.add_argument("--sticky-range", action="append", type=_hash_range, default=[], metavar="START-END",
                   help="Key_Shared sticky mode: take the keys whose slot (murmur3_32(key) mod 65536) is in "
                        "[START, END] (repeatable)")
    p.add_argument("--hex", action="store_true", help="print content as a hex dump")
    p.add_argument("--hide-content", action="store_true", help="do not print the content")
    p.add_argument("--timeout", type=float, default=0.0, metavar="S",
                   help="give up when no message came for S seconds (default 0: wait)")
    p.set_defaults(func=cmd_consume)

    p = subparsers.add_parser("read", parents=[common], help="read messages through a reader (no subscription kept)")
    p.add_argument("topic")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-m", "--start-message-id", metavar="ID",
                       help="LEDGER:ENTRY[:PARTITION[:BATCH]] (as consume --json prints it): read after it")
    where.add_argument("--earliest", action="store_true", help="from the earliest message")
    where.add_argument("--latest", action="store_true", help="from the next message published (the default)")
    p.add_argument("--inclusive", action="store_true",
                   help="also the start message itself (with --latest: the last message)")
    p.add_argument("-n", "--count", type=_non_negative, default=1, metavar="N",
                   help="messages to read (default 1; 0 = until interrupted)")
    p.add_argument("--hex", action="store_true", help="print content as a hex dump")
    p.add_argument("--hide-content", action="store_true", help="do not print the content")
    p.add_argument("--timeout", type=float, default=0.0, metavar="S",
                   help="give up when no message came for S seconds (default 0: wait)")
    p.set_defaults(func=cmd_read)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _hash_range(text: str) -> tuple[int, int]:
    try:
        start, end = (int(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a hash range is START-END (0..65535), not {text!r}") from None
    return start, end


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def broker_addresses(args) -> list[str]:
    """--broker values (comma-separated allowed), else the brokers of the configured cluster."""
    if args.broker:
        return [a.strip() for value in args.broker for a in value.split(",") if a.strip()]
    config = cfgload.load(getattr(args, "config", None))
    base = config.cluster.broker_port_base
    return [f"{config.broker.host}:{base + i}" for i in range(max(1, config.cluster.brokers))]


def _client(args):
    from bksim.cli.security_cmd import client_token
    from bksim.client import Client
    from bksim.security.tls import channel_security

    return Client(broker_addresses(args), tls=channel_security(cfgload.load(getattr(args, "config", None)).security),
                  token=client_token(args))


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- tenants and namespaces -------------------------------------------------------------------------------------

def cmd_tenant_create(args) -> int:
    with _client(args) as c:
        c.create_tenant(args.tenant, [r.strip() for r in args.admin_roles.split(",") if r.strip()])
    if args.json:
        _print_json({"tenant": args.tenant, "created": True})
    else:
        print(f"tenant {args.tenant} created")
    return 0


def cmd_tenant_list(args) -> int:
    with _client(args) as c:
        tenants = c.list_tenants()
    if args.json:
        _print_json(tenants)
    else:
        print("\n".join(tenants) if tenants else "(no tenants)")
    return 0


def _policies_text(p: dict) -> str:
    retention = "forever" if p["retention_ms"] < 0 else f"{p['retention_ms']} ms"
    size = "no size limit" if p["retention_bytes"] < 0 else f"{p['retention_bytes']} bytes"
    ttl = "off" if p["ttl_ms"] == 0 else f"{p['ttl_ms']} ms"
    return f"retention {retention} / {size}, ttl {ttl}, dedup {'on' if p['dedup'] else 'off'}"


def cmd_namespace_create(args) -> int:
    if args.retention < -1 or args.retention_bytes < -1 or args.ttl < 0:
        raise TopicCommandError("--retention and --retention-bytes must be >= -1, --ttl >= 0")
    with _client(args) as c:
        info = c.create_namespace(args.namespace, retention_ms=args.retention, retention_bytes=args.retention_bytes,
                                  ttl_ms=args.ttl, dedup=args.dedup)
    if args.json:
        _print_json(info)
    else:
        print(f"namespace {info['namespace']} created: {_policies_text(info)}")
    return 0


def cmd_namespace_get(args) -> int:
    with _client(args) as c:
        info = c.get_namespace(args.namespace)
    if args.json:
        _print_json(info)
    else:
        print(f"namespace {info['namespace']}: {_policies_text(info)}")
    return 0


def _quotas_text(namespace: str, quotas: dict) -> str:
    if not quotas:
        return f"namespace {namespace}: no backlog quotas"
    lines = [f"namespace {namespace}:"]
    for kind, q in sorted(quotas.items()):
        limit = f"{q['limit_bytes']} bytes" if "limit_bytes" in q else f"{q['limit_time_ms']} ms"
        lines.append(f"  {kind}: {limit}, {q['policy']}")
    return "\n".join(lines)


def _print_quotas(args, quotas: dict) -> int:
    if args.json:
        _print_json(quotas)
    else:
        print(_quotas_text(args.namespace, quotas))
    return 0


def cmd_namespace_set_backlog_quota(args) -> int:
    limit = args.limit_size if args.limit_size is not None else args.limit_time
    if limit <= 0:
        raise TopicCommandError("--limit-size and --limit-time must be > 0")
    with _client(args) as c:
        quotas = c.set_backlog_quota(args.namespace, args.policy, limit_bytes=args.limit_size,
                                     limit_time_ms=args.limit_time)
    return _print_quotas(args, quotas)


def cmd_namespace_get_backlog_quotas(args) -> int:
    with _client(args) as c:
        quotas = c.get_backlog_quotas(args.namespace)
    return _print_quotas(args, quotas)


def cmd_namespace_remove_backlog_quota(args) -> int:
    with _client(args) as c:
        quotas = c.remove_backlog_quota(args.namespace, args.type)
    return _print_quotas(args, quotas)


def cmd_namespace_list(args) -> int:
    with _client(args) as c:
        names = c.list_namespaces(args.tenant)
    if args.json:
        _print_json(names)
    else:
        print("\n".join(names) if names else f"(no namespaces in {args.tenant})")
    return 0


# -- topics -----------------------------------------------------------------------------------------------------

def cmd_topic_create(args) -> int:
    with _client(args) as c:
        info = c.create_topic(args.topic, args.partitions)
    if args.json:
        _print_json(info)
    else:
        kind = f"{info['partitions']} partitions" if info["partitions"] else "non-partitioned"
        print(f"topic {info['topic']} created ({kind})")
    return 0


def cmd_topic_list(args) -> int:
    with _client(args) as c:
        topics = c.list_topics(args.namespace)
    if args.json:
        _print_json(topics)
    else:
        print("\n".join(topics) if topics else f"(no topics in {args.namespace})")
    return 0


def cmd_topic_delete(args) -> int:
    with _client(args) as c:
        info = c.delete_topic(args.topic, force=args.force)
    if args.json:
        _print_json(info | {"deleted": True})
    else:
        print(f"topic {info['topic']} deleted" + (f" ({info['partitions']} partitions)" if info["partitions"] else ""))
    return 0


def cmd_topic_lookup(args) -> int:
    with _client(args) as c:
        partitions = c.get_topic(args.topic)["partitions"]
        names = [f"{args.topic}-partition-{i}" for i in range(partitions)] if partitions else [args.topic]
        rows = [c.lookup(name) for name in names]
    if args.json:
        _print_json(rows if partitions else rows[0])
    else:
        for r in rows:
            print(f"{r['topic']}: broker {r['broker_id']} at {r['address']}"
                  + ("" if r["owned"] else " (not loaded yet: that broker takes it on first use)"))
    return 0


def cmd_topic_stats(args) -> int:
    with _client(args) as c:
        partitions = c.get_topic(args.topic)["partitions"]
        get = c.topic_stats_internal if args.internal else c.topic_stats
        if partitions:
            stats = {"partitions": {f"{args.topic}-partition-{i}": get(f"{args.topic}-partition-{i}")
                                    for i in range(partitions)}}
        else:
            stats = get(args.topic)
    _print_json(stats)
    return 0


# -- produce ----------------------------------------------------------------------------------------------------

def _properties(items: list[str]) -> dict[str, str]:
    props = {}
    for item in items:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise TopicCommandError(f"-p {pair!r}: expected KEY=VALUE")
            props[key] = value
    return props


def _payloads(args) -> list[bytes]:
    out = []
    for value in args.messages:
        parts = value.split(args.separator) if args.separator else [value]
        out += [p.encode() for p in parts]
    for path in args.file:
        try:
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as e:
            raise TopicCommandError(f"cannot read --file {path}: {e.strerror}") from None
    if not out:
        raise TopicCommandError("nothing to send: give -m MSG and/or --file FILE")
    return out


def cmd_produce(args) -> int:
    from bksim.client import ClientError

    payloads = _payloads(args)
    props = _properties(args.property)
    if args.rate < 0:
        raise TopicCommandError("--rate must be >= 0")
    total = len(payloads) * args.count
    ok: list = []
    failed: list = []

    status = Progress(f"produce {args.topic}", total, "messages", json=args.json)

    def done(error, mid) -> None:
        (failed if error is not None else ok).append(error if error is not None else mid)
        status.update(len(ok) + len(failed), note=f"{len(failed)} failed" if failed else None)

    start = time.monotonic()
    with status, _client(args) as c:
        producer = c.create_producer(args.topic, producer_name=args.producer_name,
                                     batching_enabled=not args.no_batching, block_if_queue_full=True)
        try:
            for i in range(total):
                if args.rate > 0:
                    delay = start + i / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)  # pacing to --rate
                producer.send_async(payloads[i % len(payloads)], done, key=args.key, properties=props or None,
                                    deliver_after_ms=args.deliver_after or None)
            producer.flush()
        finally:
            producer.close()
    elapsed = time.monotonic() - start
    ids = sorted(ok)
    if args.json:
        _print_json({"topic": args.topic, "produced": len(ok), "failed": len(failed), "seconds": round(elapsed, 3),
                     "message_ids": [str(m) for m in ids[:PRODUCE_IDS_SHOWN]],
                     "errors": [str(e) for e in failed[:PRODUCE_IDS_SHOWN]]})
    else:
        print(f"{len(ok)} messages successfully produced to {args.topic} in {elapsed:.2f} s"
              + (f" (first {ids[0]}, last {ids[-1]})" if ids else ""))
    if failed:
        first = failed[0]
        raise ClientError(first.status, f"{len(failed)} of {total} messages failed; the first: {first.message}")
    return 0


# -- consume ----------------------------------------------------------------------------------------------------

def _content(data: bytes, hex_dump: bool) -> str:
    data = data[:CONTENT_PREVIEW_MAX]
    if not hex_dump:
        return data.decode("utf-8", errors="backslashreplace")
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset:offset + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  |{text}|")
    return "\n" + "\n".join(lines)


def message_json(m) -> dict:
    data = m.data()
    try:
        content = {"content": data.decode("utf-8")}
    except UnicodeDecodeError:
        content = {"content_base64": base64.b64encode(data).decode()}
    return {"message_id": str(m.message_id()), "key": m.key(), "properties": m.properties(),
            "publish_time_ms": m.publish_timestamp(), "event_time_ms": m.event_timestamp(),
            "redelivery_count": m.redelivery_count(), "topic": m.topic_name(), **content}


def _print_message(args, m) -> None:
    if args.json:
        print(json.dumps(message_json(m), sort_keys=True), flush=True)
        return
    props = ", ".join(f"{k}={v}" for k, v in sorted(m.properties().items()))
    line = f"key:[{m.key() if m.key() is not None else 'null'}], properties:[{props}]"
    if not args.hide_content:
        line += f", content:{_content(m.data(), args.hex)}"
    print("----- got message -----", flush=False)
    print(line, flush=True)


def _next_message(receive, args, what: str, done: str):
    """The next message, waiting in CONSUME_POLL_MS steps; TIMEOUT after --timeout seconds without one."""
    from bksim.client import ClientError

    last = time.monotonic()
    while True:
        try:
            return receive(CONSUME_POLL_MS)
        except ClientError as e:
            if e.status is not TopicStatus.TIMEOUT:
                raise
            if args.timeout and time.monotonic() - last >= args.timeout:
                raise ClientError(TopicStatus.TIMEOUT, f"no message on {args.topic} ({what}) for "
                                                       f"{args.timeout:g} s; {done}") from None


def parse_message_id(text: str):
    """'L:E', 'L:E:P' or 'L:E:P:B' (str(MessageId)) -> MessageId; TopicCommandError naming the text."""
    from bksim.client import MessageId

    parts = text.split(":")
    try:
        if not 2 <= len(parts) <= 4:
            raise ValueError
        return MessageId(*(int(p) for p in parts))
    except ValueError:
        raise TopicCommandError(f"--start-message-id {text!r} is not LEDGER:ENTRY[:PARTITION[:BATCH]] "
                                f"(integers, as consume --json prints message ids)") from None


def cmd_read(args) -> int:
    if args.timeout < 0:
        raise TopicCommandError("--timeout must be >= 0")
    start = (parse_message_id(args.start_message_id) if args.start_message_id
             else "earliest" if args.earliest else "latest")
    read = 0
    with _client(args) as c:
        reader = c.create_reader(args.topic, start, start_message_id_inclusive=args.inclusive)
        try:
            while args.count == 0 or read < args.count:
                _print_message(args, _next_message(reader.read_next, args, f"reader from {start}", f"read {read}"))
                read += 1
        finally:
            reader.close()
    if not args.json:
        print(f"{read} messages successfully read", file=sys.stderr)
    return 0


def cmd_consume(args) -> int:
    from bksim.client import InitialPosition, KeySharedPolicy, SubscriptionType

    try:
        kind = SubscriptionType.parse(args.type)
    except ValueError as e:
        raise TopicCommandError(str(e)) from None
    if args.timeout < 0:
        raise TopicCommandError("--timeout must be >= 0")
    consumed = 0
    with _client(args) as c:
        consumer = c.subscribe(args.topic, args.subscription, kind, consumer_name=args.consumer_name,
                               priority=args.priority, initial_position=InitialPosition.parse(args.position),
                               key_shared_policy=KeySharedPolicy.sticky(args.sticky_range)
                               if args.sticky_range else None)
        try:
            while args.num_messages == 0 or consumed < args.num_messages:
                m = _next_message(consumer.receive, args, f"subscription {args.subscription}", f"consumed {consumed}")
                _print_message(args, m)
                consumer.acknowledge(m)
                consumed += 1
        finally:
            consumer.close()
    if not args.json:
        print(f"{consumed} messages successfully consumed", file=sys.stderr)
    return 0
