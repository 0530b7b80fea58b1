"""perf audit: how fast `bksim audit` reads journals, with Spark local[2] and with --local, against a bare parse.

Generates SIZE bytes of journals in the temp dir, as three bookies would have written them (the project's
format code: formats.journal records holding formats.entry entries, `ledgers` ledgers interleaved, E=3 Qw=2
Qa=2 striping, journals rolled at FILE_BYTES, a COOKIE per journal directory) and the metadata snapshot that
closes every ledger at its last entry, so the audit has everything to check and finds nothing wrong.

Three measurements of the same files (in the page cache: they were just written):
- bare parse (the denominator): this process reads each file and runs what any reader of a journal must do,
  with the project's code: formats.journal.scan_journal (every group's and record's CRC) and, per entry, the header
  (formats.entry.HEADER) and the digest check (CRC32C over the header and payload). No grouping, no rules;
- --local: `bksim audit --local` as a child process; its figure is the job's own time from report.json
  (parse and rules: run.timing_s.job), so interpreter start-up and imports are not counted;
- Spark: `bksim audit --master MASTER` (default local[2]) as a child process; its figure is the time after
  the SparkSession is up (run.timing_s.after_session: listing, parse, rules and writing the records as
  Parquet): the "after the session is up" of the Spark target. The session start is reported separately, and so is
  the ratio the run would have without its Parquet write (`ratio_without_parquet`: the write's JVM warm-up
  and per-row work are most of the Spark time on 2 cores);
- with a cluster MASTER (anything but local[...]: spark://HOST:PORT, yarn, k8s://...), the Spark run is on
  local[2] as above, and then a fourth, `audit-cluster`: the same audit submitted to MASTER, measured the same
  way (after the session is up), its executors reading the generated files through their paths (the temp
  directory must be shared with them: the same machine, or `--dir` on shared storage). Both Spark rates are
  printed, each with its ratio to the bare parse.

Targets: Spark (local[2], or MASTER when it is local[...]) >= 0.4x the bare parse rate after the session is up;
--local >= 0.8x. The cluster run's ratio is printed against the Spark target too, and is not one of the targets.
The child is stopped by pid (its process group, the Spark JVM with it) if the run is interrupted.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid

from bksim.adapters import processes
from bksim.bookie.cookie import Cookie
from bksim.bookie.cookie import encode as encode_cookie
from bksim.formats import entry as entry_fmt
from bksim.formats import journal as jfmt
from bksim.formats.crc import crc32c
from bksim.metadata.ledger_metadata import LedgerMetadata, encode as encode_metadata
from bksim.perf.procs import ProcessGroup
from bksim.perf.stats import LatencyRecorder, Ratio, Result, make_result, median_ratio, ratio

TARGET_SPARK = 0.4
TARGET_LOCAL = 0.8
FILE_BYTES = 64 * 1024 * 1024  # journals roll at this size (several files per bookie: Spark has parallelism)
BOOKIES = 3
LEDGERS_DEFAULT = 32
SHAPE = (3, 2, 2)  # E, Qw, Qa
MASTER_DEFAULT = "local[2]"
AUDIT_TIMEOUT_S = 3600.0  # one audit child may run at most this long
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '256MB', '64MiB', '1000000' (bytes)."""
    raw = text.strip().upper()
    digits = raw.rstrip("KMGIB")
    unit = raw[len(digits):]
    if unit not in UNITS or not digits:
        raise ValueError(f"size {text!r}: a number with an optional unit (KB, MB, GB, KiB, MiB, GiB)")
    value = int(float(digits) * UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text!r} must be > 0")
    return value


