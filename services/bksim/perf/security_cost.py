"""The cost of security in one benchmark invocation: the same measurement on a plain cluster and on a secured
one (TLS on every gRPC link and/or token authentication with authorization at the brokers), judged together.

`compare(plain, secured)`: the throughput ratio secured / plain (target >= TARGET_THROUGHPUT_RATIO: TLS and
auth cost at most 30 % of the throughput) and the p99 difference secured - plain in ms (target <=
TARGET_P99_EXTRA_MS, judged only on an open-loop pair at the same offered rate: in a closed loop the latency is
the queue the maximum rate builds, not the cost of a request; nor when either run left entries unsent behind
its schedule). Pure: the benchmarks measure, this module only judges. Both runs of a pair have the same
shape, record size and batch; `bksim perf ledger-write --tls` and `perf produce --tls --auth` run the plain
measurement first and the secured one right after it, and with --repeat N they alternate (N pairs).
"""
from __future__ import annotations

from bksim.perf.stats import Ratio, Result, ratio

TARGET_THROUGHPUT_RATIO = 0.70  # TLS + auth cost <= 30 % of throughput
TARGET_P99_EXTRA_MS = 2.0  # ... and <= +2 ms p99


def compare(plain: Result, secured: Result) -> tuple[Ratio, list[dict]]:
    """The throughput Ratio (secured over plain) and the two targets' verdicts ({"target", "value", "met"})."""
    q = ratio(secured, plain, TARGET_THROUGHPUT_RATIO)
    extra_ms = secured.p99_ms - plain.p99_ms
    open_loop = secured.extra.get("mode") == "open-loop" and plain.extra.get("mode") == "open-loop" \
        and secured.extra.get("rate_target_per_s") == plain.extra.get("rate_target_per_s")
    unsent = open_loop and any(r.extra.get("entries_unsent_behind_schedule") for r in (plain, secured))
    targets = [
        {"target": f"{secured.name} / {plain.name} throughput >= {TARGET_THROUGHPUT_RATIO:.2f}x",
         "value": f"{secured.records_per_s:,.0f}/s vs {plain.records_per_s:,.0f}/s = "
                  f"{q.records_per_s_ratio:.2f}x", "met": q.met},
        {"target": f"{secured.name} p99 <= {plain.name} p99 + {TARGET_P99_EXTRA_MS:g} ms",
         "value": f"p99 {secured.p99_ms:.2f} ms vs {plain.p99_ms:.2f} ms = {extra_ms:+.2f} ms"
                  + ("" if open_loop else " (closed loop: latency is mostly queueing at the maximum rate; judged "
                                          "on an open-loop pair at one rate: ledger-write --rate or --both)")
                  + (" (a run did not sustain the offered rate: not comparable)" if unsent else ""),
         "met": (extra_ms <= TARGET_P99_EXTRA_MS) if open_loop and not unsent else None},
    ]
    return q, targets
