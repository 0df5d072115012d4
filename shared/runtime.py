"""What every service process does around its own work, written once.

Logging and tracing, configuration (validated at start: a bad config exits with one
clear message), the NATS connection with the streams set up, the Kubernetes client,
/healthz /readyz /metrics, and a clean shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared import eventloop, metrics
from shared.bus import Bus, BusError
from shared.kube import Kube
from shared.probes import (
    ProbeServer,
    ReadinessCheck,
    metrics_on_probe_port,
    probe_port,
    start_metrics,
    start_probes,
)
from shared.telemetry import TelemetryError, setup_telemetry

if TYPE_CHECKING:
    from shared.config import OperatorConfig

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    name: str
    config: OperatorConfig
    bus: Bus
    kube: Kube | None
    probes: ProbeServer | None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        if self.probes is not None:
            self.probes.add_check(name, check)

    def require_kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError(f"{self.name} was started without Kubernetes access")
        return self.kube


Main = Callable[[Runtime], Coroutine[Any, Any, None]]


def nats_url(config: OperatorConfig) -> str:
    return os.environ.get("NATS_URL") or config.nats.url


async def run(name: str, main: Main, *, needs_kube: bool | Callable[[OperatorConfig], bool] = True) -> int:
    try:
        telemetry = setup_telemetry(name)
    except TelemetryError as exc:
        log.error("invalid telemetry settings: %s", exc)
        return 2
    from shared.config import ConfigError, load_config

    try:
        config = load_config()
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    from shared import subjects

    subjects.set_partitions(config.scaling.partitions)
    try:
        bus = await Bus.connect(
            nats_url(config),
            name=f"respawn-{name}",
            user=os.environ.get("NATS_USER") or None,
            password=os.environ.get("NATS_PASSWORD") or None,
            creds=os.environ.get("NATS_CREDS") or config.nats.creds_file,
            nkey_seed_file=config.nats.nkey_seed_file,
            tls=config.nats.tls.to_files(),
            stream_limits=config.nats.streams.by_stream(),
            public_encoding=config.nats.public_encoding,
            inbox_prefix=os.environ.get("NATS_INBOX_PREFIX") or None,
            replicas=config.nats.stream_replicas,
            tracer_provider=telemetry.provider,
        )
        await bus.ensure_streams()
    except BusError as exc:
        log.error("cannot use NATS: %s", exc)
        return 3
    # A service may need Kubernetes only for some configurations (autopilot's node marks).
    kube = await Kube.connect() if (needs_kube(config) if callable(needs_kube) else needs_kube) else None
    metrics.set_build_info(name)
    bus.watch_lag()
    host = "127.0.0.1" if os.environ.get("RESPAWN_PROBE_LOOPBACK") else "0.0.0.0"
    probe = probe_port()
    shared_port = metrics_on_probe_port(config.metrics_port, probe)
    probes = await start_probes(
        probe,
        # Connected, and every consumer bound (a lost stream or consumer shows here until the
        # bus has re-created it: Bus.problems() says why).
        {"nats": bus.ready},
        host=host,
        metrics=shared_port,
    )
    # A port of its own (metricsPort) keeps scrapes and probes apart, e.g. for a NetworkPolicy
    # that lets the monitoring namespace reach /metrics only.
    exporter = None if shared_port else await start_metrics(config.metrics_port or 0, host=host)
    rt = Runtime(name=name, config=config, bus=bus, kube=kube, probes=probes)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, rt.stopping.set)
    work = asyncio.create_task(main(rt), name=f"{name}-main")
    stop = asyncio.create_task(rt.stopping.wait())
    code = 0
    try:
        done, _ = await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        if work in done and work.exception() is not None:
            log.error("%s stopped with an error", name, exc_info=work.exception())
            code = 1
    finally:
        log.info("%s shutting down", name)
        for task in (work, stop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if probes is not None:
            await probes.stop()
        if exporter is not None:
            await exporter.stop()
        await bus.close()
        if kube is not None:
            await kube.close()
        telemetry.shutdown()
    return code


def entry(name: str, main: Main, *, needs_kube: bool | Callable[[OperatorConfig], bool] = True) -> None:
    """Console-script entry point for a service."""
    try:
        code = eventloop.run(run(name, main, needs_kube=needs_kube), os.environ)
    except eventloop.EventLoopError as exc:
        # Before logging is set up (that happens in the loop): one line on stderr.
        print(f"{name}: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