def generate(directory: str, size_bytes: int, payload_bytes: int, ledgers: int = LEDGERS_DEFAULT) -> dict:
    """Write journals of BOOKIES bookies totalling at least `size_bytes`, and snapshot.json; return the facts."""
    instance = str(uuid.uuid4())
    bookies = [f"127.0.0.1:{3181 + i}" for i in range(BOOKIES)]
    e, qw, qa = SHAPE
    files: list[str] = []
    writers = {}
    for i, bookie in enumerate(bookies):
        journal_dir = os.path.join(directory, f"bookie-{i + 1}", "journal")
        os.makedirs(journal_dir)
        with open(os.path.join(journal_dir, "COOKIE"), "wb") as f:
            f.write(encode_cookie(Cookie(bookie, instance, journal_dir, journal_dir + "-ledgers")))
        writers[bookie] = _JournalWriter(journal_dir, instance, files)
    metadata = {lid: LedgerMetadata.new([bookies[(lid + k) % BOOKIES] for k in range(e)], qw, qa)
                for lid in range(ledgers)}
    write_sets = {lid: [[md.ensemble[(x + k) % e] for k in range(qw)] for x in range(e)] for lid, md in metadata.items()}
    payload = os.urandom(payload_bytes)
    next_entry = [0] * ledgers
    lengths = [0] * ledgers
    written = records = 0
    while written < size_bytes:
        for lid in range(ledgers):
            entry_id = next_entry[lid]
            next_entry[lid] = entry_id + 1
            lengths[lid] += payload_bytes
            entry = entry_fmt.encode_entry(lid, entry_id, entry_id - 1, lengths[lid], payload)
            record = jfmt.entry_record(entry, 0)
            for bookie in write_sets[lid][entry_id % e]:
                writers[bookie].write(record)
                written += len(record)
                records += 1
    for writer in writers.values():
        writer.close()
    ledger_docs = []
    for lid, md in metadata.items():
        doc = json.loads(encode_metadata(md.closed(next_entry[lid] - 1, lengths[lid])))
        doc.pop("password")
        ledger_docs.append({"ledger_id": lid, "path": f"/ledgers/L{lid}", "version": 1, "metadata": doc})
    snapshot = os.path.join(directory, "snapshot.json")
    with open(snapshot, "w") as f:  # the documented snapshot format (audit/snapshot.py)
        json.dump({"format": "bksim-metadata-snapshot", "version": 1, "source": "perf audit (generated)",
                   "exported_at_ms": 0, "instance_id": instance, "passwords": "omitted", "ledgers": ledger_docs,
                   "managed_ledgers": [], "managed_ledgers_truncated": False}, f)
    total = sum(os.path.getsize(p) for p in files)
    return {"files": files, "bytes": total, "records": records, "entries": sum(next_entry), "ledgers": ledgers,
            "snapshot": snapshot, "journals": os.path.join(directory)}


class _JournalWriter:
    def __init__(self, directory: str, instance: str, files: list[str]) -> None:
        self.directory, self.instance, self.files = directory, instance, files
        self.journal_id = 0
        self.f = None
        self.size = 0
        self._roll()

    def _roll(self) -> None:
        if self.f is not None:
            self.f.close()
        self.journal_id += 1
        path = os.path.join(self.directory, jfmt.journal_file_name(self.journal_id))
        self.files.append(path)
        self.f = open(path, "wb", buffering=1024 * 1024)
        self.f.write(jfmt.encode_file_header(self.instance))
        self.size = jfmt.FILE_HEADER_BYTES

    def write(self, record: bytes) -> None:
        """One record in its own group write (framed, as a bookie flushing each add alone writes it)."""
        frame = jfmt.group_record([record])
        if self.size + len(frame) + len(record) > FILE_BYTES:
            self._roll()
        self.f.write(frame)
        self.f.write(record)
        self.size += len(frame) + len(record)

    def close(self) -> None:
        self.f.close()


def bare_parse(paths: list[str]) -> tuple[int, float]:
    """(records, seconds): every record's CRC and every entry's header and digest, nothing else."""
    entry_type = jfmt.RecordType.ENTRY
    header, header_bytes = entry_fmt.HEADER, entry_fmt.HEADER_BYTES
    records = bad = 0
    started = time.perf_counter()
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        for rec in jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, newest=True).records:
            records += 1
            if rec.type is entry_type:
                body = rec.body
                digest = header.unpack_from(body)[4]
                if crc32c(body[header_bytes:], crc32c(body[:32])) != digest:
                    bad += 1
    elapsed = time.perf_counter() - started
    assert bad == 0, f"{bad} entries failed their digest in generated journals"
    return records, elapsed


