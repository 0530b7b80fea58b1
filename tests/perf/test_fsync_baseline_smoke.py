from perf.perf_smoke_checks import assert_figures


def test_fsync_baseline_reports_figures(run_perf):
    report = run_perf("fsync-baseline", "--record-bytes", "512", "--group", "4", "--records", "200")
    [result] = report["results"]
    assert_figures(result, "fsync-baseline", 200, 512, 4)
    assert result["syncs"] == 50  # 200 records in groups of 4, one fdatasync each
    assert report["ratios"] == []
