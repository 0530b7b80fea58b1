"""`bksim ledger create|write|read|close|recover|delete|list|metadata`: ledgers through a broker's gRPC API
(and `bksim ledger replicas`, which asks the bookies directly: cli/autorecovery_cmd.py).

Every command talks to one broker (adapters/broker_client.py):

- `--broker HOST:PORT`, else the first broker registered in ZooKeeper (`/brokers/available`, sorted by
  id), else `<broker.host>:<cluster.broker_port_base>` (the first broker `bksim cluster up` starts).
  An open ledger is written only by the broker that created it: `write` and `close` must reach that broker
  (with the default choice they do, as long as the set of registered brokers does not change).
- The ledger password is a secret, so it never comes from the command line (PROTOCOL.md §8): it is the
  content of `--password-file FILE` (one trailing newline stripped), else the environment variable
  BKSIM_LEDGER_PASSWORD, else empty (as Pulsar's default `managedLedgerPassword`). It is never printed.
- `--json` prints one JSON object (`read --json`: one object per entry, one per line, as they stream);
  otherwise a readable table or summary on stdout.
- A refusal prints `bksim: error: <STATUS>: <message>` (STATUS the broker's LedgerStatus name, e.g.
  BAD_REQUEST, UNAUTHORIZED, READ_BEYOND_LAC, LEDGER_CLOSED; or the gRPC code when the broker did not
  answer) and exits 2. A `write` that fails part-way (e.g. NOT_ENOUGH_BOOKIES once a bookie of the ensemble
  died and none can replace it) also reports what was acknowledged before the failure, which is durable: the
  entries, their ids and the LAC (on stdout when any entry was acknowledged; with --json always, as the
  object with an "error" member); it still exits 2.

Bounds: `write` keeps at most `--window` AppendRequests unanswered, each at most `--batch` payloads and
REQUEST_BYTES_MAX bytes (so the entries in flight are bounded); `read` prints as it streams, holding one
message at a time, with or without --json.

Progress: on a terminal, without --json, `write` and `read` draw a status line on stderr (cli/progress.py):
entries acknowledged (read: received) of the total, rate and ETA; `read` up to the LAC counts without a total.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import time

from bksim.cli import config as cfgload
from bksim.cli.progress import Progress
from bksim.model.config import Config
from bksim.model.errors import BksimError
from bksim.model.status import LedgerStatus

PASSWORD_ENV = "BKSIM_LEDGER_PASSWORD"
ZK_LOOKUP_TIMEOUT_S = 2.0  # finding a broker in ZooKeeper; then the fallback address is used
REQUEST_BYTES_MAX = 4 * 1024 * 1024  # payload bytes per AppendRequest `write` sends (well under the frame)
WRITE_BATCH_DEFAULT = 100
WRITE_WINDOW_DEFAULT = 16
PREVIEW_BYTES = 32
LIST_DETAILS_MAX = 1000  # `ledger list` fetches the metadata of at most this many ledgers
FILLER = b"abcdefghijklmnopqrstuvwxyz0123456789"


class LedgerCommandError(BksimError):
    """A `bksim ledger` argument or set-up problem (not a broker refusal)."""


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    common.add_argument("--broker", metavar="HOST:PORT",
                        help="broker to ask (default: the first registered in ZooKeeper, else "
                             "<broker.host>:<cluster.broker_port_base>)")
    common.add_argument("--password-file", metavar="FILE",
                        help=f"file holding the ledger password (default: ${PASSWORD_ENV}, else empty)")
    common.add_argument("--json", action="store_true",
                        help="print one JSON object (read: one object per entry and line)")

    ledger = subparsers.add_parser("ledger", help="create, write, read, close, recover, delete and list ledgers "
                                                  "through a broker")
    family = ledger.add_subparsers(dest="ledger_command", required=True)

    p = family.add_parser("create", parents=[common], help="create a ledger (placement chosen by the broker)")
    p.add_argument("--ensemble", "-e", type=int, required=True, metavar="E", help="bookies the ledger is striped over")
    p.add_argument("--write-quorum", "-w", type=int, required=True, metavar="QW", help="replicas of each entry")
    p.add_argument("--ack-quorum", "-a", type=int, required=True, metavar="QA",
                   help="acknowledgements an entry needs (E >= QW >= QA >= 1)")
    p.add_argument("--digest", default="", help="digest type (default: the broker's, crc32c)")
    p.add_argument("--custom", action="append", default=[], metavar="KEY=VALUE", help="custom metadata (repeatable)")
    p.set_defaults(func=cmd_create)

    p = family.add_parser("write", parents=[common], help="append generated entries to a ledger this broker writes")
    p.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    p.add_argument("--count", "-n", type=_positive, required=True, metavar="N", help="entries to append")
    p.add_argument("--size", "-s", type=_non_negative, required=True, metavar="BYTES", help="bytes per entry")
    p.add_argument("--batch", "-b", type=_positive, default=WRITE_BATCH_DEFAULT, metavar="B",
                   help=f"entries per AppendRequest (default {WRITE_BATCH_DEFAULT}; fewer when B*BYTES > "
                        f"{REQUEST_BYTES_MAX >> 20} MiB)")
    p.add_argument("--window", type=_positive, default=WRITE_WINDOW_DEFAULT, metavar="W",
                   help=f"AppendRequests in flight (default {WRITE_WINDOW_DEFAULT})")
    p.set_defaults(func=cmd_write)

    p = family.add_parser("read", parents=[common], help="read entries (never above the last confirmed entry)")
    p.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    p.add_argument("--from", dest="first", type=_non_negative, default=0, metavar="FIRST",
                   help="first entry id (default 0)")
    p.add_argument("--to", dest="last", type=int, default=-1, metavar="LAST",
                   help="last entry id (default -1: the last confirmed entry)")
    p.add_argument("--payload", action="store_true", help="with --json: include each payload (base64)")
    p.set_defaults(func=cmd_read)

    for name, func, text in (
            ("close", cmd_close, "close a ledger this broker writes (last entry = its LAC)"),
            ("recover", cmd_recover, "open with recovery: fence the writer, recover the tail, close"),
            ("delete", cmd_delete, "delete a ledger's metadata"),
            ("metadata", cmd_metadata, "a ledger's metadata (never the password)")):
        p = family.add_parser(name, parents=[common], help=text)
        p.add_argument("ledger_id", type=_ledger_id, metavar="ID")
        p.set_defaults(func=func)

    p = family.add_parser("list", parents=[common], help="every ledger, with its state and size")
    p.set_defaults(func=cmd_list)

    p = family.add_parser("replicas", help="per segment and bookie: the entries each replica holds and should hold",
                          description="Ask every bookie of the ledger's ensembles which of its entries it holds "
                                      "(ListEntries, as the autorecovery auditor does), directly, not through a "
                                      "broker; print them per segment next to the count its write sets require.")
    p.add_argument("ledger_id", type=_ledger_id, metavar="ID")
    p.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_replicas)


def _ledger_id(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"ledger id must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _cmd_replicas(args) -> int:
    from bksim.cli.autorecovery_cmd import cmd_replicas

    return cmd_replicas(args)


# -- shared pieces -------------------------------------------------------------------------------------------

def password_of(args) -> bytes:
    """--password-file (one trailing newline stripped), else $BKSIM_LEDGER_PASSWORD, else empty."""
    path = getattr(args, "password_file", None)
    if path:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise LedgerCommandError(f"cannot read password file {path}: {e.strerror}") from None
        return data[:-1] if data.endswith(b"\n") else data
    return os.environ.get(PASSWORD_ENV, "").encode()


def find_broker(config: Config) -> tuple[str, str]:
    """(address, where it came from): the first broker registered in ZooKeeper, else the configured default."""
    from bksim.adapters import registration
    from bksim.adapters.zk_client import client_hosts

    fallback = f"{config.broker.host}:{config.cluster.broker_port_base}"
    zk = client_hosts(config)
    try:
        client = registration.connect_config(config, ZK_LOOKUP_TIMEOUT_S)
    except registration.RegistrationError:
        return fallback, f"ZooKeeper {zk} not reachable; using the default broker address"
    try:
        rows = registration.registered_brokers(client)
    finally:
        client.stop()
        client.close()
    if rows:
        return registration.broker_address(rows[0]), f"registered in ZooKeeper {zk}"
    return fallback, f"no broker registered in ZooKeeper {zk}; using the default broker address"


class _Session:
    """The broker to talk to, the password, and a client; turns an unreachable broker into a message that
    says how the address was chosen."""

    def __init__(self, args) -> None:
        from bksim.adapters.broker_client import SyncBrokerClient
        from bksim.security.tls import channel_security

        self.config = cfgload.load(getattr(args, "config", None))
        self.password = password_of(args)
        if args.broker:
            self.address, self.source = args.broker, "--broker"
        else:
            self.address, self.source = find_broker(self.config)
        from bksim.cli.security_cmd import client_token
        self.client = SyncBrokerClient(self.address, tls=channel_security(self.config.security),
                                       token=client_token(args))

    def __enter__(self) -> "_Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.client.close()
        from bksim.adapters.broker_client import BrokerCallError

        if isinstance(exc, BrokerCallError) and not exc.from_broker and exc.status == "UNAVAILABLE":
            raise BrokerCallError(exc.status, exc.grpc_code,
                                  f"{exc.message} (broker {self.address}: {self.source}; is the cluster up? "
                                  f"`bksim cluster up` starts brokers)") from None


def _print_json(value) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def preview(payload: bytes, limit: int = PREVIEW_BYTES) -> str:
    """The first `limit` bytes, printable ASCII kept, others as '.', '…' when cut."""
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in payload[:limit])
    return text + ("…" if len(payload) > limit else "")


def make_payload(index: int, size: int) -> bytes:
    """A readable payload of exactly `size` bytes: "<index, 8 digits> " then a repeating alphabet."""
    head = f"{index:08d} ".encode()
    if size <= len(head):
        return head[:size]
    rest = size - len(head)
    return head + (FILLER * (rest // len(FILLER) + 1))[:rest]


def _segments_text(info) -> list[str]:
    return [f"  from entry {s.first_entry_id}: {', '.join(s.ensemble)}" for s in info.segments]


# -- create --------------------------------------------------------------------------------------------------

def cmd_create(args) -> int:
    custom = {}
    for item in args.custom:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LedgerCommandError(f"--custom {item!r}: expected KEY=VALUE")
        custom[key] = value
    with _Session(args) as s:
        info = s.client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=s.password,
                                      digest_type=args.digest, custom=custom)
    if args.json:
        _print_json(info.to_dict() | {"broker": s.address})
        return 0
    print(f"ledger {info.ledger_id} created: E={info.ensemble_size} Qw={info.write_quorum_size} "
          f"Qa={info.ack_quorum_size} digest {info.digest_type}, state {info.state}, written by broker {s.address}")
    print("ensemble:")
    print("\n".join(_segments_text(info)))
    print(f"next: bksim ledger write {info.ledger_id} --count 1000 --size 1024"
          + ("" if not args.broker else f" --broker {args.broker}"))
    return 0


# -- write ---------------------------------------------------------------------------------------------------

def cmd_write(args) -> int:
    from bksim.adapters.broker_client import BrokerCallError

    per_request = max(1, min(args.batch, REQUEST_BYTES_MAX // max(1, args.size)))
    broker = args.broker
    with Progress(f"ledger write {args.ledger_id}", args.count, "entries", json=args.json) as status:
        progress = WriteProgress(args.size, status)
        try:
            with _Session(args) as s:
                broker = s.address
                s.client.run(_write(s.client.client, args.ledger_id, s.password, args.count, per_request,
                                    args.window, progress))
        except BrokerCallError as e:
            status.close()
            _report_partial_write(args, progress, broker, per_request, e)
            raise
    result = progress.summary() | {"ledger_id": args.ledger_id, "broker": broker, "batch": per_request,
                                   "window": args.window}
    if args.json:
        _print_json(result)
        return 0
    print(f"ledger {args.ledger_id}: appended {result['entries']} entries of {args.size} bytes, ids "
          f"{result['first_entry_id']}..{result['last_entry_id']}, in {result['seconds']:.3f}s "
          f"({result['entries_per_s']:.0f} entries/s, {result['mb_per_s']:.2f} MB/s; {per_request} per request, "
          f"{args.window} requests in flight); LAC {result['last_add_confirmed']}")
    return 0


def _report_partial_write(args, progress: "WriteProgress", broker: str | None, per_request: int, error) -> None:
    """What a failed `write` had acknowledged before the failure: durable, so the caller must learn it. With
    --json one object (the summary plus "error" and "requested"); otherwise a line on stdout when any entry was
    acknowledged. The error line itself is main's, on stderr."""
    if args.json:
        _print_json(progress.summary() | {
            "ledger_id": args.ledger_id, "broker": broker, "batch": per_request, "window": args.window,
            "requested": args.count, "error": {"status": error.status, "message": error.message}})
    elif progress.acknowledged:
        print(f"ledger {args.ledger_id}: {progress.acknowledged} of {args.count} entries acknowledged (ids "
              f"{progress.first}..{progress.last}, durable) before the write failed; LAC {progress.lac}")


