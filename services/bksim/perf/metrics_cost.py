"""The cost of metrics in one benchmark invocation: the same measurement with metrics off and then on.

Off: the processes have no HTTP port, so nothing serves or collects `/metrics` (the pure layers' latency
histograms are recorded either way: model/histogram.py, a bisect and three additions per journal group, add
batch or topic entry, which no switch removes). On: every bookie and broker has an HTTP port and a `Scraper`
fetches every process's `/metrics` at its start and then every SCRAPE_INTERVAL_S during the measurement (15x Prometheus's usual 15 s,
so the cost is an upper bound), each scrape checked to be a 200 with the families expected.

`compare(off, on)`: the throughput Ratio on / off against TARGET_THROUGHPUT_RATIO (metrics cost at most 5 % of
throughput) and its verdict. `bksim perf bookie-add --metrics` and `perf produce --metrics` run the pair
(off first); with --repeat N they alternate.
"""
from __future__ import annotations

import threading
import time
import urllib.request

from bksim.perf.stats import Ratio, Result, ratio

TARGET_THROUGHPUT_RATIO = 0.95  # metrics cost <= 5 % of throughput
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 10.0


class Scraper:
    """Fetch `/metrics` of every port every `interval_s` on a thread until stop(); counts scrapes and bytes.
    A failed scrape (not 200, no `expect` family, unreachable) is kept in `errors` (the run reports it)."""

    def __init__(self, ports: list[int], expect: str, interval_s: float = SCRAPE_INTERVAL_S,
                 host: str = "127.0.0.1") -> None:
        self.urls = [f"http://{host}:{port}/metrics" for port in ports]
        self.expect = expect
        self.interval_s = interval_s
        self.scrapes = 0
        self.bytes = 0
        self.scrape_s = 0.0  # time spent waiting for answers, summed
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(SCRAPE_TIMEOUT_S * (len(self.urls) + 1))

    def scrape_once(self) -> None:
        for url in self.urls:
            started = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as r:
                    body = r.read()
                if f"# TYPE {self.expect}".encode() not in body and f"\n{self.expect}".encode() not in body:
                    self.errors.append(f"{url}: no {self.expect} in the answer")
                self.scrapes += 1
                self.bytes += len(body)
            except OSError as e:
                self.errors.append(f"{url}: {e}")
            self.scrape_s += time.monotonic() - started

    def _run(self) -> None:
        while True:  # the first scrape at once: even a run shorter than the interval is scraped
            self.scrape_once()
            if self._stop.wait(self.interval_s):
                return

    def extra(self) -> dict:
        return {"scrapes": self.scrapes, "scrape_bytes_mean": self.bytes // self.scrapes if self.scrapes else 0,
                "scrape_ms_mean": 1000 * self.scrape_s / self.scrapes if self.scrapes else 0.0,
                "scrape_interval_s": self.interval_s, "scrape_errors": len(self.errors)}


def compare(off: Result, on: Result) -> tuple[Ratio, list[dict]]:
    """The throughput Ratio (on over off) and the target's verdict ({"target", "value", "met"})."""
    q = ratio(on, off, TARGET_THROUGHPUT_RATIO)
    scrapes = on.extra.get("scrapes", 0)
    return q, [{"target": f"{on.name} / {off.name} throughput >= {TARGET_THROUGHPUT_RATIO:.2f}x (metrics cost "
                          f"<= {100 * (1 - TARGET_THROUGHPUT_RATIO):.0f}%)",
                "value": f"{on.records_per_s:,.0f}/s vs {off.records_per_s:,.0f}/s = {q.records_per_s_ratio:.3f}x "
                         f"({scrapes} scrapes every {on.extra.get('scrape_interval_s', SCRAPE_INTERVAL_S):g} s)",
                "met": q.met}]
