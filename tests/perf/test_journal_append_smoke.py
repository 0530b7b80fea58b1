from perf.perf_smoke_checks import assert_figures


def test_journal_append_reports_figures_and_ratio(run_perf):
    report = run_perf("journal-append", "--record-bytes", "256", "--group", "8", "--records", "400")
    base, journal = report["results"]
    assert_figures(base, "fsync-baseline", 400, 256, 8)
    assert_figures(journal, "journal-append", 400, 256, 8)
    assert journal["producers"] == 8 and journal["syncs"] > 0
    assert journal["mean_group_records"] > 0
    [q] = report["ratios"]
    assert (q["subject"], q["baseline"], q["target"]) == ("journal-append", "fsync-baseline", 0.5)
    assert q["ratio"] > 0
