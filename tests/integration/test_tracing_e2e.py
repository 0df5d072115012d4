"""One incident, one trace: watcher, health and lifecycle as separate processes on the testbed,
each exporting its spans to a file of its own (``RESPAWN_TRACE_FILE``).

A failed pod is observed (watcher), judged (health's verdict), and reset by lifecycle: the
deletion, the recreation and the return to Running are spans of the very trace the observation
began, also when lifecycle is killed in the middle of the reset and another process finishes it
(the trace is carried by the AppWrapper's ``respawn.dev/incident-trace`` annotation).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from respawn.testbed import manifests, sim
from respawn.testbed.modes import Endpoints
from shared.appwrapper.constants import INCIDENT_TRACE_ANNOTATION
from shared.appwrapper.model import read_appwrapper
from tests.integration.conftest import ServiceFactory, services_on
from tests.integration.objects import FAST_RESET, apply, get_appwrapper, running_pods, wait_phase
from tests.waiting import until

pytestmark = pytest.mark.testbed

Span = dict[str, Any]

# Spans leave a process every 100 ms instead of every 5 s: a SIGKILL loses what is not out yet.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


def traced(spans: Path, name: str) -> dict[str, str]:
    return {"RESPAWN_TRACE_FILE": str(spans / f"{name}.jsonl"), **FAST_EXPORT}


def read_spans(spans: Path) -> list[Span]:
    """Every span the services wrote so far (a line still being written is skipped)."""
    found: list[Span] = []
    for path in sorted(spans.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                span = json.loads(line)
            except json.JSONDecodeError:
                continue
            span["file"] = path.stem
            found.append(span)
    return found


def trace_id(span: Span) -> int:
    return int(span["context"]["trace_id"], 16)


def service_of(span: Span) -> str:
    return str(span["resource"]["attributes"]["service.name"])


def verdict_span(spans: list[Span], namespace: str, name: str) -> Span | None:
    """Health's Unhealthy verdict about the AppWrapper (the detection)."""
    for span in spans:
        attributes = span["attributes"]
        if (
            span["name"] == "health.verdict"
            and attributes.get("appwrapper") == f"{namespace}/{name}"
            and attributes.get("verdict.state") == "Unhealthy"
        ):
            return span
    return None


def incident(spans: list[Span], namespace: str, name: str) -> list[Span]:
    """The spans of the trace that the AppWrapper's Unhealthy verdict belongs to."""
    verdict = verdict_span(spans, namespace, name)
    if verdict is None:
        return []
    return [s for s in spans if trace_id(s) == trace_id(verdict)]


def recovered(span: Span) -> bool:
    return (
        span["name"] == "lifecycle.write_status" and span["attributes"].get("appwrapper.phase") == "Running"
    )


def complete(trace: list[Span]) -> bool:
    """Every step is in the trace, and every span's parent is too. Three processes export their
    spans each on its own schedule (a batch every 100 ms, later on a loaded machine), so a child
    can be in the file before its parent from another process: the trace is complete only once
    the parents are there. A parent that never comes makes the wait run out."""
    names = {s["name"] for s in trace}
    span_ids = {s["context"]["span_id"] for s in trace}
    return (
        {"health.verdict", "lifecycle.delete_component", "lifecycle.create_component"} <= names
        and any(recovered(s) for s in trace)
        and all(s["parent_id"] in span_ids for s in trace if s["parent_id"] is not None)
    )


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spans")


@pytest.fixture(scope="module")
def observers(
    testbed: Endpoints, appwrapper_crd: Path, tmp_path_factory: pytest.TempPathFactory, spans_dir: Path
) -> Iterator[None]:
    """watcher and health, each its own process exporting spans, shared by this module's tests;
    each test starts its own lifecycle."""
    logs = tmp_path_factory.mktemp("tracing") / "logs"
    with services_on(testbed.kubeconfig, testbed.nats_url, logs) as start:
        for name in ("watcher", "health"):
            start(name, env=traced(spans_dir, name))
        yield


def submit(kubeconfig: Path, namespace: str, name: str, **clocks: str) -> None:
    annotations = {**FAST_RESET, **manifests.fault_tolerance(**clocks)}
    apply(kubeconfig, namespace, manifests.job_appwrapper(name, annotations=annotations))