class WriteProgress:
    """What the Append stream of one `write` has acknowledged so far (kept by the caller, so a failure part-way
    still knows it)."""

    def __init__(self, size: int, status: Progress | None = None) -> None:
        self.size = size
        self.status = status  # the terminal's progress line, if any
        self.first = self.last = self.lac = -1
        self.acknowledged = 0
        self.started = time.perf_counter()

    def take(self, r) -> None:
        """One AppendResult, in request order."""
        if self.first < 0:
            self.first = r.first_entry_id
        self.last = r.first_entry_id + r.count - 1
        self.lac = max(self.lac, r.last_add_confirmed)
        self.acknowledged += r.count
        if self.status is not None:
            self.status.update(self.acknowledged)

    def summary(self) -> dict:
        seconds = max(time.perf_counter() - self.started, 1e-9)
        n = self.acknowledged
        return {"entries": n, "first_entry_id": self.first, "last_entry_id": self.last,
                "last_add_confirmed": self.lac, "bytes": n * self.size, "seconds": round(seconds, 6),
                "entries_per_s": round(n / seconds, 1), "mb_per_s": round(n * self.size / seconds / 1e6, 3)}


async def _write(client, ledger_id: int, password: bytes, count: int, per_request: int, window: int,
                 progress: WriteProgress) -> None:
    import collections

    stream = client.append_stream(ledger_id, password=password, window_max=window)
    futures: collections.deque = collections.deque()
    size = progress.size
    progress.started = time.perf_counter()
    try:
        index = 0
        while index < count:
            n = min(per_request, count - index)
            batch = [make_payload(index + i, size) for i in range(n)]
            index += n
            if len(futures) >= window:
                progress.take(await stream.result(futures.popleft()))
            futures.append(await stream.send(batch))
        while futures:
            progress.take(await stream.result(futures.popleft()))
    except BaseException:
        # answers that arrived before the failure (in request order, up to the first failed one) still count
        while futures and futures[0].done() and not futures[0].cancelled() and futures[0].exception() is None:
            progress.take(futures.popleft().result())
        raise
    finally:
        await stream.close()


