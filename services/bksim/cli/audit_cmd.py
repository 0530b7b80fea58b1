"""`bksim audit`: the journal audit (audit/), composed here: where the metadata comes from (a snapshot file, or
ZooKeeper read through the adapters), which driver runs (PySpark, or --local), where the outputs go.

    bksim audit --journals DIR... [--entrylogs DIR...] (--metadata FILE | --zookeeper HOST:PORT) --out DIR
                [--master local[*] | spark://HOST:7077 | ...] [--local] [--no-parquet]

    bksim audit cluster up [--run-dir DIR] [--port 7077] [--ui-port 8090] [--workers 2] [--worker-cores 1]
                           [--worker-memory 1g]
    bksim audit cluster status|down [--run-dir DIR]

`audit cluster`: a Spark standalone master and workers on loopback (adapters/spark_standalone.py), for
`--master spark://127.0.0.1:7077`; the audit's own options are then not asked for (they are checked here, not
by argparse, so that the subcommand can do without them).

Writes DIR/report.json, DIR/report.html and (Spark) DIR/records.parquet; progress lines go to stderr, a summary
to stdout (on a terminal, without --json or --quiet, the progress is one status line instead: the current
phase and the elapsed time, cli/progress.py). Exit status: 0 clean, 1 violations, 2 unusable input (a missing directory, an unreadable snapshot,
journals whose bookie cannot be told, ZooKeeper unreachable).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from bksim.cli.progress import Progress

RUN_DIR_DEFAULT = os.path.join(".run", "spark")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit", help="replay bookie journals and prove durability against the ledger metadata",
        description="Parse every bookie's journals (live and archived) and optionally entry logs, and check them "
        "against the ledger metadata: record integrity, replicas per entry (>= Qa, gaps), divergence, writes after "
        "a fence, LAC order. DIR may be BOOKIE=DIR when no COOKIE tells whose it is. Exit 0 clean, 1 violations, "
        "2 unusable input.")
    p.add_argument("--journals", nargs="+", metavar="DIR",
                   help="directories searched recursively for journals (<16 hex>.txn): journal directories, "
                        "journal_archive_dirs, or a whole run directory")
    p.add_argument("--entrylogs", nargs="+", default=[], metavar="DIR",
                   help="ledger (or entrylogs/) directories: entries whose journals were deleted still count")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--metadata", metavar="FILE", help="a snapshot from `bksim metadata export --out FILE`")
    source.add_argument("--zookeeper", metavar="HOST:PORT", help="read the metadata from this ZooKeeper now")
    p.add_argument("--out", metavar="DIR", help="where report.json, report.html and records.parquet go")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*]): local[N], spark://HOST:PORT, "
                   "yarn, k8s://...")
    p.add_argument("--local", action="store_true", help="no Spark: the same checks in this process (local paths only)")
    p.add_argument("--no-parquet", action="store_true", help="do not write the records as Parquet")
    p.add_argument("--driver-memory", default=None, help="Spark driver memory (default 1g)")
    p.add_argument("--findings-max", type=int, default=None,
                   help="findings listed per class in report.json (default 10000; counts stay exact)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file (for --zookeeper timeouts)")
    p.set_defaults(func=cmd_audit, audit_parser=p)
    _register_cluster(p)


def _register_cluster(audit_parser) -> None:
    from bksim.adapters import spark_standalone as ss

    sub = audit_parser.add_subparsers(dest="audit_command", metavar="cluster", title="subcommands")
    cluster = sub.add_parser("cluster", help="a Spark standalone cluster on loopback to submit the audit to",
                             description="A Spark standalone master and workers on 127.0.0.1, from the PySpark "
                             "installation's jars, started and stopped by pid (pid files and logs in the run "
                             "directory). Then: bksim audit --master spark://127.0.0.1:PORT ...")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    up = actions.add_parser("up", help="start the master and the workers; wait until the workers are ALIVE")
    down = actions.add_parser("down", help="stop the workers and the master (by pid)")
    status = actions.add_parser("status", help="the daemons' pids and what the master's JSON status says")
    for q in (up, down, status):
        q.add_argument("--run-dir", default=RUN_DIR_DEFAULT,
                       help=f"pid files, logs, cluster.json and the workers' directories (default {RUN_DIR_DEFAULT})")
    up.add_argument("--port", type=int, default=ss.PORT_DEFAULT,
                    help=f"the master's port (default {ss.PORT_DEFAULT}); worker i takes PORT+i")
    up.add_argument("--ui-port", type=int, default=ss.UI_PORT_DEFAULT,
                    help=f"the master's web UI and JSON status (default {ss.UI_PORT_DEFAULT}); worker i's: UI_PORT+i")
    up.add_argument("--workers", type=int, default=ss.WORKERS_DEFAULT,
                    help=f"worker processes (default {ss.WORKERS_DEFAULT})")
    up.add_argument("--worker-cores", type=int, default=ss.WORKER_CORES_DEFAULT,
                    help=f"cores each worker offers (default {ss.WORKER_CORES_DEFAULT})")
    up.add_argument("--worker-memory", default=ss.WORKER_MEMORY_DEFAULT,
                    help=f"memory each worker offers, >= one executor's 1g (default {ss.WORKER_MEMORY_DEFAULT})")
    up.add_argument("--timeout", type=float, default=ss.READY_TIMEOUT_S,
                    help=f"seconds to wait for the workers to register (default {ss.READY_TIMEOUT_S:.0f})")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    up.set_defaults(func=cmd_cluster_up)
    down.set_defaults(func=cmd_cluster_down)
    status.set_defaults(func=cmd_cluster_status)


def cmd_cluster_up(args) -> int:
    from bksim.adapters import spark_standalone as ss

    config = ss.StandaloneConfig(run_dir=args.run_dir, port=args.port, ui_port=args.ui_port, workers=args.workers,
                                 worker_cores=args.worker_cores,
                                 worker_memory_mb=ss.parse_memory_mb(args.worker_memory))
    cluster = ss.StandaloneCluster(config)
    started = time.monotonic()
    pids = cluster.up(args.timeout)
    waited = time.monotonic() - started
    workers = ", ".join(str(pids[name]) for name in cluster.worker_names())
    plural = "s" if config.workers != 1 else ""
    print(f"Spark standalone master {config.master_url} (pid {pids['master']}), {config.workers} worker{plural} ALIVE "
          f"(pids {workers}; {config.worker_cores} cores, {config.worker_memory_mb} MiB each) in {waited:.1f}s")
    print(f"web UI http://{config.host}:{config.ui_port}/, logs and pid files in {config.run_dir}")
    print(f"run: bksim audit --master {config.master_url} --journals ... --metadata ... --out ...")
    print(f"stop: bksim audit cluster down --run-dir {args.run_dir}")
    return 0


def cmd_cluster_down(args) -> int:
    from bksim.adapters import spark_standalone as ss

    cluster = ss.StandaloneCluster.from_run_dir(args.run_dir)
    stopped = cluster.stop()
    for name, pid in stopped.items():
        print(f"{name}: " + (f"stopped (pid {pid})" if pid else "not running"))
    return 0


def cmd_cluster_status(args) -> int:
    """Exit 0 when the master and every worker run and the master lists them ALIVE, else 1."""
    from bksim.adapters import spark_standalone as ss

    cluster = ss.StandaloneCluster.from_run_dir(args.run_dir)
    running = cluster.running()
    status = cluster.status()
    alive = cluster.alive_workers(status) if status else 0
    healthy = all(running.values()) and alive == cluster.config.workers
    apps = {k: [{"id": a.get("id"), "name": a.get("name"), "state": a.get("state")} for a in status.get(k, [])]
            for k in ("activeapps", "completedapps")} if status else {}
    doc = {"master_url": cluster.config.master_url, "ui": f"http://{cluster.config.host}:{cluster.config.ui_port}/",
           "pids": running, "master_answers": status is not None, "alive_workers": alive,
           "workers": cluster.config.workers, "healthy": healthy, **apps}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{'UP' if healthy else 'DOWN' if not any(running.values()) else 'DEGRADED'}: {doc['master_url']} "
              f"(web UI {doc['ui']}), {alive} of {cluster.config.workers} workers ALIVE")
        for name, pid in running.items():
            print(f"  {name}: " + (f"pid {pid}" if pid else "not running"))
        if status:
            print(f"  applications: {len(apps['activeapps'])} running, {len(apps['completedapps'])} completed")
    return 0 if healthy else 1


def _require_audit_options(args) -> None:
    """What argparse would have required had `audit cluster` not needed to do without it."""
    missing = [flag for flag, value in (("--journals", args.journals), ("--out", args.out)) if not value]
    if not (args.metadata or args.zookeeper):
        missing.append("--metadata or --zookeeper")
    if missing:
        args.audit_parser.error(f"the following arguments are required: {', '.join(missing)}")


def cmd_audit(args) -> int:
    _require_audit_options(args)
    started = time.perf_counter()
    with Progress("audit", json=args.json or args.quiet, ticking=True) as status:
        return _audit(args, status, started)


def _audit(args, status: Progress, started: float) -> int:
    from bksim.audit import job, report as report_mod
    from bksim.audit.inputs import ENTRYLOGS, JOURNALS, make_plan, parse_dir_arg
    from bksim.audit.snapshot import AuditInputError, load_snapshot, read_snapshot_file

    def progress(message: str) -> None:
        if status.enabled:  # a terminal: the phase on the status line, with the elapsed time
            status.phase(message)
        elif not args.quiet:
            print(f"bksim audit: {message}", file=sys.stderr, flush=True)

    if args.findings_max is not None and args.findings_max < 0:
        raise AuditInputError("--findings-max must be >= 0")
    dirs = [parse_dir_arg(d, JOURNALS) for d in args.journals] + [parse_dir_arg(d, ENTRYLOGS) for d in args.entrylogs]
    if args.metadata:
        snapshot = read_snapshot_file(args.metadata)
    else:
        from bksim.cli.metadata_cmd import snapshot_from_zookeeper

        progress(f"reading the metadata from ZooKeeper {args.zookeeper}")
        snapshot = load_snapshot(snapshot_from_zookeeper(args.zookeeper, getattr(args, "config", None)),
                                 source=f"zookeeper {args.zookeeper}")
    progress(f"metadata: {len(snapshot.ledgers)} ledgers from {snapshot.source}")
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    options = job.AuditOptions(out_dir=out_dir, parquet=not args.no_parquet,
                               **({"findings_max": args.findings_max} if args.findings_max is not None else {}))
    if args.local:
        from bksim.audit.local import LocalFiles, run_local

        plan = make_plan(dirs, LocalFiles(), snapshot.instance_id)
        progress(f"{len(plan.tasks)} files of {len(plan.bookies)} bookies, {plan.total_bytes / 1e6:,.1f} MB")
        files, ledgers, run = run_local(plan, snapshot, options, progress)
        run["timing_s"]["total"] = round(time.perf_counter() - started, 3)
    else:
        files, ledgers, run, plan = _run_spark(args, dirs, snapshot, options, progress, started)
    report, exit_status = job.finish(plan, snapshot, files, ledgers, run, options)
    status.close()  # the line is erased before the summary
    _print_summary(report, args.json)
    assert exit_status in (report_mod.EXIT_CLEAN, report_mod.EXIT_VIOLATIONS)
    return exit_status


def _run_spark(args, dirs, snapshot, options, progress, started):
    from bksim.audit.inputs import make_plan
    from bksim.audit.spark import DRIVER_MEMORY_DEFAULT, SparkFiles, build_session, run_spark

    work = os.path.join(options.out_dir, ".spark")
    progress(f"starting Spark ({args.master})")
    spark = build_session(args.master, work, args.driver_memory or DRIVER_MEMORY_DEFAULT)
    try:
        session_up = time.perf_counter()
        plan = make_plan(dirs, SparkFiles(spark), snapshot.instance_id)
        progress(f"{len(plan.tasks)} files of {len(plan.bookies)} bookies, {plan.total_bytes / 1e6:,.1f} MB")
        planned = time.perf_counter()
        files, ledgers, run = run_spark(spark, plan, snapshot, options, progress)
        run["timing_s"]["session"] = round(session_up - started, 3)
        run["timing_s"]["plan"] = round(planned - session_up, 3)
        run["timing_s"]["after_session"] = round(time.perf_counter() - session_up, 3)
        run["timing_s"]["total"] = round(time.perf_counter() - started, 3)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return files, ledgers, run, plan


def _print_summary(report: dict, as_json: bool) -> None:
    t = report["totals"]
    outputs = report["run"].get("outputs", {})
    if as_json:
        print(json.dumps({"verdict": report["verdict"], "exit_status": report["exit_status"], "totals": t,
                          "rule_counts": report["rule_counts"], "outputs": outputs}))
        return
    benign = ", ".join(f"{k} {v:,}" for k, v in report["benign_counts"].items()) or "none"
    print(f"audit: {report['verdict'].upper()} ({t['violations']:,} violations): {t['bookies']} bookies, "
          f"{t['journal_files']} journals and {t['entrylog_files']} entry logs ({t['bytes'] / 1e6:,.1f} MB, "
          f"{t['records']:,} journal records), {t['ledgers']:,} ledgers, {t['entries_checked']:,} entries checked; "
          f"{t['under_replicated_entries']:,} under-replicated, {t['unverifiable_entries']:,} unverifiable; "
          f"benign: {benign}")
    for v in report["violations"][:10]:
        where = f" {v['file']}@{v['offset']}" if "file" in v else ""
        entries = f" entries {v['first_entry']}..{v['last_entry']}" if "first_entry" in v else ""
        ledger = f" ledger {v['ledger']}" if "ledger" in v else ""
        print(f"  {v['rule']}:{ledger}{entries}{where}: {v['detail']}")
    if t["violations"] > 10:
        print(f"  ... {t['violations'] - 10:,} more in report.json")
    for w in report["warnings"][:5]:
        print(f"warning: {w}")
    files = [outputs.get("report_json"), outputs.get("report_html"), outputs.get("records_parquet")]
    print("report: " + ", ".join(f for f in files if f))
