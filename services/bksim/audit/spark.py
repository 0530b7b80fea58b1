"""The PySpark driver: the same parse and rules as --local, on executors, over any Hadoop file system.

Job shape (the environment notes' fastest measured path on this machine): `sc.binaryFiles` (one record per
file) -> mapPartitions(parse.parse_file), persisted; from it (1) each file's summary and findings, collected;
(2) per-ledger Pieces -> groupByKey -> rules.check_ledger with the metadata broadcast, collected; (3) the
records DataFrame (parse.RECORD_COLUMNS) written as Parquet for ad-hoc Spark SQL. Blocks are arrays, which
pickle as raw bytes, so the shuffle moves few large objects rather than one Python object per record.

A quiet session (`build_session`): UI off, console progress off, log level ERROR (a log4j2 file in the work
directory), spark.local.dir and java.io.tmpdir under the run's work directory, modest driver memory, loopback
only for local masters and for a standalone master on loopback (`spark://127.0.0.1:PORT`, `make audit-cluster`):
the driver then binds and advertises 127.0.0.1, so the executors reach it there. Progress: a thread polls the status tracker and prints stage progress lines.

Submitting to a cluster: `--master spark://HOST:7077` (client mode) ships the bksim package to the executors
(a zip added with addPyFile); the executors' Python needs the `crc32c` package (PYSPARK_PYTHON may name a
venv that has it), and every input path must be readable from every executor (shared storage).
"""
from __future__ import annotations

import os
import sys
import threading
import time
import zipfile

from bksim.audit.inputs import Plan, normalize
from bksim.audit.job import AuditOptions, Progress, file_output, missing_ledgers, pieces_of
from bksim.audit.parse import BLOCK_ARRAYS, RECORD_COLUMNS, block_rows, other_rows, parse_file
from bksim.audit.rules import check_ledger
from bksim.audit.snapshot import AuditInputError, Snapshot
from bksim.formats.entry import HEADER_BYTES

DRIVER_MEMORY_DEFAULT = "1g"
PROGRESS_INTERVAL_S = 2.0
PARTITIONS_MAX = 1000  # binaryFiles partitions asked for at most (one per file up to this)
LOG4J2 = """status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def build_session(master: str, work_dir: str, driver_memory: str = DRIVER_MEMORY_DEFAULT):
    """A SparkSession configured to keep a laptop quiet (see the module docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    loopback = local or is_loopback_master(master)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local_dir = os.path.abspath(os.path.join(work_dir, "spark-local"))
    os.makedirs(local_dir, exist_ok=True)
    log4j = os.path.join(local_dir, "log4j2.properties")
    with open(log4j, "w") as f:
        f.write(LOG4J2)
    java_options = f"-Dlog4j2.configurationFile=file:{log4j} -Djava.io.tmpdir={local_dir}"
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("bksim-audit")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.local.dir", local_dir)
               .config("spark.driver.memory", driver_memory)
               .config("spark.driver.extraJavaOptions", java_options)
               .config("spark.executor.extraJavaOptions", java_options)
               .config("spark.sql.shuffle.partitions", "8")
               .config("spark.python.worker.reuse", "true"))
    if loopback:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    if not local:
        _ship_package(spark, local_dir)
    # bring the executors' Python workers up (they are reused by every job after): part of starting the session
    sc.parallelize(range(sc.defaultParallelism), sc.defaultParallelism).map(_noop).count()
    return spark


def is_loopback_master(master: str) -> bool:
    """True for a standalone master on this machine's loopback: spark://127.x.y.z:PORT or spark://localhost:PORT."""
    if not master.startswith("spark://"):
        return False
    hosts = [h.rsplit(":", 1)[0] for h in master[len("spark://"):].split(",")]  # HA: spark://h1:p1,h2:p2
    return all(h == "localhost" or h.startswith("127.") for h in hosts)


def _noop(x):
    return x


