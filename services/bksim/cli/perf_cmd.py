"""`bksim perf ...`: the benchmarks (fsync-baseline, journal-append, grpc-baseline, bookie-add, ledger-write,
recovery, cursor-holes, produce, consume, failover, audit, rereplication, compaction, replay, soak, scale) and
`perf targets` (every performance target in one table, each row measured in the run by the benchmarks' own
functions, one at a time): their arguments, wired to bksim.perf.

Each runs through perf/harness.py and prints a header with the machine facts, the CPU idle fraction before every measurement, and a table of
records/s, MB/s and per-record p50/p99/p99.9 latency; `--json` prints one JSON object instead (the human
lines go to stderr). The bookie figures run their baseline first, in the same run and with the same record
and group/batch size, and print the ratio; bookie-add, ledger-write, consume, recovery and rereplication also
print their targets' verdicts ("targets" in the JSON). ledger-write and produce with --tls and/or --auth measure a
plain and then a secured cluster (perf/security_cost.py) and print the secured/plain ratio and p99 difference; bookie-add and
produce with --metrics measure with metrics off and then on (perf/metrics_cost.py) and print the on/off ratio. Every run is bounded by --seconds and/or --records (audit, rereplication
and replay by --size); all files go
to a fresh temp dir under --dir that is removed at the end, and every child process is stopped by pid,
also on Ctrl-C, SIGTERM or an error. On a terminal (without --json) a status line on stderr shows the
measurement under way and its seconds (cli/progress.py).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Callable

from bksim.cli.progress import Progress
from bksim.perf import harness, machine
from bksim.perf.stats import Ratio, Result, ratio

SECONDS_DEFAULT = 5.0
DIR_DEFAULT = os.path.join(".run", "perf")


def register(subparsers) -> None:
    perf = subparsers.add_parser("perf", help="benchmarks: raw baselines and the bookie measured against them")
    sub = perf.add_subparsers(dest="perf_command", required=True)

    p = sub.add_parser("fsync-baseline", help="raw append of GROUP records + one fdatasync, in a new file")
    _common(p, group_name="--group", group_default=16, group_help="records per fdatasync")
    p.add_argument("--sweep", action="store_true",
                   help="measure every (record bytes, group) of 1024,65536 x 1,16,256 instead of one combination")
    p.set_defaults(func=cmd_fsync_baseline)

    p = sub.add_parser("journal-append", help="the bookie's Journal in-process vs fsync-baseline (same run)")
    _common(p, group_name="--group", group_default=16, group_help="records per fsync (= concurrent records)")
    p.add_argument("--per-append", type=int, default=1, help="records per append_many call (default 1); "
                   "GROUP/PER_APPEND producers run concurrently")
    p.add_argument("--flush-when-idle", action="store_true",
                   help="let the journal's idle flush form the groups instead of a byte threshold of GROUP records")
    p.add_argument("--depth", type=int, default=1, help="groups outstanding (default 1: each group's producers "
                   "wait for its sync; 2: the next group is queued while one syncs)")
    p.set_defaults(func=cmd_journal_append)

    p = sub.add_parser("grpc-baseline", help="bare grpc.aio bidi echo stream, server in a separate process")
    _common(p, group_name="--batch", group_default=100, group_help="records per gRPC message")
    _inflight(p)
    p.set_defaults(func=cmd_grpc_baseline)

    p = sub.add_parser("bookie-add", help="a real bookie process over gRPC vs grpc-baseline (same run)")
    _common(p, group_name="--batch", group_default=100, group_help="records per AddRequest")
    _inflight(p)
    p.add_argument("--py-spy", metavar="OUT", help="sample the bookie's GIL-holding threads with py-spy "
                   "(installed by hand) during the measurement; write collapsed stacks to OUT")
    p.add_argument("--breakdown", action="store_true", help="then the bookie's storage engine alone in this "
                   "process (engine-add: the same entries, no gRPC), and the bookie's CPU per entry split into the "
                   "engine's and the rest, with the most one core could add (perf/engine_add.py)")
    _metrics_flag(p)
    p.set_defaults(func=cmd_bookie_add)

    from bksim.perf import ledger_write, recovery

    p = sub.add_parser("ledger-write", help="appends through a real broker to E real bookies vs grpc-baseline "
                       "(same run); closed loop, open loop at --rate, or --both")
    _common(p, group_name="--batch", group_default=ledger_write.BATCH_DEFAULT, group_help="payloads per "
            "AppendRequest", record_names=("--entry-size", "--record-bytes"), seconds_names=("--duration", "--seconds"),
            record_help="payload bytes per entry (>= 36: the baseline sends whole entries of this size)")
    _shape(p)
    p.add_argument("--window", type=int, default=ledger_write.WINDOW_DEFAULT,
                   help=f"unanswered AppendRequests on the stream (default {ledger_write.WINDOW_DEFAULT}); also the "
                        f"baseline's batches in flight")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=float, help="open loop: offer RATE entries/s (batches due on a schedule, "
                      "latency from the due time); default: closed loop, as fast as the window allows")
    loop.add_argument("--both", action="store_true", help="closed loop, then open loop at half the measured "
                      "entries/s: both targets in one run")
    _security(p)
    p.set_defaults(func=cmd_ledger_write)

    p = sub.add_parser("recovery", help="time to recover (fence, read forward, write back, close) an open ledger "
                       "with an unconfirmed window of ENTRIES entries, through a real broker")
    p.add_argument("--entries", type=int, default=recovery.TARGET_ENTRIES,
                   help=f"entries the dying writer left (default {recovery.TARGET_ENTRIES})")
    p.add_argument("--entry-size", "--record-bytes", dest="record_bytes", type=int, default=1024,
                   help="payload bytes per entry (default 1024)")
    p.add_argument("--lac", type=int, default=-1, help="the LAC the dying writer piggybacked in every entry "
                   "(default -1: recovery reads forward and writes back every entry)")
    p.add_argument("--batch", dest="group", type=int, default=100,
                   help="entries per AddRequest of the dying writer (default 100)")
    _shape(p)
    _run_options(p)
    p.set_defaults(func=cmd_recovery, seconds=0.0, records=0)

    from bksim.perf import cursor_holes

    p = sub.add_parser("cursor-holes", help="a cursor with ENTRIES/2 ack holes: snapshot size, time to persist it "
                       "and to recover it after a kill and after a clean close (real ZooKeeper and bookies)")
    p.add_argument("--entries", type=int, default=cursor_holes.TARGET_ENTRIES,
                   help=f"entries of the topic (default {cursor_holes.TARGET_ENTRIES:,})")
    p.add_argument("--ledger-entries", type=int, default=cursor_holes.LEDGER_ENTRIES_DEFAULT,
                   help=f"entries per message ledger (default {cursor_holes.LEDGER_ENTRIES_DEFAULT:,})")
    p.add_argument("--pattern", choices=cursor_holes.PATTERNS, default="alternate",
                   help="alternate: every other entry acked (default); random: each entry with probability 1/2")
    p.add_argument("--bookies", type=int, default=2, help="bookie processes (default 2; the cursor ledger's "
                   "E/Qw/Qa are topic.* capped at this)")
    _run_options(p)
    p.set_defaults(func=cmd_cursor_holes, seconds=0.0, records=0, record_bytes=1, group=1)

    p = sub.add_parser("failover", help="the producer's gap when the broker owning its topic is killed -9 (real "
                       "ZooKeeper, bookies and two brokers; every receipted message consumed back)")
    p.add_argument("--session-timeout-ms", type=int, default=4_000,
                   help="the brokers' ZooKeeper session timeout (bounds the takeover from below; default 4000)")
    p.add_argument("--rate", type=int, default=2_000, help="messages/s the producer offers (default 2000)")
    p.add_argument("--message-size", type=int, default=100, help="payload bytes (default 100)")
    p.add_argument("--bookies", type=int, default=3, help="bookie processes (default 3)")
    p.add_argument("--config", default=None, help="bksim configuration file (default: the usual lookup)")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the run's cluster lives (removed after)")
    p.set_defaults(func=cmd_failover)

    from bksim.perf import audit as perf_audit

    p = sub.add_parser("audit", help="bksim audit on generated journals: Spark (after the session is up) and --local "
                       "against a bare parse of the same files")
    p.add_argument("--size", default="1GB", help="journal bytes to generate (default 1GB; units KB MB GB KiB MiB GiB)")
    p.add_argument("--entry-size", "--record-bytes", dest="record_bytes", type=int, default=1024,
                   help="payload bytes per entry (default 1024)")
    p.add_argument("--master", default=perf_audit.MASTER_DEFAULT,
                   help=f"Spark master of the Spark run (default {perf_audit.MASTER_DEFAULT}); a cluster master "
                        f"(spark://HOST:PORT, e.g. `make audit-cluster`'s) is measured beside {perf_audit.MASTER_DEFAULT}")
    _run_options(p)
    p.set_defaults(func=cmd_audit, seconds=0.0, records=0, group=1)

    from bksim.perf import rereplication

    p = sub.add_parser("rereplication", help="autorecovery after a bookie is lost for good (5 bookies): time from "
                       "the mark to full replication, copy rate vs ledger-write, a concurrent writer's p99")
    p.add_argument("--size", default="1GB", help="bytes of closed ledgers to write before the loss (default 1GB; "
                   "units KB MB GB KiB MiB GiB)")
    p.add_argument("--entry-size", "--record-bytes", dest="record_bytes", type=int, default=1024,
                   help="payload bytes per entry (default 1024)")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"ledger-write's and the concurrent writer's baseline duration (default {SECONDS_DEFAULT:g})")
    p.add_argument("--writer-rate", type=float, default=rereplication.WRITER_RATE_DEFAULT,
                   help=f"entries/s of the concurrent E=3 Qw=3 Qa=2 writer (open loop; default "
                        f"{rereplication.WRITER_RATE_DEFAULT:,.0f})")
    p.add_argument("--ensemble", type=int, default=3, help="the data ledgers' E (default 3)")
    p.add_argument("--write-quorum", type=int, default=2, help="the data ledgers' Qw (default 2)")
    p.add_argument("--ack-quorum", type=int, default=2, help="the data ledgers' Qa (default 2)")
    p.add_argument("--standalone-workers", type=int, default=0,
                   help="run autorecovery in this many `bksim autorecovery run` processes instead of inside every "
                        "bookie (default 0: inside the bookies, autorecovery.enabled)")
    p.add_argument("--worker-nice", type=int, default=rereplication.WORKER_NICE_DEFAULT,
                   help=f"the standalone workers' nice level, 0..19 (default {rereplication.WORKER_NICE_DEFAULT})")
    _run_options(p)
    p.set_defaults(func=cmd_rereplication, records=0, group=1)

    from bksim.perf import compaction as perf_compaction, soak as perf_soak

    p = sub.add_parser("compaction", help="entry-log compaction in an in-process engine: live MB/s copied vs a raw "
                       "scan of the same log, and a concurrent writer's add p99 without and during compaction")
    p.add_argument("--log-mb", type=int, default=64, help="entry log size in MiB (default 64)")
    p.add_argument("--live", type=float, default=0.25, help="live fraction of the compacted log (default 0.25)")
    p.add_argument("--entry-size", "--record-bytes", dest="record_bytes", type=int, default=1024,
                   help="bytes per entry, header included (default 1024)")
    p.add_argument("--writer-rate", type=float, default=perf_compaction.WRITER_RATE_DEFAULT,
                   help=f"adds/s of the concurrent writer (open loop; default "
                        f"{perf_compaction.WRITER_RATE_DEFAULT:,.0f})")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"the writer's phase without compaction (default {SECONDS_DEFAULT:g})")
    p.add_argument("--during-logs", type=int, default=1,
                   help="logs compacted (rate-limited, one after the other) while the writer runs (default 1: at "
                        "the default rate of 1 MiB/s its live quarter takes ~16 s)")
    p.add_argument("--config", default=None, help="bksim configuration file (default: the usual lookup)")
    _run_options(p)
    p.set_defaults(func=cmd_compaction, records=0, group=1)

    p = sub.add_parser("replay", help="journal replay on start-up in an in-process engine (crashed after a fill "
                       "without checkpoints) vs a bare parse of the same journal files")
    p.add_argument("--size", default="256MB", help="entry bytes to write before the crash (default 256MB; units KB MB "
                   "GB KiB MiB GiB)")
    p.add_argument("--entry-size", "--record-bytes", dest="record_bytes", type=int, default=1024,
                   help="bytes per entry, header included (default 1024)")
    p.add_argument("--config", default=None, help="bksim configuration file (default: the usual lookup); the "
                   "replaying engine takes its bookie options")
    _run_options(p)
    p.set_defaults(func=cmd_replay, seconds=0.0, records=0, group=1)

    p = sub.add_parser("soak", help="disk usage of every bookie over time under produce+consume on a topic with "
                       "retention 0, small entry logs and frequent GC/compaction: table, PNG chart, bound verdict")
    p.add_argument("--minutes", type=float, default=3.0, help="how long to produce and consume (default 3)")
    p.add_argument("--png", default=None, help="draw the chart to this PNG file (matplotlib)")
    p.add_argument("--rate", type=float, default=perf_soak.RATE_DEFAULT,
                   help=f"messages/s produced (default {perf_soak.RATE_DEFAULT:,.0f})")
    p.add_argument("--message-size", "--record-bytes", dest="record_bytes", type=int,
                   default=perf_soak.MESSAGE_BYTES_DEFAULT,
                   help=f"payload bytes per message (default {perf_soak.MESSAGE_BYTES_DEFAULT})")
    p.add_argument("--sample-s", type=float, default=perf_soak.SAMPLE_S_DEFAULT,
                   help=f"seconds between disk-usage samples (default {perf_soak.SAMPLE_S_DEFAULT:g})")
    p.add_argument("--config", default=None, help="bksim configuration file (default: the usual lookup)")
    _run_options(p)
    p.set_defaults(func=cmd_soak, records=0, group=1)

    from bksim.perf import scale as perf_scale

    p = sub.add_parser("scale", help="how cost grows along an axis (topics per broker, subscriptions per topic, "
                       "ledgers per bookie, entry size), each axis on a fresh cluster: a table of per-unit costs, a "
                       "verdict (roughly flat: within 2x from the smallest to the largest point) and a PNG chart")
    p.add_argument("--axis", choices=[*perf_scale.AXES, "all"], default="all",
                   help="the axis to measure (default all, one after the other)")
    p.add_argument("--points", default=None,
                   help="comma-separated points of the one --axis (entry sizes may carry K or M: 100,1K,1M); default: "
                        + "; ".join(f"{a} {','.join(map(str, perf_scale.default_points(a)))}" for a in perf_scale.AXES))
    p.add_argument("--png-dir", default=DIR_DEFAULT,
                   help=f"where the charts go, scale-<axis>.png (default {DIR_DEFAULT})")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"each point's measurement window (CPU of topics and subscriptions; each of entry-size's "
                        f"three runs) in seconds (default {SECONDS_DEFAULT:g})")
    p.add_argument("--config", default=None, help="bksim configuration file (default: the usual lookup)")
    _run_options(p)
    p.set_defaults(func=cmd_scale, records=0, group=1, record_bytes=1)

    from bksim.perf import consume as perf_consume, produce as perf_produce

    for name, text in (("produce", "publish MESSAGE_SIZE-byte messages through bksim.client (batching on) to a topic "
                                   "on a fresh cluster: msgs/s, MB/s, publish latency"),
                       ("consume", "receive and acknowledge a backlog through bksim.client (msgs/s, MB/s), then "
                                   "end-to-end latency at --rate msgs/s")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--message-size", "--record-bytes", dest="record_bytes", type=int,
                       default=perf_produce.MESSAGE_BYTES_DEFAULT,
                       help=f"payload bytes per message (default {perf_produce.MESSAGE_BYTES_DEFAULT})")
        p.add_argument("--batch", dest="group", type=int, default=perf_produce.BATCH_DEFAULT,
                       help=f"the producer's batching_max_messages (default {perf_produce.BATCH_DEFAULT})")
        p.add_argument("--seconds", dest="seconds", type=float, default=SECONDS_DEFAULT,
                       help=f"time bound of producing (default {SECONDS_DEFAULT:g}; 0 = only --records)")
        p.add_argument("--records", type=int, default=0, help="messages to produce (default 0 = bounded by time)")
        _run_options(p)
        _shape(p)
        p.add_argument("--partitions", type=int, default=0, help="partitions of the topic (default 0)")
        p.add_argument("--max-pending", type=int, default=perf_produce.MAX_PENDING_DEFAULT,
                       help=f"producer's max_pending_messages (default {perf_produce.MAX_PENDING_DEFAULT})")
        if name == "produce":
            _security(p)
            _metrics_flag(p)
        if name == "consume":
            p.add_argument("--receiver-queue", type=int, default=perf_consume.RECEIVER_QUEUE_DEFAULT,
                           help=f"consumer's receiver_queue_size, its permits (default "
                                f"{perf_consume.RECEIVER_QUEUE_DEFAULT})")
            p.add_argument("--rate", type=float, default=perf_consume.E2E_RATE_DEFAULT,
                           help=f"msgs/s offered in the end-to-end measurement (default "
                                f"{perf_consume.E2E_RATE_DEFAULT:,.0f})")
        p.set_defaults(func=cmd_produce if name == "produce" else cmd_consume)

    from bksim.perf import targets as perf_targets

    p = sub.add_parser("targets", help="every performance target in one table: each row measured in this run (one "
                       "benchmark at a time), its value, target, verdict and the command that measures it alone")
    p.add_argument("--seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"time bound of each short measurement (bookie-add, ledger-write, consume and their baselines; "
                        f"default {SECONDS_DEFAULT:g})")
    p.add_argument("--rss-seconds", type=float, default=perf_targets.RSS_SECONDS_DEFAULT,
                   help=f"seconds of the bookie-rss row's sustained bookie-add (default "
                        f"{perf_targets.RSS_SECONDS_DEFAULT:g})")
    p.add_argument("--replay-size", default=perf_targets.REPLAY_SIZE_DEFAULT,
                   help=f"journal bytes of the replay row (default {perf_targets.REPLAY_SIZE_DEFAULT}; units KB MB GB "
                        f"KiB MiB GiB)")
    p.add_argument("--rows", default=None, help=f"comma-separated rows to measure (default all: "
                   f"{','.join(perf_targets.ROW_NAMES)})")
    _run_options(p, repeat=False)  # the configuration file: bksim's --config, as for bookie-add and ledger-write
    p.set_defaults(func=cmd_targets, records=0, record_bytes=perf_targets.RECORD_BYTES, group=perf_targets.BATCH,
                   repeat=1)


def _common(p: argparse.ArgumentParser, group_name: str, group_default: int, group_help: str,
            record_names: tuple[str, ...] = ("--record-bytes",), seconds_names: tuple[str, ...] = ("--seconds",),
            record_help: str = "bytes per record") -> None:
    p.add_argument(*record_names, dest="record_bytes", type=int, default=1024, help=f"{record_help} (default 1024)")
    p.add_argument(group_name, dest="group", metavar=group_name.lstrip("-").upper(), type=int,
                   default=group_default, help=f"{group_help} (default {group_default})")
    p.add_argument(*seconds_names, dest="seconds", type=float, default=SECONDS_DEFAULT,
                   help=f"time bound per measurement (default {SECONDS_DEFAULT:g}; 0 = only --records)")
    p.add_argument("--records", type=int, default=0, help="record bound per measurement (default 0 = none)")
    _run_options(p)


def _shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", type=int, default=3, help="ensemble size E: bookies started (default 3)")
    p.add_argument("--write-quorum", type=int, default=3, help="write quorum Qw (default 3)")
    p.add_argument("--ack-quorum", type=int, default=2, help="ack quorum Qa (default 2)")


def _run_options(p: argparse.ArgumentParser, repeat: bool = True) -> None:
    p.add_argument("--dir", default=DIR_DEFAULT, help=f"a temp dir is made (and removed) under this "
                   f"(default {DIR_DEFAULT})")
    p.add_argument("--idle-min", type=float, default=machine.IDLE_MIN_DEFAULT,
                   help=f"wait for this CPU idle fraction before measuring (default {machine.IDLE_MIN_DEFAULT})")
    p.add_argument("--idle-wait-s", type=float, default=machine.IDLE_WAIT_S_DEFAULT,
                   help=f"longest wait for idle CPUs; then measure anyway (default {machine.IDLE_WAIT_S_DEFAULT:g})")
    if repeat:
        p.add_argument("--repeat", type=int, default=1, help="repeat the measurement(s) N times (default 1); "
                       "with a baseline, the ratio of each pair and their median are printed")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data) for inspection")
    p.add_argument("--json", action="store_true", help="print one JSON object (human lines go to stderr)")


def _security(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls", action="store_true", help="measure twice in this run, plain and then with TLS on every "
                   "gRPC link (certificates made under the run's temp dir), and print the secured/plain ratio and "
                   "p99 difference against the targets (no grpc-baseline)")
    p.add_argument("--auth", action="store_true", help="as --tls, with token authentication and authorization at "
                   "the broker (an HS256 secret and a super-user token made for the run); both flags: TLS + auth")


def _metrics_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics", action="store_true", help="measure twice in this run, metrics off (no HTTP port) and "
                   "then on (/metrics of every process scraped every second), and print the on/off throughput "
                   "ratio against the target >= 0.95 (perf/metrics_cost.py; no grpc-baseline)")


def _metrics_pair(measure_one: Callable[[bool], list[Result]]) -> tuple[list[Result], list[Ratio], list[dict]]:
    """Metrics off, then on (same shape), and metrics_cost's verdict on each pair."""
    from bksim.perf import metrics_cost

    off = measure_one(False)
    on = measure_one(True)
    ratios, targets = [], []
    for a, b in zip(off, on):
        q, t = metrics_cost.compare(a, b)
        ratios.append(q)
        targets += t
    return off + on, ratios, targets


