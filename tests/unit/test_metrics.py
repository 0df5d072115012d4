"""Metrics in Prometheus text format, and the probe/metrics HTTP endpoint."""

from __future__ import annotations

import inspect
import platform
import socket
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from shared import metrics
from shared.probes import ProbeServer, metrics_on_probe_port, probe_port, start_metrics, start_probes


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counter_renders_with_total_suffix_and_labels() -> None:
    registry = CollectorRegistry()
    c = metrics.counter("respawn_test_resets", "Resets started.", ("cause",), registry=registry)
    c.labels(cause="PodFailed").inc()
    c.labels(cause="PodFailed").inc()
    c.labels(cause="AutopilotNoExecute").inc()
    text = metrics.render(registry)
    assert b"# HELP respawn_test_resets_total Resets started." in text
    assert b"# TYPE respawn_test_resets_total counter" in text
    got = samples(text)
    assert got[("respawn_test_resets_total", (("cause", "PodFailed"),))] == 2
    assert got[("respawn_test_resets_total", (("cause", "AutopilotNoExecute"),))] == 1
    assert not any(name.endswith("_created") for name, _ in got)  # disabled on purpose


def test_gauge_and_histogram_render() -> None:
    registry = CollectorRegistry()
    g = metrics.gauge("respawn_test_queue_depth", "Keys waiting.", registry=registry)
    g.set(3)
    h = metrics.histogram("respawn_test_latency_seconds", "Latency.", buckets=(0.1, 1.0), registry=registry)
    h.observe(0.05)
    h.observe(0.5)
    h.observe(5)
    got = samples(metrics.render(registry))
    assert got[("respawn_test_queue_depth", ())] == 3
    assert got[("respawn_test_latency_seconds_bucket", (("le", "0.1"),))] == 1
    assert got[("respawn_test_latency_seconds_bucket", (("le", "1.0"),))] == 2
    assert got[("respawn_test_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    assert got[("respawn_test_latency_seconds_count", ())] == 3
    assert got[("respawn_test_latency_seconds_sum", ())] == pytest.approx(5.55)


def test_declaring_again_returns_the_same_metric() -> None:
    registry = CollectorRegistry()
    first = metrics.counter("respawn_test_again", "Doc.", ("a",), registry=registry)
    assert metrics.counter("respawn_test_again", "Doc.", ("a",), registry=registry) is first


def test_declaring_a_name_with_another_type_or_labels_is_an_error() -> None:
    registry = CollectorRegistry()
    metrics.counter("respawn_test_clash", "Doc.", ("a",), registry=registry)
    with pytest.raises(ValueError, match="already declared as Counter"):
        metrics.gauge("respawn_test_clash", "Doc.", ("a",), registry=registry)
    with pytest.raises(ValueError, match="already declared"):
        metrics.counter("respawn_test_clash", "Doc.", ("b",), registry=registry)


def test_bus_metrics_are_in_the_default_registry() -> None:
    metrics.BUS_DEAD_LETTERED.labels(service="unit", stream="S", reason="invalid").inc()
    got = samples(metrics.render())
    assert (
        got[
            ("respawn_bus_dead_lettered_total", (("reason", "invalid"), ("service", "unit"), ("stream", "S")))
        ]
        >= 1
    )
    names = {name for name, _ in got}
    assert "respawn_bus_dead_lettered_total" in names


# ------------------------------------------------------------------ probes


def test_probe_port_from_env() -> None:
    assert probe_port({}) == 8081
    assert probe_port({"RESPAWN_PROBE_PORT": "9090"}) == 9090
    assert probe_port({"RESPAWN_PROBE_PORT": "0"}) == 0
    with pytest.raises(ValueError, match="not a port number"):
        probe_port({"RESPAWN_PROBE_PORT": "http"})
    with pytest.raises(ValueError, match="out of range"):
        probe_port({"RESPAWN_PROBE_PORT": "70000"})


async def test_port_zero_disables_the_endpoint() -> None:
    assert await start_probes(0) is None


@pytest.fixture
async def probes() -> AsyncIterator[ProbeServer]:
    server = ProbeServer(port=0, host="127.0.0.1")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def get(server: ProbeServer, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{server.port}{path}") as resp,
    ):
        return resp.status, await resp.text()


async def test_healthz_answers_while_the_loop_runs(probes: ProbeServer) -> None:
    probes.add_check("nats", lambda: False)  # liveness ignores readiness checks
    assert await get(probes, "/healthz") == (200, "ok\n")


async def test_readyz_follows_its_checks(probes: ProbeServer) -> None:
    state = {"nats": False}
    probes.add_check("nats", lambda: state["nats"])
    probes.add_check("cache-synced", lambda: True)
    status, body = await get(probes, "/readyz")
    assert status == 503
    assert "[-]nats failed" in body and "[+]cache-synced ok" in body
    state["nats"] = True
    status, body = await get(probes, "/readyz")
    assert status == 200
    assert "readyz check passed" in body


async def test_readyz_treats_a_raising_check_as_not_ready(probes: ProbeServer) -> None:
    def broken() -> bool:
        raise RuntimeError("oops")

    probes.add_check("broken", broken)
    status, body = await get(probes, "/readyz")
    assert status == 503
    assert "[-]broken failed" in body


async def test_metrics_endpoint_serves_the_registry(probes: ProbeServer) -> None:
    metrics.BUS_MESSAGES_PUBLISHED.labels(service="probe-test", kind="verdict").inc()
    status, body = await get(probes, "/metrics")
    assert status == 200
    got = samples(body.encode())
    assert (
        got[("respawn_bus_messages_published_total", (("kind", "verdict"), ("service", "probe-test")))] == 1
    )


# ------------------------------------------------------------------ metricsPort


def test_metrics_share_the_probe_port_unless_metrics_port_names_another() -> None:
    assert metrics_on_probe_port(None, 8081)
    assert metrics_on_probe_port(8081, 8081)
    assert not metrics_on_probe_port(9090, 8081)
    assert not metrics_on_probe_port(0, 8081)  # no /metrics anywhere


async def test_a_metrics_port_of_its_own_serves_metrics_and_no_probes() -> None:
    exporter = await start_metrics(_free_port(), host="127.0.0.1")
    assert exporter is not None
    try:
        status, body = await get(exporter, "/metrics")
        assert status == 200 and "respawn_bus_messages_published_total" in body
        assert (await get(exporter, "/healthz"))[0] == 404
        assert (await get(exporter, "/readyz"))[0] == 404
    finally:
        await exporter.stop()
    assert await start_metrics(0) is None  # metricsPort 0: not served


async def test_the_probe_port_without_metrics_serves_only_the_probes() -> None:
    server = await start_probes(_free_port(), {"ok": lambda: True}, host="127.0.0.1", metrics=False)
    assert server is not None
    try:
        assert (await get(server, "/metrics"))[0] == 404
        assert (await get(server, "/healthz"))[0] == 200
        assert (await get(server, "/readyz"))[0] == 200
    finally:
        await server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_build_info_names_the_service_version_and_python() -> None:
    metrics.set_build_info("unit")
    got = samples(metrics.render())
    series = [labels for (name, labels), value in got.items() if name == "respawn_build_info" and value == 1]
    mine = [dict(labels) for labels in series if dict(labels)["service"] == "unit"]
    assert len(mine) == 1
    assert mine[0]["python"] == platform.python_version()
    assert mine[0]["version"] not in ("", "unknown")  # the installed package's version


async def test_debug_memory_says_how_to_trace_when_allocations_are_not_traced(probes: ProbeServer) -> None:
    assert not tracemalloc.is_tracing()
    status, text = await get(probes, "/debug/memory")
    assert status == 404
    assert "PYTHONTRACEMALLOC" in text


async def test_debug_memory_lists_the_largest_allocation_sites(probes: ProbeServer) -> None:
    tracemalloc.start(2)
    try:
        held = [bytearray(4096) for _ in range(2000)]  # about 8 MiB, allocated on this line
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
        status, text = await get(probes, "/debug/memory?limit=5")
        assert status == 200
        header, *sites = text.splitlines()
        assert header.startswith("traced: ") and header.endswith("by lineno, largest first")
        assert len(sites) == 5
        assert sites[0].endswith(f"{__file__}:{line}"), sites[0]
        assert float(sites[0].split()[0]) >= 7.5  # MiB
        status, text = await get(probes, "/debug/memory?group=traceback&limit=1")
        assert status == 200 and f"{__file__}:{line} <- " in text.splitlines()[1]
        status, text = await get(probes, "/debug/memory?group=filename&limit=1")
        assert text.splitlines()[1].endswith(__file__)
        for bad in ("group=module", "limit=0", "limit=many"):
            assert (await get(probes, f"/debug/memory?{bad}"))[0] == 400
        assert len(held) == 2000
    finally:
        tracemalloc.stop()