def _ship_package(spark, work_dir: str) -> None:
    """Zip the bksim package and add it to the executors' Python path (cluster masters)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../bksim
    path = os.path.join(work_dir, "bksim.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for dirpath, dirnames, filenames in os.walk(package):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    z.write(full, os.path.relpath(full, os.path.dirname(package)))
    spark.sparkContext.addPyFile(path)


class SparkFiles:
    """FileSource over the Hadoop FileSystem API (local paths, hdfs://, s3a://, ... as configured)."""

    def __init__(self, spark) -> None:
        self._sc = spark.sparkContext

    def list(self, root: str) -> list[tuple[str, int]]:
        jvm = self._sc._jvm
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(self._sc._jsc.hadoopConfiguration())
        if not fs.exists(path) or not fs.getFileStatus(path).isDirectory():
            raise AuditInputError(f"{root}: no such directory")
        out = []
        files = fs.listFiles(fs.makeQualified(path), True)
        while files.hasNext():
            status = files.next()
            out.append((status.getPath().toString(), status.getLen()))
        return out

    def read(self, uris: list[str]) -> dict[str, bytes]:
        """Small files (cookies, checkpoint marks), through the FileSystem API on the driver: no Spark job."""
        jvm = self._sc._jvm
        conf = self._sc._jsc.hadoopConfiguration()
        out = {}
        for uri in uris:
            path = jvm.org.apache.hadoop.fs.Path(uri)
            stream = path.getFileSystem(conf).open(path)
            try:
                out[uri] = bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
            finally:
                stream.close()
        return out


def _check_uris(uris: list[str]) -> None:
    bad = [u for u in uris if "," in u]
    if bad:
        raise AuditInputError(f"paths with a comma cannot be read by Spark's binaryFiles: {bad[0]}")


class _StageProgress:
    """Prints the active stages' task counts every PROGRESS_INTERVAL_S while a job runs."""

    def __init__(self, sc, progress: Progress) -> None:
        self._sc, self._progress = sc, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-progress", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=PROGRESS_INTERVAL_S * 2)

    def _run(self) -> None:
        last = ""
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            try:
                tracker = self._sc.statusTracker()
                parts = []
                for stage_id in sorted(tracker.getActiveStageIds()):
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        parts.append(f"stage {stage_id} ({info.name.split(' at ')[0]}): "
                                     f"{info.numCompletedTasks}/{info.numTasks} tasks")
                line = "; ".join(parts)
            except Exception:  # noqa: BLE001 - the session is stopping: progress is best effort
                return
            if line and line != last:
                self._progress(line)
                last = line


def records_frame(spark, parsed):
    """The records DataFrame (parse.RECORD_COLUMNS) of an RDD of FileResults: entries travel as one row of
    column lists per (file, ledger), zipped back into rows inside the JVM; the few other records as rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

    types = {"string": StringType(), "long": LongType(), "int": IntegerType()}
    kinds = dict(RECORD_COLUMNS, entry_bytes="long")
    block_schema = StructType([StructField("bookie", StringType()), StructField("file", StringType()),
                               StructField("source", StringType()), StructField("ledger", LongType())]
                              + [StructField(c, ArrayType(types[kinds[c]], False)) for c in BLOCK_ARRAYS])
    blocks = spark.createDataFrame(parsed.flatMap(block_rows), block_schema, verifySchema=False)
    entries = blocks.select("bookie", "file", "source", "ledger", F.inline(F.arrays_zip(*BLOCK_ARRAYS))) \
        .withColumn("type", F.lit("ENTRY")).withColumn("length", F.col("entry_bytes") - HEADER_BYTES)
    others = spark.createDataFrame(parsed.flatMap(other_rows), StructType(
        [StructField(name, types[kind], True) for name, kind in RECORD_COLUMNS]), verifySchema=False)
    columns = [name for name, _ in RECORD_COLUMNS]
    return entries.select(*columns).unionByName(others.select(*columns))


def run_spark(spark, plan: Plan, snapshot: Snapshot, options: AuditOptions, progress: Progress) -> tuple[list, list, dict]:
    sc = spark.sparkContext
    from pyspark import StorageLevel

    started = time.perf_counter()
    tasks = {t.path: t for t in plan.tasks}
    uris = [t.uri for t in plan.tasks]
    _check_uris(uris)
    views = sc.broadcast(snapshot.ledgers)
    evidence = plan.evidence()
    per_ledger_max = options.findings_per_ledger_max

    def parse_partition(items):
        for uri, data in items:
            yield parse_file(tasks[normalize(uri)], data)

    def read_and_parse(items):  # local files: each executor reads its own, nothing passes through the JVM
        for task in items:
            with open(task.path, "rb") as f:
                data = f.read()
            yield parse_file(task, data)

    def check(item):
        ledger_id, pieces = item
        return check_ledger(ledger_id, views.value.get(ledger_id), list(pieces), evidence, per_ledger_max)

    partitions = max(1, min(len(uris), PARTITIONS_MAX))
    progress(f"parsing {len(uris)} files ({plan.total_bytes / 1e6:,.1f} MB) on {sc.master}")
    if all(uri.startswith("file:") for uri in uris):
        ordered = sorted(plan.tasks, key=lambda t: -t.size)  # the largest first: fewer stragglers
        source = sc.parallelize(ordered, partitions).mapPartitions(read_and_parse)
    else:
        source = sc.binaryFiles(",".join(uris), minPartitions=partitions).mapPartitions(parse_partition)
    parsed = source.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with _StageProgress(sc, progress):
            files = parsed.map(file_output).collect()
            parse_done = time.perf_counter()
            progress(f"parsed {len(files)} files; checking ledgers")
            ledgers = parsed.flatMap(pieces_of).groupByKey(max(1, sc.defaultParallelism * 2)).map(check).collect()
            ledgers += missing_ledgers((r.ledger for r in ledgers), snapshot, evidence, per_ledger_max)
            check_done = time.perf_counter()
            outputs: dict = {"records_parquet": None}
            if options.parquet:
                path = os.path.abspath(os.path.join(options.out_dir, "records.parquet"))
                progress(f"writing the records as Parquet to {path}")
                records_frame(spark, parsed).write.mode("overwrite").parquet(path)
                outputs["records_parquet"] = path
            else:
                outputs["records_parquet_skipped"] = "--no-parquet"
    finally:
        parsed.unpersist()
        views.unpersist()
    done = time.perf_counter()
    run = {"mode": "spark", "master": sc.master,
           "timing_s": {"parse": round(parse_done - started, 3), "check": round(check_done - parse_done, 3),
                        "parquet": round(done - check_done, 3), "job": round(done - started, 3)},
           "outputs": outputs}
    return files, ledgers, run
