"""`bksim broker run` and `bksim broker list`: the broker's composition root.

`run` wires the real adapters together and owns the broker's life cycle:

    load config -> resolve defaults (broker id) -> print effective config -> connect ZooKeeper
    -> LedgerService over RenewingZkMetadataStore + GrpcBookieTransport -> gRPC server
    -> register /brokers/available/<id> (ephemeral; re-registered on every new session)
    -> serve until SIGTERM/SIGINT
    -> health NOT_SERVING, refuse new calls, close the ledgers it writes (a clean stop leaves nothing to
       recover), stop the server (shutdown_grace_ms) -> deregister -> close the ZooKeeper session

A broker keeps no state of its own: kill -9 loses nothing acknowledged; its open ledgers are recovered by
whoever opens them next (any broker, `bksim ledger recover ID`).

Log lines go to stderr: "<ISO time> broker <id> <message>".
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import sys
from datetime import datetime
from typing import Callable

from bksim.adapters.serving_process import settle_process
from bksim.cli import config as cfgload
from bksim.cli.bookie_cmd import ZK_CONNECT_TIMEOUT_S, _close_zk, _until_stopped, _STOPPED
from bksim.model.config import Config, parse_address_overrides
from bksim.model.errors import ConfigError, MetadataError, NodeExistsError



def register(subparsers) -> None:
    broker = subparsers.add_parser("broker", help="run one broker, or list the brokers registered in ZooKeeper")
    family = broker.add_subparsers(dest="broker_command", required=True)
    run = family.add_parser("run", help="run one broker in the foreground until SIGTERM/SIGINT",
                            description="Run one broker: the ledger client behind a gRPC API, registered in "
                                        "ZooKeeper. Options come from the TOML file and BKSIM_<SECTION>_<OPTION> "
                                        "variables.")
    run.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    run.set_defaults(func=cmd_run)
    lst = family.add_parser("list", help="brokers registered in ZooKeeper")
    lst.add_argument("--config", default=argparse.SUPPRESS, help="TOML configuration file")
    lst.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lst.set_defaults(func=cmd_list)


def resolve(config: Config) -> Config:
    r = config.broker
    if not r.broker_id and r.port <= 0:
        raise ConfigError("broker.port must be > 0 when broker.broker_id is empty (the id is <host>:<port>)")
    return dataclasses.replace(config, broker=dataclasses.replace(r, broker_id=r.broker_id or f"{r.host}:{r.port}"))


def make_log(broker_id: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        stamp = datetime.now().astimezone().isoformat(timespec="milliseconds")
        sys.stderr.write(f"{stamp} broker {broker_id} {message}\n")
        sys.stderr.flush()
    return log


def cmd_run(args) -> int:
    config = resolve(cfgload.load(getattr(args, "config", None)))
    log = make_log(config.broker.broker_id)
    cfgload.print_effective(config, f"broker {config.broker.broker_id}")
    return asyncio.run(_serve(config, log))


def registration_data(config: Config) -> bytes:
    r = config.broker
    return json.dumps({"broker_id": r.broker_id, "host": r.host, "port": r.port, "http_port": r.http_port,
                       "pid": os.getpid()},
                      sort_keys=True).encode()


async def _register(store, config: Config, log) -> None:
    from bksim.metadata.paths import broker_path

    path = broker_path(config.broker.broker_id)
    try:
        await store.create(path, registration_data(config), ephemeral=True, make_parents=True)
    except NodeExistsError:
        # a predecessor's node (kill -9) lives until its session expires: wait it out, never delete it
        # (deleting could hide a second broker running with the same id)
        deadline = asyncio.get_running_loop().time() + 3 * config.zookeeper.session_timeout_ms / 1000 + 2
        while True:
            if asyncio.get_running_loop().time() > deadline:
                raise MetadataError(path, "registered by another live session (is this broker already running?)")
            await asyncio.sleep(0.2)
            try:
                await store.create(path, registration_data(config), ephemeral=True, make_parents=True)
                break
            except NodeExistsError:
                continue
    log(f"registered {path}")


async def _serve(config: Config, log: Callable[[str], None]) -> int:
    from bksim.adapters import registration
    from bksim.adapters.bookie_transport import GrpcBookieTransport, registration_resolver
    from bksim.adapters.broker_server import BrokerServer
    from bksim.adapters.clock import SystemClock
    from bksim.adapters.zk_metadata import RenewingZkMetadataStore
    from bksim.broker.ledgers import LedgerService
    from bksim.security.tls import channel_security

    r = config.broker
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = store = transport = service = server = topics = http = None
    try:
        connected = await _until_stopped(stop, asyncio.to_thread(
            registration.connect_config, config, ZK_CONNECT_TIMEOUT_S))
        if connected is _STOPPED:
            return 0
        client = connected
        await asyncio.to_thread(registration.ensure_layout, client)

        async def on_new_session(new_store) -> None:
            log("ZooKeeper session expired and renewed: registering again")
            if topics is not None:  # the ownership znodes went with the old session
                await topics.session_lost()
            await _register(new_store, config, log)

        store = RenewingZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                        read_tries_max=config.zookeeper.read_tries_max,
                                        on_new_session=on_new_session)
        overrides = parse_address_overrides(r.bookie_address_overrides)
        if overrides:
            log(f"bookie address overrides: {', '.join(f'{k} -> {v}' for k, v in sorted(overrides.items()))}")
        transport = GrpcBookieTransport(registration_resolver(store, overrides=overrides),
                                        timeout_ms=r.bookie_timeout_ms,
                                        add_window_max=r.add_window_max,
                                        tls=channel_security(config.security))
        service = LedgerService(store=store, transport=transport, rng=random.SystemRandom(), clock=SystemClock(),
                                config=r, log=log)
        topics = make_topic_service(config, store, service, SystemClock(), log)
        server = BrokerServer(service, r, log, topics=topics, security=config.security)
        port = await server.start()
        topics.start()
        log(f"gRPC server listening on {r.host}:{port} (health SERVING, reflection on)")
        if r.http_port:
            from bksim.adapters.http_server import HttpServer, ProcessParts

            http = HttpServer(r.host, r.http_port, log)
            for routes in broker_http_routes():
                http.add_routes(routes(ProcessParts("broker", config, dict(
                    service=service, topics=topics, server=server, store=store, transport=transport))))
            await http.start()
        if await _until_stopped(stop, _register(store, config, log)) is _STOPPED:
            return 0
        log("serving")
        settle_process()
        await stop.wait()
        log("shutdown requested: unloading topics, closing the ledgers this broker writes")
        return 0
    finally:
        if http is not None:
            await http.stop()
        await _shutdown(config, log, client, store, transport, service, server, topics)


def broker_http_routes() -> list:
    """The features a broker serves on its HTTP port: each a function of the process's ProcessParts that
    returns aiohttp routes (adapters/http_server.py)."""
    from bksim.adapters import http_broker_admin
    from bksim.adapters.dashboard import dashboard_routes
    from bksim.adapters.metrics import broker_metrics_routes

    return [dashboard_routes, http_broker_admin.routes, broker_metrics_routes]


def make_topic_service(config: Config, store, ledgers, clock, log):
    """The topic layer over this broker's ledger client, with durable cursors (ManagedCursor)."""
    from bksim.topics.managed_cursor import ManagedCursor
    from bksim.topics.service import TopicService

    async def open_cursor(ml, topic_name, subscription, initial_position, on_fenced):
        return await ManagedCursor.open(layout=ml, path=topic_name.cursor_path(subscription), name=subscription,
                                        store=store, ledgers=ledgers, clock=clock, config=config.topic,
                                        initial_position=initial_position, log=log, on_fenced=on_fenced)

    r = config.broker
    return TopicService(store=store, ledgers=ledgers, clock=clock, broker_id=r.broker_id,
                        address=f"{r.host}:{r.port}", open_cursor_factory=open_cursor, config=config.topic,
                        broker_config=r, log=log)