# -- read ----------------------------------------------------------------------------------------------------

def cmd_read(args) -> int:
    total = args.last - args.first + 1 if args.last >= 0 else None  # to the LAC: not known beforehand
    with Progress(f"ledger read {args.ledger_id}", total, "entries", json=args.json) as status:
        with _Session(args) as s:
            return s.client.run(_read(s.client.client, args, s.password, status))


async def _read(client, args, password: bytes, status: Progress) -> int:
    count = total = 0
    first = last = None
    entries = client.read_entries(args.ledger_id, args.first, args.last, password=password)
    async with contextlib.aclosing(entries):  # a reader that stops early (a closed pipe) cancels the call now
        async for entry_id, payload in entries:
            if count == 0 and not args.json:  # after the broker accepted the range: an error prints alone
                print(f"{'ENTRY':>10} {'SIZE':>9}  PREVIEW")
            count += 1
            total += len(payload)
            first = entry_id if first is None else first
            last = entry_id
            status.update(count)
            if args.json:  # one object per line as the entries arrive: a large ledger is never held in memory
                row = {"ledger_id": args.ledger_id, "entry_id": entry_id, "size": len(payload),
                       "preview": preview(payload)}
                if args.payload:
                    row["payload"] = base64.b64encode(payload).decode()
                print(json.dumps(row, sort_keys=True))
            else:
                print(f"{entry_id:>10} {len(payload):>9}  {preview(payload)}")
    status.close()
    if not args.json:
        span = f"ids {first}..{last}" if count else "no entries"
        print(f"{count} entries, {total} bytes ({span})")
    return 0


