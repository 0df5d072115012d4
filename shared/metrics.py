"""Process-wide Prometheus metrics.

prometheus-client is the registry and the text renderer: it is the reference
implementation of the exposition format, so nothing here formats samples by hand.
This module adds get-or-create helpers (a collector may be declared by several modules
or re-imported by tests without "Duplicated timeseries" errors) and declares the bus
metrics every service shares.

Naming follows the Prometheus rules: ``respawn_`` prefix, ``_total`` counters, base
units, and only low-cardinality labels (service, stream, reason) — never a workload name.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Sequence
from importlib import metadata
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics import MetricWrapperBase, disable_created_metrics

__all__ = [
    "BUILD_INFO",
    "BUS_DEAD_LETTERED",
    "BUS_HANDLER_ERRORS",
    "BUS_HANDLER_SECONDS",
    "BUS_MESSAGES_ACKED",
    "BUS_MESSAGES_CONSUMED",
    "BUS_MESSAGES_NAKED",
    "BUS_MESSAGES_PUBLISHED",
    "BUS_MESSAGES_TERMINATED",
    "CONSUMER_ACK_PENDING",
    "CONSUMER_PENDING",
    "CONTENT_TYPE",
    "LATENCY_BUCKETS",
    "counter",
    "gauge",
    "histogram",
    "render",
    "set_build_info",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# The extra ``*_created`` series double the output for no use on a dashboard.
disable_created_metrics()  # type: ignore[no-untyped-call]

_W = TypeVar("_W", bound=MetricWrapperBase)
_lock = threading.Lock()
_declared: dict[tuple[int, str], MetricWrapperBase] = {}


def _get_or_create(
    cls: type[_W],
    name: str,
    documentation: str,
    labelnames: Sequence[str],
    registry: CollectorRegistry,
    **kwargs: object,
) -> _W:
    key = (id(registry), name)
    with _lock:
        existing = _declared.get(key)
        if existing is not None:
            if not isinstance(existing, cls) or tuple(existing._labelnames) != tuple(labelnames):
                raise ValueError(
                    f"metric {name} is already declared as {type(existing).__name__}"
                    f"{list(existing._labelnames)}; use a different name"
                )
            return existing
        metric = cls(name, documentation, labelnames=labelnames, registry=registry, **kwargs)  # type: ignore[arg-type]
        _declared[key] = metric
        return metric


def counter(
    name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry = REGISTRY
) -> Counter:
    """A counter; the same object is returned when it is declared again with the same labels.

    Give the name without ``_total``: prometheus-client appends it on exposition.
    """
    return _get_or_create(Counter, name, documentation, labelnames, registry)


def gauge(
    name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry = REGISTRY
) -> Gauge:
    return _get_or_create(Gauge, name, documentation, labelnames, registry)


def histogram(
    name: str,
    documentation: str,
    labelnames: Sequence[str] = (),
    *,
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    registry: CollectorRegistry = REGISTRY,
) -> Histogram:
    return _get_or_create(Histogram, name, documentation, labelnames, registry, buckets=tuple(buckets))


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """Every metric of ``registry`` in the Prometheus text format (serve with CONTENT_TYPE)."""
    return generate_latest(registry)


# ------------------------------------------------------------------ bus metrics

_BUS = ("service", "stream")

BUS_MESSAGES_PUBLISHED = counter(
    "respawn_bus_messages_published",
    "Messages published to JetStream and acknowledged by it.",
    ("service", "kind"),
)
BUS_MESSAGES_CONSUMED = counter(
    "respawn_bus_messages_consumed", "Messages delivered to a consumer (redeliveries included).", _BUS
)
BUS_MESSAGES_ACKED = counter(
    "respawn_bus_messages_acked", "Messages acknowledged after their handler succeeded.", _BUS
)
BUS_MESSAGES_NAKED = counter(
    "respawn_bus_messages_naked", "Messages negatively acknowledged for redelivery.", (*_BUS, "reason")
)
BUS_MESSAGES_TERMINATED = counter(
    "respawn_bus_messages_terminated",
    "Messages terminated (never redelivered), by reason.",
    (*_BUS, "reason"),
)
BUS_DEAD_LETTERED = counter(
    "respawn_bus_dead_lettered", "Messages copied to the dead-letter subject, by reason.", (*_BUS, "reason")
)
BUS_HANDLER_ERRORS = counter(
    "respawn_bus_handler_errors", "Unexpected exceptions raised by message handlers.", _BUS
)
BUS_HANDLER_SECONDS = histogram(
    "respawn_bus_handler_seconds",
    "Time spent in message handlers.",
    _BUS,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

# The lag of the durable consumers this process reads from, refreshed every
# CONSUMER_LAG_PERIOD seconds by the bus (shared.bus.Bus.watch_lag) from the server's
# consumer info; a consumer this process stopped has no series.
_CONSUMER = ("service", "stream", "consumer")
CONSUMER_PENDING = gauge(
    "respawn_bus_consumer_pending",
    "Messages of the stream that match a durable consumer of this process and were not delivered yet",
    _CONSUMER,
)
CONSUMER_ACK_PENDING = gauge(
    "respawn_bus_consumer_ack_pending",
    "Messages delivered to a durable consumer of this process and not acknowledged yet",
    _CONSUMER,
)

# ------------------------------------------------------------------ latencies

# For the incident latencies (failure to verdict, verdict to delete, failure to running again):
# from a few milliseconds (a verdict on an observation) to half an hour (a reset that waits for
# a failure grace period, a retry pause and a stuck pod's deletion).
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)

# ------------------------------------------------------------------ build

BUILD_INFO = gauge(
    "respawn_build_info",
    "Always 1: the service, Respawn's version and the Python version the process runs",
    ("service", "version", "python"),
)


def set_build_info(service: str) -> None:
    """Set ``respawn_build_info`` for this process (one series)."""
    try:
        version = metadata.version("respawn")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "unknown"
    BUILD_INFO.labels(service=service, version=version, python=platform.python_version()).set(1)