def _secured_pair(measure_one: Callable[[bool, bool], list[Result]], tls: bool, auth: bool
                  ) -> tuple[list[Result], list[Ratio], list[dict]]:
    """The plain measurement, then the secured one (same shape), and security_cost's verdicts on each pair."""
    from bksim.perf import security_cost

    plain = measure_one(False, False)
    secured = measure_one(tls, auth)
    ratios, targets = [], []
    for p, s in zip(plain, secured):
        q, t = security_cost.compare(p, s)
        ratios.append(q)
        targets += t
    return plain + secured, ratios, targets


def _inflight(p: argparse.ArgumentParser) -> None:
    from bksim.perf.grpc_baseline import INFLIGHT_DEFAULT

    p.add_argument("--inflight", type=int, default=INFLIGHT_DEFAULT,
                   help=f"unacknowledged batches per stream (default {INFLIGHT_DEFAULT})")


# ---------------------------------------------------------------------------------------------- commands
def cmd_fsync_baseline(args) -> int:
    from bksim.perf import fsync_baseline

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        combos = ([(r, g) for r in fsync_baseline.SWEEP_RECORD_BYTES for g in fsync_baseline.SWEEP_GROUPS]
                  if args.sweep else [(args.record_bytes, args.group)])
        results = []
        for record_bytes, group in combos:
            label = f"fsync-baseline {record_bytes} B x {group}"
            results.append(fsync_baseline.run(workdir, record_bytes, group, args.seconds, args.records, idle(label)))
        return results, []

    return _run("fsync-baseline", args, measure)


