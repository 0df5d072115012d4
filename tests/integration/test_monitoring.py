"""Metrics on running services: what deploy/monitoring queries is served, an incident is timed
from the failure to Running again, the consumer lag follows the server, and metricsPort moves
/metrics to a port of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from respawn.release import kubectl_binary
from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from respawn.testbed.ports import free_port
from respawn.testbed.services import ServiceProcess
from shared import subjects
from shared.bus import Bus, Delivery
from shared.messages import ObjectRef, Verdict
from tests import monitoring
from tests.integration.conftest import REPO, ServiceFactory, services_on
from tests.integration.objects import apply
from tests.waiting import until

SERVICES = ("watcher", "health", "lifecycle", "autopilot")


# ------------------------------------------------------------------ scraping


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def status_of(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def exposed(text: str) -> set[str]:
    """Every series name an exposition offers, with or without samples: a labelled counter that
    has counted nothing yet is declared (HELP and TYPE) and can be queried."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return names


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def series(text: str, name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


# ------------------------------------------------------------------ the services


@dataclass
class Running:
    kubeconfig: Path
    processes: dict[str, ServiceProcess]

    def metrics(self, name: str) -> str:
        return self.processes[name].metrics()


@pytest.fixture(scope="module")
def running(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with services_on(testbed.kubeconfig, testbed.nats_url, tmp_path_factory.mktemp("logs")) as start:
        # Started side by side: each start waits for its process to be ready.
        with ThreadPoolExecutor(max_workers=len(SERVICES)) as pool:
            started = {name: pool.submit(start, name) for name in SERVICES}
            processes = {name: future.result() for name, future in started.items()}
        yield Running(testbed.kubeconfig, processes)


@pytest.mark.testbed
async def test_every_metric_the_rules_and_the_dashboard_query_is_served(running: Running) -> None:
    wanted = monitoring.queried()
    assert "respawn_bus_consumer_pending" in wanted and "respawn_lifecycle_recovery_seconds_bucket" in wanted

    # The lag gauges appear at the first refresh after the consumers are bound (every 10 s).
    def served() -> set[str]:
        names: set[str] = set()
        for name in SERVICES:
            names |= exposed(running.metrics(name))
            names |= {s for s in wanted if sample(running.metrics(name), s) is not None}
        return names

    missing = await until(
        "every metric deploy/monitoring queries on the running services",
        lambda: sorted(wanted - served()),
        done=lambda left: not left,
        within=30,
    )
    assert not missing


@pytest.mark.testbed
async def test_each_service_tells_its_build_and_the_lag_of_its_consumers(running: Running) -> None:
    for name in SERVICES:
        infos = series(running.metrics(name), "respawn_build_info")
        assert [i["service"] for i in infos] == [name], infos
        assert infos[0]["version"] and infos[0]["python"].count(".") == 2

    def lag_of(name: str, stream: str) -> list[dict[str, str]]:
        return [
            s for s in series(running.metrics(name), "respawn_bus_consumer_pending") if s["stream"] == stream
        ]

    # lifecycle: one durable consumer per partition of the verdicts; health: a replay of the
    # observations per partition.
    lifecycle = await until(
        "lifecycle's verdict consumers in respawn_bus_consumer_pending",
        lambda: lag_of("lifecycle", subjects.VERDICTS_STREAM),
        done=lambda found: len(found) == 16,
        within=30,
    )
    assert {s["consumer"] for s in lifecycle} == {subjects.lifecycle_verdict_durable(p) for p in range(16)}
    assert {s["service"] for s in lifecycle} == {"respawn-lifecycle"}
    health = await until(
        "health's observation replays in respawn_bus_consumer_pending",
        lambda: lag_of("health", subjects.OBSERVATIONS_STREAM),
        done=lambda found: len(found) == 16,
        within=30,
    )
    assert all(s["consumer"].startswith("health-") for s in health)


@pytest.mark.testbed
async def test_an_incident_is_timed_from_the_failure_to_running_again(
    running: Running, namespace: str
) -> None:
    # A pod that fails 1 s after it starts, every attempt: failure, verdict after a 2 s grace
    # period, reset, Running again (then failing again, until the retry limit).
    workload = manifests.pod("inc-0", container="c", annotations={sim.FAIL_AFTER: "1s"})
    clocks = manifests.fault_tolerance(failure_grace="2s", retry_pause="1s", retry_limit=2)
    aw = manifests.appwrapper("inc", manifests.component(workload), annotations=clocks, suspend=False)
    apply(running.kubeconfig, namespace, aw)

    def count(name: str, metric: str) -> float:
        return sample(running.metrics(name), metric) or 0.0

    await until(
        "a recovery in respawn_lifecycle_recovery_seconds",
        lambda: count("lifecycle", "respawn_lifecycle_recovery_seconds_count"),
        done=lambda n: n >= 1,
        within=90,
    )
    health, lifecycle = running.metrics("health"), running.metrics("lifecycle")
    reason = {"reason": "FoundFailedPods"}
    detected = sample(health, "respawn_health_detection_seconds_count", **reason)
    assert detected is not None and detected >= 1
    # Detection spans the 2 s grace period; its delay only what follows it.
    detection = sample(health, "respawn_health_detection_seconds_sum", **reason) or 0.0
    delay = sample(health, "respawn_health_detection_delay_seconds_sum", **reason) or 0.0
    assert detection >= 2.0 * detected
    assert delay < detection - 1.5 * detected
    assert delay / detected < 2.0
    # A reaction for every reset started, each within seconds of its verdict.
    assert (sample(lifecycle, "respawn_lifecycle_reaction_seconds_count") or 0) >= 1
    reactions = sample(lifecycle, "respawn_lifecycle_reaction_seconds_count") or 1
    assert (sample(lifecycle, "respawn_lifecycle_reaction_seconds_sum") or 0) / reactions < 5.0
    # Recovery: from the failure through the grace period, the pause and the recreation.
    recovered = sample(lifecycle, "respawn_lifecycle_recovery_seconds_count") or 1
    assert (sample(lifecycle, "respawn_lifecycle_recovery_seconds_sum") or 0) / recovered >= 3.0


# ------------------------------------------------------------------ metricsPort


@pytest.mark.testbed
def test_metrics_port_moves_metrics_off_the_probe_port(service: ServiceFactory) -> None:
    port = free_port()
    autopilot = service("autopilot", env={"RESPAWN_METRICS_PORT": str(port)})
    assert "respawn_build_info" in scrape(port)
    assert status_of(port, "/healthz") == 404
    assert status_of(autopilot.probe_port, "/metrics") == 404
    assert status_of(autopilot.probe_port, "/readyz") == 200


# ------------------------------------------------------------------ consumer lag


def lag(bus: Bus, durable: str) -> tuple[float | None, float | None]:
    labels = {"service": bus.service, "stream": subjects.VERDICTS_STREAM, "consumer": durable}
    return (
        REGISTRY.get_sample_value("respawn_bus_consumer_pending", labels),
        REGISTRY.get_sample_value("respawn_bus_consumer_ack_pending", labels),
    )


@pytest.mark.nats
async def test_consumer_lag_follows_what_the_server_holds(bus: Bus) -> None:
    name = uuid.uuid4().hex[:10]
    subject = subjects.verdict("lag", name)
    durable = f"t_{name}"
    release = asyncio.Event()
    handled: list[int] = []

    async def slow(msg: Verdict, delivery: Delivery) -> None:
        await release.wait()
        handled.append(msg.seq)

    for seq in range(1, 6):
        verdict = Verdict(
            ref=ObjectRef(namespace="lag", name=name), state="Healthy", decided_at=datetime.now(UTC), seq=seq
        )
        await bus.publish(subject, verdict, msg_id=None)
    consumer = await bus.consume(subjects.VERDICTS_STREAM, durable, subject, Verdict, slow, batch=1)

    async def refreshed() -> tuple[float | None, float | None]:
        await bus.refresh_lag()
        return lag(bus, durable)

    # One message in the handler, four behind it.
    assert await until("the lag of a blocked consumer", refreshed, done=lambda v: v == (4, 1)) == (4, 1)
    release.set()
    assert await until("the lag once everything is handled", refreshed, done=lambda v: v == (0, 0)) == (0, 0)
    assert handled == [1, 2, 3, 4, 5]
    await consumer.stop()
    await bus.refresh_lag()
    assert lag(bus, durable) == (None, None)  # a stopped consumer leaves no series


# ------------------------------------------------------------------ manifests


def kustomize(path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([kubectl_binary(), "kustomize", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_monitoring_pack_renders_on_its_own_and_beside_the_release(tmp_path: Path) -> None:
    objects = kustomize(REPO / "deploy" / "monitoring")
    kinds = sorted((o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in objects)
    assert kinds == [
        ("ConfigMap", "respawn-grafana-dashboard", "respawn-system"),
        ("PodMonitor", "respawn", "respawn-system"),
        ("PrometheusRule", "respawn", "respawn-system"),
    ]
    dashboard = next(o for o in objects if o["kind"] == "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(dashboard["data"]["respawn.json"])["uid"] == "respawn"

    # The PodMonitor scrapes the port the services' Deployments name `metrics`.
    release = kustomize(REPO / "deploy" / "release")
    assert not [o for o in release if o["kind"] in ("PodMonitor", "PrometheusRule")]
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    scraped = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    assert sorted(scraped) == sorted(SERVICES)
    for deployment in (o for o in release if o["kind"] == "Deployment"):
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = {
            p["name"]
            for c in deployment["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", ())
        }
        assert ("metrics" in ports) == (component in SERVICES), component

    # And as an overlay's resource beside the base.
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    release_dir, monitoring_dir = (
        os.path.relpath(REPO / "deploy" / d, overlay) for d in ("release", "monitoring")
    )
    (overlay / "kustomization.yaml").write_text(f"resources: [{release_dir}, {monitoring_dir}]\n")
    both = kustomize(overlay)
    assert len(both) == len(release) + len(objects)
