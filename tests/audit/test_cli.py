"""`bksim audit` as a command: exit status 1 on violations (listed on stdout, shown first in report.html), 2 on
unusable input with a message naming it; `--json` prints the summary. Synthetic inputs (audit/synth.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from audit.synth import Synth

TIMEOUT_S = 60.0


def bksim(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=TIMEOUT_S)


def test_violations_exit_1_and_lead_the_report(tmp_path):
    synth = Synth(str(tmp_path / "cluster"))
    synth.ledger(1, 3, 2, 2, 10, skip={4: set(synth.bookies)})
    synth.save()
    done = bksim("audit", "--journals", synth.root, "--metadata", synth.snapshot_path, "--out", "out", "--local",
                 cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("audit: VIOLATIONS (1 violations)")
    assert "  gap: ledger 1 entries 4..4: held by 0 of the segment's bookies" in done.stdout
    assert "parsed 4/4 files" in done.stderr  # progress
    html = (tmp_path / "out" / "report.html").read_text()
    assert "VIOLATIONS: 1 finding(s)" in html and html.index("VIOLATIONS") < html.index("<svg")
    assert "AllCommittedEntriesReachAckQuorum" in html
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    outputs = report["run"]["outputs"]
    try:
        import pyarrow  # noqa: F401
        assert os.path.isdir(outputs["records_parquet"]) or os.path.isfile(outputs["records_parquet"])
    except ImportError:  # --local without pyarrow writes no Parquet, and says so
        assert outputs["records_parquet"] is None and "pyarrow is not installed" in outputs["records_parquet_skipped"]

    done = bksim("audit", "--journals", synth.root, "--metadata", synth.snapshot_path, "--out", "out2", "--local",
                 "--json", "--quiet", cwd=tmp_path)
    summary = json.loads(done.stdout)
    assert (done.returncode, summary["verdict"], summary["exit_status"], done.stderr) == (1, "violations", 1, "")
    assert summary["rule_counts"]["gap"]["entries"] == 1


def test_unusable_input_exits_2_and_says_why(tmp_path):
    synth = Synth(str(tmp_path / "cluster"))
    synth.ledger(1, 3, 2, 2, 2)
    synth.save()
    missing = bksim("audit", "--journals", str(tmp_path / "nope"), "--metadata", synth.snapshot_path, "--out", "o",
                    "--local", cwd=tmp_path)
    assert missing.returncode == 2 and f"{tmp_path / 'nope'}: no such directory" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    done = bksim("audit", "--journals", synth.root, "--metadata", str(bad), "--out", "o", "--local", cwd=tmp_path)
    assert done.returncode == 2 and "not a bksim metadata snapshot" in done.stderr
    done = bksim("audit", "--journals", synth.root, "--out", "o", "--local", cwd=tmp_path)
    assert done.returncode == 2 and "--metadata" in done.stderr  # one of --metadata / --zookeeper is required