def cmd_journal_append(args) -> int:
    from bksim.perf import fsync_baseline, journal_append

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        base = fsync_baseline.run(workdir, args.record_bytes, args.group, args.seconds, args.records,
                                  idle("fsync-baseline"))
        subject = journal_append.run(workdir, args.record_bytes, args.group, args.seconds, args.records,
                                     per_append=args.per_append, flush_when_idle=args.flush_when_idle, depth=args.depth,
                                     cpu_idle_before=idle("journal-append"))
        return [base, subject], [ratio(subject, base, journal_append.TARGET_RATIO)]

    return _run("journal-append", args, measure)


def cmd_grpc_baseline(args) -> int:
    from bksim.perf import grpc_baseline

    def measure(workdir: str, idle: Callable[[str], float]) -> tuple[list[Result], list[Ratio]]:
        return [grpc_baseline.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                      args.records, idle)], []

    return _run("grpc-baseline", args, measure)


def cmd_bookie_add(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.perf import bookie_add

    config = cfgload.load(args.config)  # the bookie process loads the same file (and environment) itself

    def measure_metrics(workdir: str, idle: Callable[[str], float]):
        def one(metrics: bool) -> list[Result]:
            return [bookie_add.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                       args.records, idle, config, config_path=args.config, keep=args.keep,
                                       metrics=metrics)]
        return _metrics_pair(one)

    def measure(workdir: str, idle: Callable[[str], float]):
        results, ratios, targets = bookie_add.measure_against_baseline(
            workdir, args.record_bytes, args.group, args.inflight, args.seconds, args.records, idle, config,
            config_path=args.config, py_spy_out=args.py_spy, keep=args.keep)
        if args.breakdown:
            from bksim.perf import engine_add

            base, bookie = results
            engine = engine_add.measure(workdir, args.record_bytes, args.group, args.inflight, args.seconds,
                                        args.records, config.bookie, idle("engine-add"))
            results, targets = results + [engine], targets + [engine_add.ceiling(base, bookie, engine)]
        return results, ratios, targets

    if args.metrics and args.breakdown:
        from bksim.model.errors import ConfigError
        raise ConfigError("--metrics and --breakdown are two different runs: give one")
    if args.metrics:
        return _run("bookie-add", args, measure_metrics, shape="metrics off, then on (scraped every second)")
    return _run("bookie-add", args, measure)


