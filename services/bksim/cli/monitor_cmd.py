"""`bksim monitor config|up|down|status`: a real Prometheus (Debian's package) scraping the local cluster.

The scrape targets come from the configuration, as `bksim cluster up` lays the cluster out: bookie i's
/metrics on <bookie.host>:<cluster.bookie_http_port_base + i - 1>, broker i's on <broker.host>:
<cluster.broker_http_port_base + i - 1> (none of a kind whose base is 0). `config` writes prometheus.yml and the
rule files under <run_dir>/monitor (adapters/prometheus_config.py, prometheus_server.py) and checks them with
`promtool check config`; `up` does the same, starts Prometheus on --host:--port (loopback only; default
127.0.0.1:9090) with its data under <run_dir>/monitor/data kept --retention, and returns once it answers
/-/ready (a running one is told to reload its files instead); `down` stops it by its pid file
(<run_dir>/pids/prometheus.pid; `bksim cluster down` does too); `status` prints its targets' health from its
API (/api/v1/targets). Exit status of `status`: 0 every target up, 1 some target down, 3 Prometheus not running.
"""
from __future__ import annotations

import json

from bksim.cli import config as loader
from bksim.model.config import Config

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9090
DEFAULT_SCRAPE_INTERVAL_S = 5.0
DEFAULT_RETENTION = "6h"
READY_TIMEOUT_S = 30.0


def register(subparsers) -> None:
    parser = subparsers.add_parser("monitor", help="a Prometheus server scraping the local cluster's /metrics",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="monitor_command", required=True)
    config = sub.add_parser("config", help="write prometheus.yml and the rule files under <run_dir>/monitor and "
                                           "check them with promtool")
    _file_options(config)
    config.set_defaults(func=cmd_config)
    up = sub.add_parser("up", help="write the files and start Prometheus on loopback (reload a running one)")
    _file_options(up)
    up.add_argument("--host", default=DEFAULT_HOST, help=f"loopback address to listen on (default {DEFAULT_HOST})")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    up.add_argument("--retention", default=DEFAULT_RETENTION,
                    help=f"how long samples are kept (Prometheus duration, default {DEFAULT_RETENTION})")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop Prometheus by its pid file (SIGTERM, bounded wait, SIGKILL)")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="Prometheus's scrape targets and their health")
    status.add_argument("--host", help="where Prometheus listens (default: from the running one's command line)")
    status.add_argument("--port", type=int, help="its port (default: from the running one's command line)")
    status.add_argument("--json", action="store_true", help="print the targets as JSON")
    status.set_defaults(func=cmd_status)


def _file_options(parser) -> None:
    parser.add_argument("--scrape-interval", type=float, default=DEFAULT_SCRAPE_INTERVAL_S, metavar="SECONDS",
                        help=f"scrape and rule evaluation interval (default {DEFAULT_SCRAPE_INTERVAL_S:g} s)")


def targets_of(config: Config):
    """The configured cluster's scrape targets (adapters.prometheus_config.ScrapeTarget)."""
    from bksim.adapters.prometheus_config import cluster_targets

    c = config.cluster
    return cluster_targets(config.bookie.host, c.bookie_http_port_base, c.bookies,
                           config.broker.host, c.broker_http_port_base, c.brokers)


def server_of(config: Config, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, retention: str = DEFAULT_RETENTION):
    from bksim.adapters.prometheus_server import PrometheusServer

    return PrometheusServer(config.cluster.run_dir, host, port, retention)


def _write(config: Config, server, scrape_interval_s: float) -> list[str]:
    from bksim.adapters.prometheus_config import MonitorConfigError
    from bksim.adapters.prometheus_server import MonitorError

    try:
        targets = targets_of(config)
        if not targets:
            raise MonitorError("no scrape targets: cluster.bookie_http_port_base and broker_http_port_base are 0")
        paths = server.write_files(targets, scrape_interval_s)
    except MonitorConfigError as e:
        raise MonitorError(str(e)) from None
    server.check_files()
    print(f"prometheus: {len(targets)} target(s): {', '.join(f'{t.node}={t.address}' for t in targets)}")
    print(f"prometheus: files checked by promtool: {', '.join(paths)}", flush=True)
    return paths


def cmd_config(args) -> int:
    config = loader.load(getattr(args, "config", None))
    _write(config, server_of(config), args.scrape_interval)
    return 0


def cmd_up(args) -> int:
    from bksim.adapters.prometheus_server import MonitorError

    config = loader.load(getattr(args, "config", None))
    server = server_of(config, args.host, args.port, args.retention)
    _write(config, server, args.scrape_interval)
    was_running = server.is_running()
    if was_running:  # it keeps the address it was started with: reload it there
        host, port = server.listen_address()
        if (host, port) != (server.host, server.port):
            print(f"prometheus: already running on {host}:{port}; reloading it there (`bksim monitor down` first "
                  f"to move it)")
            server.host, server.port = host, port
    pid = server.start()
    try:
        waited = server.wait_ready(READY_TIMEOUT_S)
    except MonitorError:
        if not was_running:
            server.stop()
        raise
    print(f"prometheus: {'reloaded' if was_running else 'started'} pid {pid} on {server.url} "
          f"(ready in {waited:.1f}s; log {server.log_path}); targets: {server.url}/targets, "
          f"alerts: {server.url}/alerts", flush=True)
    return 0


def cmd_down(args) -> int:
    config = loader.load(getattr(args, "config", None))
    return 0 if stop_monitor(config, print) else 2


def stop_monitor(config: Config, say) -> bool:
    """Stop the run directory's Prometheus by its pid file (`bksim cluster down` calls this too); False when it
    would not stop."""
    server = server_of(config)
    pid = server.pid
    if pid is None:
        return True
    if server.stop():
        say(f"prometheus: stopped pid {pid}")
        return True
    say(f"prometheus: pid {pid} would not stop")
    return False


def cmd_status(args) -> int:
    from bksim.adapters.prometheus_server import MonitorError

    config = loader.load(getattr(args, "config", None))
    server = server_of(config)
    if not server.is_running():
        print(f"prometheus: not running (no live pid in {server.pid_path})")
        return 3
    host, port = server.listen_address()
    server = server_of(config, args.host or host, args.port or port)
    server.is_running()
    try:
        active = server.api("targets?state=active")["activeTargets"]
    except MonitorError as e:
        print(f"prometheus: pid {server.pid} running, API not answering: {e}")
        return 3
    rows = [{"job": t["labels"].get("job"), "node": t["labels"].get("node"), "url": t["scrapeUrl"],
             "health": t["health"], "last_error": t.get("lastError", "")} for t in active]
    if getattr(args, "json", False):
        print(json.dumps({"pid": server.pid, "url": server.url, "targets": rows}, indent=2))
    else:
        print(f"prometheus: pid {server.pid} on {server.url}")
        for r in rows:
            print(f"  {r['node'] or '-':<10} {r['url']:<36} {r['health']:<8} {r['last_error']}")
    return 0 if rows and all(r["health"] == "up" for r in rows) else 1