def run_audit(workdir: str, facts: dict, label: str, extra_args: list[str], group: ProcessGroup) -> dict:
    """Run `bksim audit` as a child process; return its report.json (the audit must find the data clean)."""
    out = os.path.join(workdir, f"audit-{label}")
    log = os.path.join(workdir, f"audit-{label}.log")
    argv = [sys.executable, "-m", "bksim.cli.main", "audit", "--journals", facts["journals"], "--metadata",
            facts["snapshot"], "--out", out, "--quiet", *extra_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    child = group.spawn(f"audit {label}", argv, log, env)
    if not processes.wait_exit(child.pid, AUDIT_TIMEOUT_S):
        group.stop(child)
        raise RuntimeError(f"bksim audit ({label}) did not finish within {AUDIT_TIMEOUT_S:.0f} s:\n{child.log_tail()}")
    group.children.remove(child)
    try:
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
    except OSError:
        raise RuntimeError(f"bksim audit ({label}) wrote no report:\n{child.log_tail()}") from None
    if report["verdict"] != "clean" or report["totals"]["records"] != facts["records"]:
        raise RuntimeError(f"bksim audit ({label}) disagrees with the generated data: verdict {report['verdict']}, "
                           f"{report['totals']['records']} records of {facts['records']}")
    return report


def _result(name: str, facts: dict, seconds: float, idle: float, extra: dict) -> Result:
    latencies = LatencyRecorder()
    latencies.add(seconds, facts["records"])
    record_bytes = max(1, facts["bytes"] // max(1, facts["records"]))
    return make_result(name, record_bytes, 1, seconds, latencies, idle,
                       {"bytes": facts["bytes"], "mb_per_s_exact": facts["bytes"] / seconds / 1e6, **extra})


def measure(workdir: str, size_bytes: int, payload_bytes: int, master: str, idle, log=print,
            keep: bool = False) -> tuple[list[Result], dict]:
    """Generate, then bare parse, --local and Spark on the same files. Returns the results and the facts. Each
    call works in a fresh directory under `workdir`, removed at the end unless `keep`."""
    run_dir = tempfile.mkdtemp(prefix="run-", dir=workdir)
    try:
        return _measure(run_dir, size_bytes, payload_bytes, master, idle, log)
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def _measure(workdir: str, size_bytes: int, payload_bytes: int, master: str, idle, log) -> tuple[list[Result], dict]:
    started = time.perf_counter()
    facts = generate(os.path.join(workdir, "journals"), size_bytes, payload_bytes)
    log(f"# generated {facts['bytes'] / 1e6:,.1f} MB: {facts['records']:,} records in {len(facts['files'])} journals "
        f"of {BOOKIES} bookies, {facts['ledgers']} ledgers (E={SHAPE[0]} Qw={SHAPE[1]} Qa={SHAPE[2]}) in "
        f"{time.perf_counter() - started:.1f} s")
    group = ProcessGroup()
    try:
        idle_bare = idle("bare parse")
        records, bare_s = bare_parse(facts["files"])
        assert records == facts["records"]
        bare = _result("audit-bare-parse", facts, bare_s, idle_bare, {})

        idle_local = idle("audit --local")
        report = run_audit(workdir, facts, "local", ["--local"], group)
        t = report["run"]["timing_s"]
        local = _result("audit-local", facts, t["job"], idle_local,
                        {"parse_s": t["parse"], "check_s": t["check"], "process_s": t["total"]})

        results = [bare, local]
        for name, spark_master in spark_runs(master):
            idle_spark = idle(f"audit --master {spark_master}")
            report = run_audit(workdir, facts, name, ["--master", spark_master], group)
            t = report["run"]["timing_s"]
            results.append(_result(name, facts, t["after_session"], idle_spark,
                                   {"session_s": t["session"], "plan_s": t["plan"], "parse_s": t["parse"],
                                    "check_s": t["check"], "parquet_s": t["parquet"], "process_s": t["total"],
                                    "master": spark_master, "ratio_without_parquet":
                                    round(bare_s / max(1e-9, t["after_session"] - t["parquet"]), 3)}))
    finally:
        group.stop_all()
    return results, facts


def spark_runs(master: str) -> list[tuple[str, str]]:
    """(result name, master) of the Spark runs: MASTER alone when it is local[...], else local[2] then MASTER."""
    if master.startswith("local"):
        return [("audit-spark", master)]
    return [("audit-spark", MASTER_DEFAULT), ("audit-cluster", master)]


def ratios(results: list[Result]) -> list[Ratio]:
    """Spark / bare and --local / bare for each run (each run starts with its bare parse; then --local, Spark,
    and the cluster run when there was one), then the median of each over the runs when there were several."""
    runs: list[dict[str, Result]] = []
    for result in results:
        if result.name == "audit-bare-parse":
            runs.append({})
        assert runs and result.name not in runs[-1], f"results out of order at {result.name}"
        runs[-1][result.name] = result
    out: list[Ratio] = []
    for run in runs:
        bare = run["audit-bare-parse"]
        out += [ratio(run["audit-spark"], bare, TARGET_SPARK), ratio(run["audit-local"], bare, TARGET_LOCAL)]
        if "audit-cluster" in run:
            out.append(ratio(run["audit-cluster"], bare, TARGET_SPARK))
    if len(runs) > 1:
        medians = []
        for name in ("audit-spark", "audit-local", "audit-cluster"):
            kind = [q for q in out if q.subject == name]
            if kind:
                medians.append(median_ratio(kind))
        out += medians
    return out


def targets(all_ratios: list[Ratio]) -> list[dict]:
    """The two targets, judged on the last ratio of each kind (the median when there were runs)."""
    out = []
    for name, what in (("audit-spark", "Spark after the session is up"), ("audit-local", "--local")):
        kind = [q for q in all_ratios if q.subject.startswith(name)]
        if kind:
            q = kind[-1]
            out.append({"target": f"{what} >= {q.target:g}x the bare parse rate",
                        "value": f"{q.records_per_s_ratio:.2f}x" + (f" ({q.subject})" if "median" in q.subject else ""),
                        "met": q.met})
    return out