def cmd_ledger_write(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.formats.entry import HEADER_BYTES
    from bksim.model.errors import ConfigError
    from bksim.perf import ledger_write

    _check_shape(args)
    if args.rate is not None and args.rate <= 0:
        raise ConfigError("--rate must be > 0 entries/s")
    if args.window <= 0:
        raise ConfigError("--window must be > 0")
    if args.rate is None and args.record_bytes < HEADER_BYTES:
        raise ConfigError(f"--entry-size must be >= {HEADER_BYTES} (grpc-baseline sends whole entries of that size)")
    config = cfgload.load(args.config)  # the bookie and broker processes load the same file (and environment)
    shape = ledger_write.Shape(args.ensemble, args.write_quorum, args.ack_quorum)
    rates = [None] if args.both or args.rate is None else [args.rate]

    def measure_secured(workdir: str, idle: Callable[[str], float]):
        plain_rates: list[float | None] = []  # what the plain run offered: the secured run offers the same

        def one(tls: bool, auth: bool) -> list[Result]:
            secured = tls or auth
            results = ledger_write.measure(workdir, shape, args.record_bytes, args.group, args.window, args.seconds,
                                           args.records, plain_rates if secured else rates, idle, config,
                                           config_path=args.config, keep=args.keep,
                                           half_after_max=args.both and not secured, tls=tls, auth=auth)
            if not secured:
                plain_rates[:] = [r.extra.get("rate_target_per_s") for r in results]
            return results
        results, ratios, targets = _secured_pair(one, args.tls, args.auth)
        return results, ratios, targets + ledger_write.targets(results)

    def measure(workdir: str, idle: Callable[[str], float]):
        return ledger_write.measure_against_baseline(workdir, shape, args.record_bytes, args.group, args.window,
                                                     args.seconds, args.records, rates, idle, config,
                                                     config_path=args.config, keep=args.keep,
                                                     half_after_max=args.both)

    loop = (f"open loop at {args.rate:,.0f} entries/s, latency from each batch's due time" if args.rate
            else "closed loop, then open loop at half the maximum; " if args.both else "closed loop; ")
    if args.rate is None:
        loop += "latency per entry = its batch's response time"
    secured = _secured_words(args)
    return _run("ledger-write", args, measure_secured if secured else measure,
                shape=f"{shape}, entry {args.record_bytes} B, batch {args.group}, window {args.window}, {loop}"
                      + (f"; plain, then {secured}" if secured else ""))


def _secured_words(args) -> str:
    """"" without --tls/--auth; else what the secured run adds."""
    parts = (["TLS on every gRPC link"] if getattr(args, "tls", False) else []) + \
        (["token auth + authorization (super-user)"] if getattr(args, "auth", False) else [])
    return " + ".join(parts)


def cmd_recovery(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import recovery

    _check_shape(args)
    if args.entries < 2:
        raise ConfigError("--entries must be >= 2")
    if not -1 <= args.lac < args.entries - 1:
        raise ConfigError(f"--lac must be in -1..{args.entries - 2}")
    config = cfgload.load(args.config)
    shape = recovery.Shape(args.ensemble, args.write_quorum, args.ack_quorum)

    def measure(workdir: str, idle: Callable[[str], float]):
        results = recovery.measure(workdir, shape, args.entries, args.record_bytes, args.lac, args.group, idle,
                                   config, config_path=args.config, keep=args.keep)
        return results, [], recovery.targets(results)

    return _run("recovery", args, measure,
                shape=f"{shape}, {args.entries} entries of {args.record_bytes} B written by a dying writer with "
                      f"LAC {args.lac}; time = the client's OpenLedger(recover=true) call")


def cmd_cursor_holes(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import cursor_holes

    if args.entries < 2 or args.ledger_entries < 1 or args.bookies < 1:
        raise ConfigError("need --entries >= 2, --ledger-entries >= 1 and --bookies >= 1")
    config = cfgload.load(args.config)

    def measure(workdir: str, idle: Callable[[str], float]):
        results, report = cursor_holes.measure(workdir, args.entries, args.ledger_entries, args.pattern, args.bookies,
                                               idle, config, config_path=args.config, keep=args.keep)
        return results, [], cursor_holes.targets(report)

    return _run("cursor-holes", args, measure,
                shape=f"{args.entries:,} entries in ledgers of {args.ledger_entries:,}, {args.pattern} acks, "
                      f"{args.bookies} bookies; times: persist = one forced snapshot, recover = ManagedCursor.open")


def cmd_failover(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import failover

    if args.session_timeout_ms < 4_000 or args.rate < 1 or args.message_size < 8 or args.bookies < 2:
        raise ConfigError("need --session-timeout-ms >= 4000 (2 ZooKeeper ticks), --rate >= 1, --message-size >= 8 "
                          "and --bookies >= 2")
    config = cfgload.load(args.config)
    os.makedirs(args.dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="failover-", dir=args.dir)
    try:
        result = failover.measure(workdir, config, bookies=args.bookies, session_timeout_ms=args.session_timeout_ms,
                                  rate=args.rate, message_bytes=args.message_size, config_path=args.config)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(result)
    return 0 if result.lost == 0 and result.stored_twice == 0 else 1


def cmd_produce(args) -> int:
    return _topic_perf(args, "produce")


def cmd_consume(args) -> int:
    return _topic_perf(args, "consume")


def _topic_perf(args, name: str) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import consume as perf_consume, produce as perf_produce
    from bksim.perf.ledger_write import Shape

    _check_shape(args)
    if args.partitions < 0 or args.max_pending < 1:
        raise ConfigError("need --partitions >= 0 and --max-pending >= 1")
    if name == "consume" and (args.rate <= 0 or args.receiver_queue < 1 or args.record_bytes < 8):
        raise ConfigError("need --rate > 0, --receiver-queue >= 1 and --message-size >= 8 (the e2e timestamp)")
    config = cfgload.load(args.config)
    shape = Shape(args.ensemble, args.write_quorum, args.ack_quorum)

    def measure(workdir: str, idle: Callable[[str], float]):
        common = dict(config=config, config_path=args.config, keep=args.keep)
        if name == "produce" and args.metrics:
            def one_metrics(metrics: bool) -> list[Result]:
                return perf_produce.measure(workdir, shape, args.record_bytes, args.group, args.max_pending,
                                            args.partitions, args.seconds, args.records, idle, metrics=metrics,
                                            **common)
            results, ratios, targets = _metrics_pair(one_metrics)
            return results, ratios, targets + perf_produce.targets(results)
        if name == "produce" and _secured_words(args):
            def one(tls: bool, auth: bool) -> list[Result]:
                return perf_produce.measure(workdir, shape, args.record_bytes, args.group, args.max_pending,
                                            args.partitions, args.seconds, args.records, idle, tls=tls, auth=auth,
                                            **common)
            results, ratios, targets = _secured_pair(one, args.tls, args.auth)
            return results, ratios, targets + perf_produce.targets(results)
        if name == "produce":
            results = perf_produce.measure(workdir, shape, args.record_bytes, args.group, args.max_pending,
                                           args.partitions, args.seconds, args.records, idle, **common)
        else:
            results = perf_consume.measure(workdir, shape, args.record_bytes, args.group, args.max_pending,
                                           args.partitions, args.seconds, args.records, args.receiver_queue,
                                           args.rate, idle, **common)
            return results, perf_consume.ratios(results), perf_produce.targets(results) + perf_consume.targets(results)
        return results, [], perf_produce.targets(results)

    topic = f"{args.partitions} partitions" if args.partitions else "non-partitioned"
    what = ("closed loop, latency per message = send_async -> receipt" if name == "produce" else
            "a backlog produced (as perf produce) and drained (latency = the receive() call), then end-to-end at "
            f"{args.rate:,.0f} msgs/s (latency = due time -> received)")
    secured = _secured_words(args)
    return _run(name, args, measure, shape=f"{shape}, {topic} topic, {args.record_bytes} B messages, batches of "
                                           f"<= {args.group}, max pending {args.max_pending}; {what}"
                                           + (f"; plain, then {secured}" if secured else "")
                                           + ("; metrics off, then on (scraped every second)"
                                              if getattr(args, "metrics", False) else ""))


def cmd_audit(args) -> int:
    from bksim.model.errors import ConfigError
    from bksim.perf import audit as perf_audit

    try:
        size = perf_audit.parse_size(args.size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.record_bytes <= 0:
        raise ConfigError("--entry-size must be > 0")

    repeat, args.repeat = args.repeat, 1  # the runs repeat inside one measurement: two kinds of ratio per run

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        results = []
        for _ in range(repeat):
            results += perf_audit.measure(workdir, size, args.record_bytes, args.master, idle, log=log,
                                          keep=args.keep)[0]
        ratios = perf_audit.ratios(results)
        return results, ratios, perf_audit.targets(ratios)

    return _run("audit", args, measure,
                shape=f"{args.size} of journals ({args.record_bytes} B entries, 3 bookies, E=3 Qw=2 Qa=2): a bare parse "
                      f"vs bksim audit --local (job time) vs --master "
                      f"{' and '.join(m for _, m in perf_audit.spark_runs(args.master))} (after the session is up)")


def cmd_rereplication(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import audit as perf_audit, rereplication

    try:
        size = perf_audit.parse_size(args.size)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_shape(args)
    if args.ensemble > rereplication.BOOKIES - 1:
        raise ConfigError(f"--ensemble must be <= {rereplication.BOOKIES - 1}: a replacement outside it is needed")
    if args.seconds <= 0 or args.writer_rate <= 0:
        raise ConfigError("--seconds and --writer-rate must be > 0")
    if args.standalone_workers < 0 or not 0 <= args.worker_nice <= 19:
        raise ConfigError("--standalone-workers must be >= 0 and --worker-nice within 0..19")
    config = cfgload.load(args.config)
    data_shape = rereplication.Shape(args.ensemble, args.write_quorum, args.ack_quorum)

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        results, targets = rereplication.measure(workdir, size, args.record_bytes, args.seconds, args.writer_rate,
                                                 data_shape, idle, config, config_path=args.config, keep=args.keep,
                                                 log=log, standalone_workers=args.standalone_workers,
                                                 worker_nice=args.worker_nice)
        return results, [], targets

    return _run("rereplication", args, measure,
                shape=f"{args.size} of closed {data_shape} ledgers ({args.record_bytes} B entries) on 5 bookies, one "
                      f"lost for good (kill -9); ledger-write E=3 Qw=3 Qa=2 closed loop and a concurrent writer at "
                      f"{args.writer_rate:,.0f} entries/s, {args.seconds:g} s each; autorecovery "
                      + (f"in {args.standalone_workers} standalone process(es) at nice {args.worker_nice}"
                         if args.standalone_workers else "inside every bookie"))


def cmd_compaction(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import compaction as perf_compaction

    try:
        shape = perf_compaction.Shape(args.log_mb, args.live, args.record_bytes, args.writer_rate, args.seconds,
                                      args.during_logs)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config = cfgload.load(args.config)

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        return perf_compaction.measure(workdir, shape, idle, config, log=log)

    rate = config.bookie.compaction_rate_bytes_per_s
    return _run("compaction", args, measure,
                shape=f"in-process engine (real files, RocksDB), entry logs of {args.log_mb} MiB, {args.record_bytes} B "
                      f"entries, live {args.live:g}; scan and compaction of one log (unthrottled), then a writer at "
                      f"{args.writer_rate:,.0f} adds/s alone and while {args.during_logs} more logs are compacted at "
                      + (f"{rate / 2**20:g} MiB/s" if rate else "no rate limit") + "; writer phase without")


def cmd_replay(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import audit as perf_audit, replay as perf_replay

    try:
        shape = perf_replay.Shape(perf_audit.parse_size(args.size), args.record_bytes)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config = cfgload.load(args.config)

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        return perf_replay.measure(workdir, shape, idle, config, log=log)

    return _run("replay", args, measure,
                shape=f"in-process engine (real files, RocksDB), {args.size} of {args.record_bytes} B entries in "
                      f"{perf_replay.LEDGERS} ledgers journaled with no checkpoint, then a crash; a bare parse of the "
                      f"journals vs a fresh engine's start() (write cache "
                      f"{config.bookie.write_cache_bytes_max / 2**20:g} MiB)")


def cmd_soak(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import soak

    if args.minutes <= 0 or args.rate <= 0 or args.sample_s <= 0 or args.record_bytes < 1:
        raise ConfigError("need --minutes > 0, --rate > 0, --sample-s > 0 and --message-size >= 1")
    config = cfgload.load(args.config)
    args.seconds = args.minutes * 60.0

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        return soak.measure(workdir, config, minutes=args.minutes, rate=args.rate, message_bytes=args.record_bytes,
                            sample_s=args.sample_s, idle=idle, png=args.png, config_path=args.config, keep=args.keep,
                            log=log)

    return _run("soak", args, measure, shape=soak.describe(args.rate, args.record_bytes))


def cmd_scale(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.formats.entry import HEADER_BYTES
    from bksim.model.errors import ConfigError
    from bksim.perf import scale

    axes = list(scale.AXES) if args.axis == "all" else [args.axis]
    if args.points and len(axes) > 1:
        raise ConfigError("--points belongs to one --axis (topics, subscriptions, ledgers or entry-size)")
    if args.seconds <= 0:
        raise ConfigError("--seconds must be > 0")
    try:
        points = {a: scale.parse_points(a, args.points) if args.points else scale.default_points(a) for a in axes}
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config = cfgload.load(args.config)
    largest = min(config.bookie.entry_bytes_max, config.bookie.frame_bytes_max - 64 * 1024)
    if "entry-size" in axes and not all(HEADER_BYTES <= size <= largest for size in points["entry-size"]):
        raise ConfigError(f"entry sizes must be within {HEADER_BYTES}..{largest} bytes (header included)")

    def measure(workdir: str, idle: Callable[[str], float]):
        log = _human_log(args)
        return scale.measure(workdir, axes, points, args.seconds, args.png_dir, idle, config,
                             config_path=args.config, keep=args.keep, log=log)

    return _run("scale", args, measure, shape=scale.describe(axes, points, args.seconds))


def cmd_targets(args) -> int:
    from bksim.cli import config as cfgload
    from bksim.model.errors import ConfigError
    from bksim.perf import audit as perf_audit, replay as perf_replay, targets as perf_targets

    try:
        rows = perf_targets.select(args.rows)
        replay_bytes = perf_audit.parse_size(args.replay_size)
        if any(r.measurement == "replay" for r in rows):
            perf_replay.Shape(replay_bytes, perf_targets.RECORD_BYTES)  # refuses a size too small to check
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.seconds <= 0 or args.rss_seconds <= 0:
        raise ConfigError("--seconds and --rss-seconds must be > 0")
    config = cfgload.load(args.config)
    settings = perf_targets.Settings(seconds=args.seconds, rss_seconds=args.rss_seconds, replay_size=args.replay_size,
                                     replay_bytes=replay_bytes, config=config, config_path=args.config,
                                     keep=args.keep, log=_human_log(args))
    run = perf_targets.Run(rows, settings)
    status = _run("targets", args, run.measure, shape=perf_targets.describe(rows, settings), summary=run.summary)
    return 1 if run.failed else status  # a target not met is a figure, not a failure


# ---------------------------------------------------------------------------------------------- shared
def _run(name: str, args, measure: Callable[[str, Callable[[str], float]], tuple], shape: str | None = None,
         summary: Callable[[], tuple[str, dict]] | None = None) -> int:
    _check_bounds(args)
    options = harness.RunOptions(out_dir=args.dir, seconds=args.seconds, records=args.records, repeat=args.repeat,
                                 idle_min=args.idle_min, idle_wait_s=args.idle_wait_s, json=args.json, keep=args.keep,
                                 record_bytes=args.record_bytes, group=args.group, sweep=getattr(args, "sweep", False))
    with Progress(f"perf {name}", json=args.json, ticking=True) as status:
        def measure_shown(workdir: str, idle: Callable[[str], float]) -> tuple:
            def idle_shown(label: str) -> float:  # each measurement waits for idle CPUs first: a new phase
                status.phase(f"{label}: waiting for idle CPUs")
                fraction = idle(label)
                status.phase(label)
                return fraction

            return measure(workdir, idle_shown)

        return harness.run(name, options, measure_shown, shape, summary)


def _human_log(args) -> Callable[[str], None]:
    """Where a benchmark's progress lines go: stderr with --json (stdout is the JSON object), else stdout."""
    return lambda line: print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _check_shape(args) -> None:
    from bksim.ledger.quorum import QuorumError, check_quorum_sizes
    from bksim.model.errors import ConfigError

    try:
        check_quorum_sizes(args.ensemble, args.write_quorum, args.ack_quorum)
    except QuorumError as e:
        raise ConfigError(str(e)) from None


def _check_bounds(args) -> None:
    from bksim.model.errors import ConfigError

    if args.func in (cmd_recovery, cmd_cursor_holes, cmd_audit, cmd_rereplication, cmd_replay):
        pass  # bounded by --entries (audit, rereplication, replay: by --size)
    elif args.seconds <= 0 and args.records <= 0:
        raise ConfigError("give a bound: --seconds > 0 and/or --records > 0")
    if args.record_bytes <= 0 or args.group <= 0:
        raise ConfigError("--record-bytes and the group/batch size must be > 0")
    if args.repeat <= 0:
        raise ConfigError("--repeat must be > 0")
    if getattr(args, "inflight", 1) <= 0:
        raise ConfigError("--inflight must be > 0")