# -- close, recover, delete, metadata, list ------------------------------------------------------------------

def cmd_close(args) -> int:
    with _Session(args) as s:
        info = s.client.close_ledger(args.ledger_id, password=s.password)
    if args.json:
        _print_json(info.to_dict())
    else:
        print(f"ledger {info.ledger_id} {info.state}: last entry {info.last_entry_id}, length {info.length} bytes")
    return 0


def cmd_recover(args) -> int:
    with _Session(args) as s:
        started = time.perf_counter()
        info, lac = s.client.open_ledger(args.ledger_id, password=s.password, recover=True)
        seconds = time.perf_counter() - started
    if args.json:
        _print_json(info.to_dict() | {"last_add_confirmed": lac, "seconds": round(seconds, 6)})
    else:
        print(f"ledger {info.ledger_id} recovered in {seconds:.3f}s: {info.state} at last entry "
              f"{info.last_entry_id}, length {info.length} bytes")
    return 0


def cmd_delete(args) -> int:
    with _Session(args) as s:
        s.client.delete_ledger(args.ledger_id, password=s.password)
    if args.json:
        _print_json({"ledger_id": args.ledger_id, "deleted": True})
    else:
        print(f"ledger {args.ledger_id} deleted")
    return 0


def cmd_metadata(args) -> int:
    with _Session(args) as s:
        info = s.client.get_metadata(args.ledger_id)
    if args.json:
        _print_json(info.to_dict())
        return 0
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.ctime_ms / 1000))
    print(f"ledger          {info.ledger_id}")
    print(f"state           {info.state}")
    print(f"quorums         E={info.ensemble_size} Qw={info.write_quorum_size} Qa={info.ack_quorum_size}")
    print(f"last entry      {info.last_entry_id}")
    print(f"length          {info.length} bytes")
    print(f"digest          {info.digest_type}")
    print(f"created         {created} (ctime_ms {info.ctime_ms})")
    print(f"format version  {info.format_version}, znode version {info.version}")
    if info.custom:
        print("custom          " + ", ".join(f"{k}={v}" for k, v in sorted(info.custom.items())))
    print("segments")
    print("\n".join(_segments_text(info)))
    return 0