async def _shutdown(config: Config, log, client, store, transport, service, server, topics=None) -> None:
    r = config.broker
    if server is not None:
        server.servicer.begin_drain()
        if server.topics_servicer is not None:
            server.topics_servicer.begin_drain()
    if topics is not None:
        try:
            await asyncio.wait_for(topics.close(), r.shutdown_grace_ms / 1000)
        except TimeoutError:
            log("unloading topics took longer than shutdown_grace_ms; the next owner recovers the rest")
    if service is not None:
        try:
            await asyncio.wait_for(service.close(close_ledgers=True), r.shutdown_grace_ms / 1000)
        except TimeoutError:
            log("closing ledgers took longer than shutdown_grace_ms; the rest stay OPEN for recovery")
    if server is not None:
        await server.stop(r.shutdown_grace_ms)
        log(f"gRPC server stopped ({server.servicer.appended} entries appended)")
    if transport is not None:
        await transport.close()
    if store is not None:
        store.close()
    if client is not None:
        from bksim.adapters.registration import call_bounded

        zk_bound_s = config.zookeeper.session_timeout_ms / 1000
        try:
            await call_bounded(lambda: _close_zk(client), zk_bound_s)
            log("ZooKeeper session closed; bye")
        except TimeoutError:
            log(f"closing the ZooKeeper session gave up after {zk_bound_s:.1f} s; bye")


def cmd_list(args) -> int:
    from bksim.adapters import registration
    from bksim.metadata.paths import BROKERS_AVAILABLE

    config = cfgload.load(getattr(args, "config", None))
    client = registration.connect_config(config, ZK_CONNECT_TIMEOUT_S)
    try:
        rows = []
        if client.exists(BROKERS_AVAILABLE):
            for name in sorted(client.get_children(BROKERS_AVAILABLE)):
                try:
                    data, _ = client.get(f"{BROKERS_AVAILABLE}/{name}")
                    rows.append(json.loads(data or b"{}") | {"broker_id": name})
                except Exception:  # noqa: BLE001 - vanished meanwhile or garbage: show the id only
                    rows.append({"broker_id": name})
    finally:
        _close_zk(client)
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2, sort_keys=True))
    elif not rows:
        print("no brokers registered")
    else:
        print(f"{'BROKER':<24} {'ADDRESS':<22} PID")
        for row in rows:
            print(f"{row['broker_id']:<24} {str(row.get('host', '?')) + ':' + str(row.get('port', '?')):<22} "
                  f"{row.get('pid', '?')}")
    return 0
