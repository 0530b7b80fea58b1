"""The journal audit: prove, from the bytes on the bookies' disks, that the cluster kept its promises.

Reads every bookie's journals (live and archived), optionally their entry logs, and a metadata snapshot;
parses the records with the project's own `formats` code (one parser for the bookie and the audit) and
checks the invariants of PROTOCOL.md §7 that disk contents can prove or refute. Two drivers run the same
plain functions: `--local` (one Python process) and PySpark (any master; the same report).

    inputs.py    which files belong to which bookie (cookies, BOOKIE=DIR), journal order, evidence
    parse.py     one file -> FileResult: integrity findings and per-ledger columnar blocks of records
    rules.py     one ledger -> LedgerResult: replica counts, divergence, fencing, LAC (pure functions)
    snapshot.py  the metadata snapshot: export over the MetadataStore port, load and validate
    report.py    report.json (and strip_timing), exit status
    html.py      report.html (inline SVG charts)
    local.py     the --local driver;  spark.py  the PySpark driver;  job.py  what both share

Sibling of adapters/sim/chaos/perf (tests/architecture/test_dependency_rule.py): imports model, formats,
metadata, ports, bookie (cookie and lastmark decoding only) and pyspark; never adapters, sim or chaos.
ZooKeeper is read by the CLI (the composition root), which hands the snapshot in as data.
"""
