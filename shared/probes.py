"""Liveness, readiness and metrics over HTTP, on one port per service.

- ``/healthz`` answers 200 whenever the event loop can serve a request: liveness must not
  depend on NATS or Kubernetes, or a dependency outage would restart every replica.
- ``/readyz`` answers 200 only when every registered readiness check passes (for example
  "NATS connected and consumers running", "watch cache synced"), else 503 listing the
  failing ones, in the style of the Kubernetes API server's verbose probe output.
- ``/metrics`` serves the process's Prometheus registry (see shared.metrics), on the probe port
  unless the configuration's ``metricsPort`` gives it a port of its own (:func:`start_metrics`).
- ``/debug/memory`` says where the process's memory was allocated, by source line, when the
  process traces its allocations (started with Python's own ``PYTHONTRACEMALLOC=<frames>``,
  which slows every allocation: for a diagnosis, not for production); 404 saying so otherwise.

aiohttp is used because it is already a dependency (kubernetes-asyncio) and
prometheus-client ships a handler for it.
"""

from __future__ import annotations

import logging
import os
import tracemalloc
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

log = logging.getLogger(__name__)

PROBE_PORT_ENV = "RESPAWN_PROBE_PORT"
DEFAULT_PROBE_PORT = 8081

ReadinessCheck = Callable[[], bool]


def probe_port(env: Mapping[str, str] | None = None, default: int = DEFAULT_PROBE_PORT) -> int:
    """The probe port from ``RESPAWN_PROBE_PORT`` (0 disables the endpoint)."""
    raw = (os.environ if env is None else env).get(PROBE_PORT_ENV, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(
            f"{PROBE_PORT_ENV}={raw!r} is not a port number; use 1-65535, or 0 to disable"
        ) from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{PROBE_PORT_ENV}={port} is out of range; use 1-65535, or 0 to disable")
    return port


class ProbeServer:
    """The HTTP endpoint. ``port=0`` here binds an ephemeral port (see :attr:`port`)."""

    def __init__(
        self,
        *,
        port: int,
        host: str = "0.0.0.0",
        checks: Mapping[str, ReadinessCheck] | None = None,
        registry: CollectorRegistry = REGISTRY,
        probes: bool = True,
        metrics: bool = True,
    ) -> None:
        self._host = host
        self._requested_port = port
        self._checks: dict[str, ReadinessCheck] = dict(checks or {})
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._paths = [
            *(("/healthz", "/readyz") if probes else ()),
            *(("/metrics",) if metrics else ()),
        ]
        app = web.Application()
        if probes:
            app.router.add_get("/healthz", self._healthz)
            app.router.add_get("/livez", self._healthz)
            app.router.add_get("/readyz", self._readyz)
            app.router.add_get("/debug/memory", self._memory)
        if metrics:
            app.router.add_get("/metrics", make_aiohttp_handler(registry))
        self._app = app

    @property
    def port(self) -> int:
        """The bound port (valid after :meth:`start`)."""
        return self._port

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        """Register (or replace) a readiness check; it must be cheap and must not block."""
        self._checks[name] = check

    def failing_checks(self) -> list[str]:
        failing = []
        for name, check in self._checks.items():
            try:
                ok = bool(check())
            except Exception:  # a broken check means "not ready", never a 500
                log.exception("readiness check %s raised", name)
                ok = False
            if not ok:
                failing.append(name)
        return failing

    async def start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port)
        await site.start()
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or ()
        self._port = int(sockets[0].getsockname()[1]) if sockets else self._requested_port
        log.info("listening on %s:%d (%s)", self._host, self._port, " ".join(self._paths))

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _memory(self, request: web.Request) -> web.Response:
        if not tracemalloc.is_tracing():
            return web.Response(status=404, text=NOT_TRACING)
        group = request.query.get("group", "lineno")
        try:
            limit = int(request.query.get("limit", str(MEMORY_LINES)))
        except ValueError:
            limit = -1
        if group not in MEMORY_GROUPS or limit < 1:
            return web.Response(
                status=400, text=f"group is one of {', '.join(MEMORY_GROUPS)}; limit a positive number\n"
            )
        return web.Response(text=memory_report(tracemalloc.take_snapshot(), group=group, limit=limit))

    async def _readyz(self, _request: web.Request) -> web.Response:
        failing = self.failing_checks()
        lines = [f"[{'-' if name in failing else '+'}]{name} {'failed' if name in failing else 'ok'}"
                 for name in self._checks]  # fmt: skip
        if failing:
            lines.append(f"readyz check failed: {', '.join(failing)}")
            return web.Response(status=503, text="\n".join(lines) + "\n")
        lines.append("readyz check passed")
        return web.Response(text="\n".join(lines) + "\n")


# /debug/memory: how many allocation sites it lists unless asked (?limit=), and how it may group
# them (?group=): by source line, by file, or by the whole traceback kept (PYTHONTRACEMALLOC's
# number of frames).
MEMORY_LINES = 40
MEMORY_GROUPS = ("lineno", "filename", "traceback")
NOT_TRACING = (
    "allocations are not traced: start the process with PYTHONTRACEMALLOC=<frames> (e.g. 1) to see "
    "where its memory goes here (it slows every allocation)\n"
)


def memory_report(snapshot: tracemalloc.Snapshot, *, group: str = "lineno", limit: int = MEMORY_LINES) -> str:
    """The largest allocation sites still holding memory in ``snapshot``, one per line (size,
    count of blocks, where), after the total traced (pure)."""
    stats = snapshot.statistics(group)
    total = sum(stat.size for stat in stats)
    blocks = sum(stat.count for stat in stats)
    lines = [f"traced: {total / 2**20:.1f} MiB in {blocks:,} blocks; by {group}, largest first"]
    for stat in stats[:limit]:
        if group == "traceback":
            # Innermost frame first, then its callers.
            where = " <- ".join(f"{f.filename}:{f.lineno}" for f in reversed(stat.traceback))
        elif group == "filename":
            where = stat.traceback[0].filename
        else:
            where = str(stat.traceback[0])
        lines.append(f"{stat.size / 2**20:10.2f} MiB {stat.count:10,d}  {where}")
    return "\n".join(lines) + "\n"


async def start_probes(
    port: int,
    checks: Mapping[str, ReadinessCheck] | None = None,
    *,
    host: str = "0.0.0.0",
    registry: CollectorRegistry = REGISTRY,
    metrics: bool = True,
) -> ProbeServer | None:
    """Start the probe endpoint on ``port``, with ``/metrics`` unless ``metrics`` is false;
    ``0`` means disabled and returns None."""
    if port == 0:
        log.info("probe endpoint disabled (%s=0)", PROBE_PORT_ENV)
        return None
    server = ProbeServer(port=port, host=host, checks=checks, registry=registry, metrics=metrics)
    await server.start()
    return server


def metrics_on_probe_port(metrics_port: int | None, probe: int) -> bool:
    """Whether ``/metrics`` is served by the probe endpoint: when ``metricsPort`` is not set, or
    names the probe port itself."""
    return metrics_port is None or metrics_port == probe


async def start_metrics(
    port: int, *, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY
) -> ProbeServer | None:
    """Start an endpoint that serves only ``/metrics`` on ``port``; ``0`` means disabled and
    returns None."""
    if port == 0:
        log.info("metrics endpoint disabled (metricsPort 0)")
        return None
    server = ProbeServer(port=port, host=host, registry=registry, probes=False)
    await server.start()
    return server