def cmd_list(args) -> int:
    from bksim.adapters.broker_client import BrokerCallError

    with _Session(args) as s:
        ids = s.client.list_ledgers()
        details = []
        for ledger_id in ids[:LIST_DETAILS_MAX]:
            try:
                details.append(s.client.get_metadata(ledger_id))
            except BrokerCallError as e:
                if e.ledger_status is not LedgerStatus.NO_SUCH_LEDGER:  # deleted meanwhile: leave it out
                    raise
    if args.json:
        _print_json({"ledger_ids": ids, "ledgers": [d.to_dict() for d in details]})
        return 0
    if not ids:
        print("no ledgers")
        return 0
    print(f"{'LEDGER':>10} {'STATE':<12} {'E/QW/QA':<9} {'LAST ENTRY':>10} {'LENGTH':>12}  ENSEMBLE (last segment)")
    for d in details:
        ensemble = ", ".join(d.segments[-1].ensemble) if d.segments else "-"
        print(f"{d.ledger_id:>10} {d.state:<12} {f'{d.ensemble_size}/{d.write_quorum_size}/{d.ack_quorum_size}':<9} "
              f"{d.last_entry_id:>10} {d.length:>12}  {ensemble}")
    if len(ids) > LIST_DETAILS_MAX:
        print(f"... and {len(ids) - LIST_DETAILS_MAX} more (all ids with --json)")
    print(f"{len(ids)} ledger(s)")
    return 0