async def fail_running_pod(kubeconfig: Path, namespace: str, name: str) -> None:
    await wait_phase(kubeconfig, namespace, name, "Running")
    [pod] = await until("a running pod", lambda: running_pods(kubeconfig, namespace, name))
    sim.fail_pod(kubeconfig, namespace, pod["metadata"]["name"], exit_code=139)


async def test_one_pod_fault_is_one_trace_from_the_watch_to_running_again(
    testbed: Endpoints, namespace: str, observers: None, service: ServiceFactory, spans_dir: Path
) -> None:
    kc = testbed.kubeconfig
    service("lifecycle", env=traced(spans_dir, "lifecycle"))
    submit(kc, namespace, "traced")
    await fail_running_pod(kc, namespace, "traced")
    await until(
        "the reset to complete",
        lambda: get_appwrapper(kc, namespace, "traced"),
        done=lambda aw: read_appwrapper(aw).resetting_count == 1 and read_appwrapper(aw).phase == "Running",
        within=40,
    )

    trace = await until(
        "one trace with the detection, deletion, recreation and recovery",
        lambda: incident(read_spans(spans_dir), namespace, "traced"),
        done=complete,
        within=20,
    )
    # Across the three services: the watcher's publication of the failed pod began it.
    assert {service_of(s) for s in trace} >= {"watcher", "health", "lifecycle"}
    assert "send observation.pod" in {s["name"] for s in trace if service_of(s) == "watcher"}
    # One root, and every other span's parent is in the trace: nothing hangs off another trace.
    roots = [s for s in trace if s["parent_id"] is None]
    assert len(roots) == 1, [s["name"] for s in roots]
    span_ids = {s["context"]["span_id"] for s in trace}
    assert all(s["parent_id"] in span_ids for s in trace if s["parent_id"] is not None)
    # The incident is over: the annotation that carried it is gone.
    aw = get_appwrapper(kc, namespace, "traced")
    assert INCIDENT_TRACE_ANNOTATION not in ((aw or {}).get("metadata", {}).get("annotations") or {})


async def test_the_incident_trace_survives_a_lifecycle_kill(
    testbed: Endpoints, namespace: str, observers: None, service: ServiceFactory, spans_dir: Path
) -> None:
    kc = testbed.kubeconfig
    first = service("lifecycle", instance="1", env=traced(spans_dir, "lifecycle-1"))
    # A long pause before the recreation: the kill lands after the deletion, before the creation.
    submit(kc, namespace, "phoenix", retry_pause="8s")
    await fail_running_pod(kc, namespace, "phoenix")

    def annotation() -> str:
        aw = get_appwrapper(kc, namespace, "phoenix") or {}
        return str((aw.get("metadata", {}).get("annotations") or {}).get(INCIDENT_TRACE_ANNOTATION, ""))

    traceparent = await until("the incident's trace recorded on the AppWrapper", annotation, within=20)
    deleted = await until(
        "the deletion's span exported",
        lambda: [
            s
            for s in incident(read_spans(spans_dir), namespace, "phoenix")
            if s["name"] == "lifecycle.delete_component"
        ],
        within=20,
    )
    first.kill()
    assert read_appwrapper(get_appwrapper(kc, namespace, "phoenix")).phase == "Resetting"
    assert int(traceparent.split("-")[1], 16) == trace_id(deleted[0])

    service("lifecycle", instance="2", env=traced(spans_dir, "lifecycle-2"))
    await until(
        "the reset to complete",
        lambda: get_appwrapper(kc, namespace, "phoenix"),
        done=lambda aw: read_appwrapper(aw).phase == "Running" and read_appwrapper(aw).resetting_count == 1,
        within=60,
    )
    trace = await until(
        "the recreation and recovery in the incident's trace",
        lambda: incident(read_spans(spans_dir), namespace, "phoenix"),
        done=complete,
        within=20,
    )
    # The killed process deleted; the new one, which knew nothing of the incident, recreated and
    # brought the workload back to Running in the same trace.
    assert {s["file"] for s in trace if s["name"] == "lifecycle.delete_component"} == {"lifecycle-1"}
    assert {s["file"] for s in trace if s["name"] == "lifecycle.create_component"} == {"lifecycle-2"}
    assert {s["file"] for s in trace if recovered(s)} == {"lifecycle-2"}
    assert annotation() == ""
