"""The benchmark harness's pure functions: plans, manifests, measurements, figures and tables.

Edge cases, exact arithmetic and validity checks against Respawn's own AppWrapper model; every
input is built by hand, nothing talks to a server.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import compare, report
from bench.config import (
    CONTROLLERS,
    DEFAULT_MIX,
    BenchConfig,
    PlannedFault,
    add_arguments,
    config_from,
    parse_mix,
)
from bench.correctness import VIOLATIONS
from bench.plan import AwSpec, nodes_needed, plan_faults, plan_workload
from bench.procstat import ProcUsage
from bench.report import cost, figures, fmt_ms, format_value, latencies, percentiles, render
from bench.samples import Snapshot, Window, api_requests
from bench.tracker import Fault
from bench.workload import appwrapper_manifest
from respawn.testbed import sim
from respawn.testbed.manifests import parse_appwrapper
from shared.appwrapper import params
from shared.appwrapper.podsets import (
    component_pod_sets,
    expected_pod_count,
    get_at_path,
    is_pod_template,
    validate_appwrapper_pod_sets,
)
from shared.faulttolerance import FaultTolerance

GPU = "nvidia.com/gpu"


def cfg(**changes: Any) -> BenchConfig:
    return BenchConfig(**changes)


# ------------------------------------------------------------------ plan_workload


@pytest.mark.parametrize(
    ("n", "gpu_fraction", "pytorch_fraction", "gpus", "pytorchjobs"),
    [
        (200, 0.25, 0.4, 50, 80),
        (10, 0.01, 0.0, 1, 0),  # a positive GPU share never rounds down to no GPU workload
        (10, 0.0, 1.0, 0, 10),
        (7, 1.0, 0.3, 7, 2),
        (3, 1.5, 1.5, 3, 3),  # shares above one are capped at N
        (0, 0.5, 0.5, 0, 0),
    ],
)
def test_workload_has_exactly_the_requested_shares(
    n: int, gpu_fraction: float, pytorch_fraction: float, gpus: int, pytorchjobs: int
) -> None:
    plan = plan_workload(
        cfg(appwrappers=n, pods_per_aw=5, gpu_fraction=gpu_fraction, pytorch_fraction=pytorch_fraction)
    )
    assert len(plan) == n
    assert sum(s.gpu for s in plan) == gpus
    assert sum(s.kind == "pytorchjob" for s in plan) == pytorchjobs
    assert {s.kind for s in plan} <= {"job", "pytorchjob"}
    assert all(s.pods == 5 for s in plan)


def test_workload_is_a_function_of_the_seed() -> None:
    base = cfg(appwrappers=60, gpu_fraction=0.5, pytorch_fraction=0.5, seed=11)
    plan = plan_workload(base)
    assert plan_workload(cfg(appwrappers=60, gpu_fraction=0.5, pytorch_fraction=0.5, seed=11)) == plan
    # The fault settings draw from another stream: they leave the workload alone.
    assert (
        plan_workload(cfg(appwrappers=60, gpu_fraction=0.5, pytorch_fraction=0.5, seed=11, fault_rate=9.0))
        == plan
    )
    other = plan_workload(cfg(appwrappers=60, gpu_fraction=0.5, pytorch_fraction=0.5, seed=12))
    assert [s.gpu for s in other] != [s.gpu for s in plan]
    assert [s.kind for s in other] != [s.kind for s in plan]
    # Same shares either way: only the placement changes.
    assert sum(s.gpu for s in other) == sum(s.gpu for s in plan) == 30


@pytest.mark.parametrize(
    ("n", "first", "last"),
    [(1, "aw-0", "aw-0"), (10, "aw-0", "aw-9"), (11, "aw-00", "aw-10"), (101, "aw-000", "aw-100")],
)
def test_workload_names_are_zero_padded_to_the_widest_index(n: int, first: str, last: str) -> None:
    names = [s.name for s in plan_workload(cfg(appwrappers=n))]
    assert (names[0], names[-1]) == (first, last)
    assert len(set(names)) == n
    assert names == sorted(names)


# ------------------------------------------------------------------ plan_faults


def test_fault_plan_is_a_function_of_the_seed() -> None:
    config = cfg(fault_rate=1.0, duration=60.0, seed=5)
    plan = plan_faults(config)
    assert plan, "60 expected arrivals"
    assert plan_faults(cfg(fault_rate=1.0, duration=60.0, seed=5)) == plan
    other = plan_faults(cfg(fault_rate=1.0, duration=60.0, seed=6))
    assert [f.at for f in other] != [f.at for f in plan]


def test_fault_count_follows_rate_times_duration() -> None:
    # Poisson arrivals: rate x duration expected per run (100 here), a standard deviation of 10.
    counts = [len(plan_faults(cfg(fault_rate=0.5, duration=200.0, seed=s))) for s in range(1, 31)]
    assert all(60 <= c <= 140 for c in counts), counts
    assert statistics.fmean(counts) == pytest.approx(100, rel=0.08)
    # Doubling the rate doubles the expected count.
    doubled = [len(plan_faults(cfg(fault_rate=1.0, duration=200.0, seed=s))) for s in range(1, 31)]
    assert statistics.fmean(doubled) == pytest.approx(200, rel=0.08)


def test_fault_times_are_ordered_millisecond_offsets_inside_the_window() -> None:
    faults = plan_faults(cfg(fault_rate=3.0, duration=50.0, seed=2))
    times = [f.at for f in faults]
    assert times == sorted(times)
    assert all(0 < t <= 50.0 for t in times)
    assert all(t == round(t, 3) for t in times)
    # Mean gap between arrivals is 1 / rate.
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 3.0, rel=0.15)


def test_fault_kinds_follow_the_mix_within_a_tolerance() -> None:
    faults = plan_faults(cfg(fault_rate=10.0, duration=500.0, seed=4))  # default mix, ~5,000 faults
    shares = {k: n / len(faults) for k, n in Counter(f.kind for f in faults).items()}
    expected = dict(DEFAULT_MIX)
    assert set(shares) == set(expected)
    for kind, share in expected.items():
        assert shares[kind] == pytest.approx(share, abs=0.03), kind


def test_a_kind_with_zero_weight_is_never_planned() -> None:
    mix = (("pod-failure", 1.0), ("evict", 0.0), ("stuck-init", 1.0))
    faults = plan_faults(cfg(fault_rate=5.0, duration=100.0, mix=mix, seed=3))
    kinds = Counter(f.kind for f in faults)
    assert kinds["evict"] == 0
    assert kinds["pod-failure"] > 0 and kinds["stuck-init"] > 0


def test_max_faults_keeps_the_first_arrivals_of_the_uncapped_plan() -> None:
    uncapped = plan_faults(cfg(fault_rate=2.0, duration=100.0, seed=8))
    assert len(uncapped) > 10
    assert plan_faults(cfg(fault_rate=2.0, duration=100.0, seed=8, max_faults=10)) == uncapped[:10]
    assert plan_faults(cfg(fault_rate=2.0, duration=100.0, seed=8, max_faults=0)) == []
    generous = cfg(fault_rate=2.0, duration=100.0, seed=8, max_faults=10_000)
    assert plan_faults(generous) == uncapped


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_no_positive_rate_means_no_faults(rate: float) -> None:
    assert plan_faults(cfg(fault_rate=rate, duration=100.0)) == []


def test_a_given_fault_plan_wins_over_rate_and_seed() -> None:
    given = (PlannedFault(0.5, "stuck-init"), PlannedFault(2.0, "evict"))
    plan = plan_faults(cfg(fault_plan=given, fault_rate=0.0, seed=99))
    assert plan == list(given)
    plan.append(PlannedFault(3.0, "pod-failure"))
    assert plan_faults(cfg(fault_plan=given)) == list(given), "a fresh list each call"


# ------------------------------------------------------------------ nodes_needed


def specs(count: int, pods: int, gpu: bool) -> list[AwSpec]:
    return [AwSpec(f"aw-{i}", "job", pods, gpu) for i in range(count)]


@pytest.mark.parametrize(
    ("workload", "planned", "stuck_pods", "nodes"),
    [
        # 80 pods: 0.8 * 1.25 -> 1 + 2 = 3, but never fewer than 4.
        (specs(10, 8, False), [], 1, 4),
        # 800 pods: 8 * 1.25 = 10 + 2.
        (specs(100, 8, False), [], 1, 12),
        # 792 pods + 8 stuck-init pods = 800 still fits 12 ...
        (specs(99, 8, False), [PlannedFault(1.0, "stuck-init")] * 8, 1, 12),
        # ... one more stuck-init fault does not: 8.01 * 1.25 -> 11 + 2.
        (specs(99, 8, False), [PlannedFault(1.0, "stuck-init")] * 9, 1, 13),
        # Only stuck-init faults add pods, stuck_init_pods each.
        (specs(99, 8, False), [PlannedFault(1.0, "pod-failure")] * 50, 1, 12),
        (specs(99, 8, False), [PlannedFault(1.0, "stuck-init")] * 3, 3, 13),
        # 24 GPU pods at 8 GPUs a node: 3 * 1.25 -> 4 + 2.
        (specs(3, 8, True), [], 1, 6),
        # GPU pods decide over the pod count: 40 GPU pods -> 5 * 1.25 -> 7 + 2.
        (specs(5, 8, True) + specs(50, 8, False), [], 1, 9),
    ],
)
def test_nodes_cover_pods_and_gpus_with_headroom(
    workload: list[AwSpec], planned: list[PlannedFault], stuck_pods: int, nodes: int
) -> None:
    assert nodes_needed(cfg(stuck_init_pods=stuck_pods), workload, planned) == nodes


# ------------------------------------------------------------------ appwrapper_manifest


def containers_of(manifest: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template, container) for every container of every pod set the model infers."""
    component = manifest["spec"]["components"][0]
    out = []
    for pod_set in component_pod_sets(component):
        pod = get_at_path(component["template"], pod_set.path)
        assert is_pod_template(pod)
        out.extend((pod, c) for c in pod["spec"]["containers"])
    return out


@pytest.mark.parametrize("kind", ["job", "pytorchjob", "stuck-init"])
@pytest.mark.parametrize("gpu", [True, False])
@pytest.mark.parametrize("pods", [1, 4])
def test_every_manifest_is_a_valid_appwrapper_with_its_pods_and_gpus(kind: str, gpu: bool, pods: int) -> None:
    spec = AwSpec("aw-7", kind, pods, gpu)
    manifest = appwrapper_manifest(spec, cfg())
    assert manifest["apiVersion"] == "workload.codeflare.dev/v1beta2"
    assert manifest["kind"] == "AppWrapper"
    assert manifest["metadata"]["name"] == "aw-7"
    parsed = parse_appwrapper(manifest)  # raises on anything the CRD model rejects
    assert len(parsed.spec.components) == 1
    assert validate_appwrapper_pod_sets(parsed.spec.components) == []
    assert expected_pod_count(manifest) == pods
    template = manifest["spec"]["components"][0]["template"]
    assert template["metadata"]["name"] == "aw-7"
    pairs = containers_of(manifest)
    assert pairs
    for pod, container in pairs:
        assert pod["spec"]["restartPolicy"] == "Never"
        limits = container.get("resources", {}).get("limits", {})
        assert (limits.get(GPU) == "1") is gpu
        stuck = kind == "stuck-init"
        assert ("initContainers" in pod["spec"]) is stuck
        assert (pod.get("metadata", {}).get("annotations", {}).get(sim.STUCK_INIT) == "true") is stuck


def test_pytorchjob_manifest_splits_master_and_workers() -> None:
    manifest = appwrapper_manifest(AwSpec("aw-1", "pytorchjob", 5, True), cfg())
    template = manifest["spec"]["components"][0]["template"]
    assert (template["apiVersion"], template["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = template["spec"]["pytorchReplicaSpecs"]
    assert {role: r["replicas"] for role, r in replicas.items()} == {"Master": 1, "Worker": 4}
    assert {c["name"] for _, c in containers_of(manifest)} == {"pytorch"}


def test_job_manifest_runs_every_pod_at_once_without_retries() -> None:
    manifest = appwrapper_manifest(AwSpec("aw-1", "job", 6, False), cfg())
    template = manifest["spec"]["components"][0]["template"]
    assert (template["apiVersion"], template["kind"]) == ("batch/v1", "Job")
    assert template["spec"]["parallelism"] == template["spec"]["completions"] == 6
    assert template["spec"]["backoffLimit"] == 0


@pytest.mark.parametrize(
    ("kind", "grace", "limit"),
    [("job", "7m", "1000"), ("pytorchjob", "7m", "1000"), ("stuck-init", "4s", "1")],
)
def test_manifest_annotations_carry_the_configured_periods(kind: str, grace: str, limit: str) -> None:
    config = cfg(failure_grace="2s", retry_pause="3s", warmup_grace="4s", setup_grace="7m")
    annotations = appwrapper_manifest(AwSpec("aw-1", kind, 2, False), config)["metadata"]["annotations"]
    assert annotations == {
        params.ADMISSION_GRACE_PERIOD_ANNOTATION: grace,
        params.WARMUP_GRACE_PERIOD_ANNOTATION: grace,
        params.FAILURE_GRACE_PERIOD_ANNOTATION: "2s",
        params.RETRY_PAUSE_PERIOD_ANNOTATION: "3s",
        params.RETRY_LIMIT_ANNOTATION: limit,
    }
    # And Respawn reads them as meant, without a warning.
    effective = params.effective_fault_tolerance(annotations, FaultTolerance())
    assert effective.warnings == ()
    ft = effective.ft
    seconds = {"7m": 420, "4s": 4}[grace]
    assert ft.admission_grace.total_seconds() == ft.warmup_grace.total_seconds() == seconds
    assert (ft.failure_grace.total_seconds(), ft.retry_pause.total_seconds()) == (2, 3)
    assert ft.retry_limit == int(limit)


def test_the_whole_planned_workload_yields_valid_distinct_appwrappers() -> None:
    config = cfg(appwrappers=40, pods_per_aw=3, gpu_fraction=0.3, pytorch_fraction=0.5, seed=2)
    workload = plan_workload(config)
    manifests = [appwrapper_manifest(s, config) for s in workload]
    assert len({m["metadata"]["name"] for m in manifests}) == 40
    for spec, manifest in zip(workload, manifests, strict=True):
        parse_appwrapper(manifest)
        assert expected_pod_count(manifest) == 3
        kind = manifest["spec"]["components"][0]["template"]["kind"]
        assert kind == ("PyTorchJob" if spec.kind == "pytorchjob" else "Job")
        assert all(
            (GPU in c.get("resources", {}).get("limits", {})) is spec.gpu for _, c in containers_of(manifest)
        )


# ------------------------------------------------------------------ api_requests

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",resource="pods",scope="namespace",verb="LIST"} 10
apiserver_request_total{code="200",component="apiserver",resource="pods",scope="cluster",verb="LIST"} 4
apiserver_request_total{code="410",component="apiserver",resource="pods",scope="namespace",verb="LIST"} 1
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 2.5
apiserver_request_total{code="200",resource="appwrappers",subresource="status",verb="PUT"} 7
apiserver_request_total{code="200",resource="appwrappers",subresource="",verb="PUT"} 3
apiserver_request_total{code="200",verb="GET"} 6
apiserver_request_total{code="0",resource="pods",verb="WATCH"} 2
# HELP apiserver_request_duration_seconds Response latency.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{resource="pods",verb="LIST",le="0.1"} 50
apiserver_request_duration_seconds_bucket{resource="pods",verb="LIST",le="+Inf"} 60
apiserver_request_duration_seconds_sum{resource="pods",verb="LIST"} 3.5
apiserver_request_duration_seconds_count{resource="pods",verb="LIST"} 60
# HELP etcd_requests_total Etcd requests.
# TYPE etcd_requests_total counter
etcd_requests_total{operation="list",resource="pods",verb="LIST"} 1000
"""


def test_api_requests_sum_every_code_and_scope_per_verb_and_resource() -> None:
    assert api_requests(METRICS) == {
        "LIST pods": 15.0,
        "PATCH pods/status": 2.5,
        "PUT appwrappers/status": 7.0,
        "PUT appwrappers": 3.0,  # an empty subresource label is no subresource
        "GET -": 6.0,
        "WATCH pods": 2.0,
    }


def test_api_requests_without_a_type_line_and_of_an_empty_text() -> None:
    untyped = 'apiserver_request_total{resource="nodes",verb="GET"} 4\n'
    assert api_requests(untyped) == {"GET nodes": 4.0}
    assert api_requests("") == {}
    assert api_requests("# TYPE apiserver_request_total counter\n") == {}


# ------------------------------------------------------------------ latencies


def fault(kind: str, t0: float, **fields: Any) -> Fault:
    return Fault(id=int(t0), kind=kind, aw=f"aw-{int(t0)}", t0=t0, counted=True, **fields)


def test_latencies_per_measure_and_kind() -> None:
    config = cfg(failure_grace="1.5s", retry_pause="500ms")
    faults = [
        fault(
            "pod-failure",
            100.0,
            t_verdict=100.01,
            t_decided=100.02,
            t_announced=100.05,
            t_unhealthy=100.2,
            t_delete=100.5,
            t_recovered=105.0,
        ),
        fault("evict", 200.0, t_unhealthy=200.4, t_recovered=203.0),
        fault("stuck-init", 300.0, deadline=310.0, t_unhealthy=310.1, t_delete=310.3),
        # Stuck-init without a known deadline: no starting point, no samples at all.
        fault("stuck-init", 301.0, t_unhealthy=311.0, t_delete=311.5),
        # A delete without Unhealthy gives no reaction sample.
        fault("evict", 400.0, t_delete=400.1),
        # Untimed faults are left out of every measure.
        fault("pod-failure", 500.0, timed=False, t_verdict=500.1, t_unhealthy=500.2, t_recovered=509.0),
    ]
    lat = latencies(faults, config)
    assert set(lat) == {"detection", "verdict", "decided", "announced", "reaction", "recovery"}
    assert lat["detection"]["all"] == pytest.approx([0.2, 0.4, 0.1])
    assert lat["detection"]["stuck-init"] == pytest.approx([0.1]), "from the warmup deadline"
    assert lat["verdict"] == {"pod-failure": pytest.approx([0.01]), "all": pytest.approx([0.01])}
    # Lifecycle's own times, from its stream: the decision, and the announcement's arrival.
    assert lat["decided"] == {"pod-failure": pytest.approx([0.02]), "all": pytest.approx([0.02])}
    assert lat["announced"] == {"pod-failure": pytest.approx([0.05]), "all": pytest.approx([0.05])}
    assert lat["reaction"]["all"] == pytest.approx([0.3, 0.2])
    assert "evict" not in lat["reaction"]
    # Pod failure: 5 s - 0.5 s pause - 1.5 s failure grace; eviction: 3 s - 0.5 s pause only.
    assert lat["recovery"] == {
        "pod-failure": pytest.approx([3.0]),
        "evict": pytest.approx([2.5]),
        "all": pytest.approx([3.0, 2.5]),
    }


def test_latencies_of_no_faults_are_empty_measures() -> None:
    assert latencies([], cfg()) == {
        "detection": {},
        "verdict": {},
        "decided": {},
        "announced": {},
        "reaction": {},
        "recovery": {},
    }


# ------------------------------------------------------------------ cost


@pytest.fixture
def fake_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    def usage(pid: int) -> ProcUsage:
        if pid == 11:
            return ProcUsage(cpu_seconds=0.0, rss_mib=50.0, peak_rss_mib=123.5)
        raise FileNotFoundError(f"/proc/{pid}/stat")

    monkeypatch.setattr(report, "usage", usage)


def test_window_turns_two_snapshots_into_rates() -> None:
    a = Snapshot(wall=0.0, api={"GET pods": 10.0}, cpu={"c": 1.0}, nats={"s": 5})
    b = Snapshot(
        wall=30.0, api={"GET pods": 40.0, "LIST pods": 3.0}, cpu={"c": 1.6, "new": 9.0}, nats={"s": 20}
    )
    w = Window.between(a, b)
    assert w.seconds == 30.0
    assert w.api_per_min == pytest.approx({"GET pods": 60.0, "LIST pods": 6.0})
    assert w.cpu_percent == pytest.approx({"c": 2.0, "new": 0.0}), "a process new in b has no rate yet"
    assert w.nats_per_min == pytest.approx({"s": 30.0})


def test_cost_per_process_idle_requests_and_messages_per_fault(fake_usage: None) -> None:
    idle = Window(
        seconds=60.0,
        api_per_min={"LIST appwrappers": 12.0, "WATCH pods": 30.0, "POST events": 6.0, "GET leases": 20.4},
        cpu_percent={"controller": 2.0, "kube-apiserver": 50.0},
        nats_per_min={"s1": 6.0, "s2": 6.0},
    )
    baseline = Window(
        seconds=60.0,
        api_per_min={
            "LIST appwrappers": 2.0,
            "WATCH pods": 10.0,
            "POST events": 1.0,
            "GET leases": 20.0,
            "GET pods": 3.0,
        },
        cpu_percent={},
        nats_per_min={},
    )
    start = Snapshot(wall=1000.0, api={}, cpu={"controller": 2.0}, nats={"s1": 100, "s2": 50})
    end = Snapshot(wall=1100.0, api={}, cpu={"controller": 3.0}, nats={"s1": 400, "s2": 70, "s3": 5})
    out = cost(
        {"controller": 11, "gone": 22},
        {"controller": 1.0, "gone": 0.5},
        {"controller": 4.5, "gone": 0.5},
        idle,
        baseline,
        start,
        end,
        5,
    )
    assert out["processes"] == {
        "controller": {
            "service": "controller",
            "cpu_s": 3.5,
            "cpu_fault_phase_s": 1.0,
            "idle_cpu_percent": 2.0,
            "peak_rss_mib": 123.5,
        },
        "gone": {
            "service": "gone",
            "cpu_s": 0.0,
            "cpu_fault_phase_s": 0.0,
            "idle_cpu_percent": None,
            "peak_rss_mib": None,
        },
    }
    assert "cpu_phases_s" not in out and "whole_run_cpu_s" not in out, "no phase marks given"
    assert out["total_cpu_s"] == 3.5
    assert out["idle_cpu_percent_total"] == 2.0, "only the controller's processes count"
    api = out["api_requests_per_min_idle"]
    # WATCH and Events are left out of the totals; GET leases (+0.4) and GET pods (-3) are in.
    assert api["with_controller"] == pytest.approx(32.4)
    assert api["controller_stopped"] == pytest.approx(25.0)
    assert api["controller"] == pytest.approx(7.4)
    # Per request everything is shown, except differences under one a minute.
    assert api["controller_by_request"] == {
        "GET pods": -3.0,
        "LIST appwrappers": 10.0,
        "POST events": 5.0,
        "WATCH pods": 20.0,
    }
    assert out["nats_messages_per_min_idle"] == 12.0
    assert out["nats_messages_fault_phase"] == {"s1": 300, "s2": 20, "s3": 5}
    # 325 messages, minus 0.2/s idle traffic over 100 s, over 5 faults.
    assert out["nats_messages_per_fault"] == pytest.approx(61.0)


def test_cost_without_idle_windows_or_faults(fake_usage: None) -> None:
    start = Snapshot(wall=0.0, api={}, cpu={}, nats={"s": 10})
    end = Snapshot(wall=50.0, api={}, cpu={}, nats={"s": 30})
    out = cost({"controller": 11}, {}, {"controller": 2.0}, None, None, start, end, 4)
    assert "api_requests_per_min_idle" not in out
    assert "idle_cpu_percent_total" not in out
    assert out["processes"]["controller"]["idle_cpu_percent"] is None
    assert out["nats_messages_per_fault"] == 5.0
    no_faults = cost({"controller": 11}, {}, {}, None, None, start, end, 0)
    assert no_faults["nats_messages_per_fault"] is None, "no division by zero"
    no_nats = cost({}, {}, {}, None, None, Snapshot(0.0, {}, {}, {}), Snapshot(1.0, {}, {}, {}), 3)
    assert "nats_messages_per_fault" not in no_nats
    assert no_nats["total_cpu_s"] == 0


# ------------------------------------------------------------------ figures, format_value, render


def result(
    controller: str = "respawn",
    detection: list[float] | None = None,
    *,
    verdict: list[float] | None = None,
    processes: dict[str, dict[str, float]] | None = None,
    total_cpu: float | None = 4.0,
    nats_per_fault: float | None = 3.0,
    by_request: dict[str, float] | None = None,
    correctness: dict[str, Any] | None = None,
    setup: float = 12.0,
) -> dict[str, Any]:
    detection = [0.1, 0.2, 0.3] if detection is None else detection
    latency: dict[str, dict[str, list[float]]] = {
        "detection": {"all": detection, "pod-failure": detection[:2], "evict": detection[2:]},
        "reaction": {"all": [0.05, 0.07], "pod-failure": [0.05, 0.07]},
        "recovery": {"all": [1.0], "pod-failure": [1.0], "stuck-init": [9.0]},
    }
    if verdict is not None:
        latency["verdict"] = {"all": verdict, "pod-failure": verdict}
    return {
        "controller": controller,
        "config": {"appwrappers": 10, "pods_per_aw": 2, "fault_rate": 0.1, "duration": 60, "seed": 3},
        "latency": latency,
        "faults": {"injected": {"pod-failure": 2, "evict": 1}},
        "correctness": {"ok": True} if correctness is None else correctness,
        "setup": {"all_running_s": setup},
        "cleanup_s": 3.0,
        "cost": {
            "total_cpu_s": total_cpu,
            "idle_cpu_percent_total": 1.5,
            "processes": processes if processes is not None else {"respawn-health": {"cpu_s": 1.0}},
            "api_requests_per_min_idle": {
                "with_controller": 1234.0,
                "controller_stopped": 1000.0,
                "controller_by_request": by_request if by_request is not None else {},
            },
            "nats_messages_per_fault": nats_per_fault,
        },
    }


def test_figures_rows_follow_the_samples_present() -> None:
    rows = figures(
        result(
            verdict=[0.01],
            processes={"b-proc": {"cpu_s": 2.0, "peak_rss_mib": 64.0}, "a-proc": {"cpu_s": 1.0}},
            by_request={"LIST appwrappers": 2.0, "WATCH pods": 5.0, "POST events": 9.0, "PATCH pods": -0.5},
        )
    )
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), "names are unique: compare.py lines them up by name"
    table = {name: (value, unit) for name, value, unit in rows}
    assert table["detection all n"] == (3.0, "count")
    assert table["detection all p50"] == (pytest.approx(0.2), "s")
    assert table["detection all max"] == (pytest.approx(0.3), "s")
    assert table["detection evict n"] == (1.0, "count")
    # Per kind only p50 and p99.
    assert "detection pod-failure p50" in table and "detection pod-failure p99" in table
    assert "detection pod-failure p90" not in table and "detection pod-failure max" not in table
    # Kinds without samples have no rows; recovery of stuck-init never has rows.
    assert not any(n.startswith("detection stuck-init") for n in names)
    assert not any(n.startswith("recovery stuck-init") for n in names)
    assert table["verdict all n"] == (1.0, "count")
    # Measures only Respawn has: no rows without samples (upstream's run).
    assert not any(n.startswith(("decided", "announced")) for n in names)
    assert table["faults injected"] == (3.0, "count")
    assert table["faults injected evict"] == (1.0, "count")
    assert table["faults injected stuck-init"] == (0.0, "count")
    assert all(table[f"correctness {key}"] == (0.0, "count") for key in VIOLATIONS)
    assert table["set-up: all running"] == (12.0, "s")
    assert table["cleanup: all deleted"] == (3.0, "s")
    assert table["cpu set-up to baseline (controller)"] == (4.0, "cpu-s")
    assert table["cpu whole run incl. clean-up (controller)"] == (None, "cpu-s"), "no phases recorded"
    assert table["idle cpu (controller)"] == (1.5, "% of a core")
    # Processes in name order, a missing peak RSS is None.
    assert names.index("cpu a-proc") < names.index("cpu b-proc")
    assert table["peak rss a-proc"] == (None, "MiB")
    assert table["peak rss b-proc"] == (64.0, "MiB")
    # WATCH and Events are left out of the idle request figure: 2.0 - 0.5.
    assert table["api requests/min idle (controller)"] == (pytest.approx(1.5), "req/min")
    assert table["nats messages per fault"] == (3.0, "msg")


def test_figures_of_an_empty_result_keep_the_all_rows_without_values() -> None:
    table = {name: value for name, value, _ in figures({})}
    for measure in ("detection", "reaction", "recovery"):
        assert table[f"{measure} all n"] == 0.0
        assert table[f"{measure} all p50"] is None
    assert not any(name.startswith("verdict") for name in table)
    assert table["api requests/min idle (controller)"] is None
    assert table["faults injected"] == 0.0


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (None, "count", "—"),
        (0.0, "s", "0.0 ms"),
        (0.00042, "s", "0.4 ms"),
        (9.5, "s", "9,500.0 ms"),
        (10.0, "s", "10.0 s"),
        (1234.56, "s", "1,234.6 s"),
        (-0.25, "s", "-250.0 ms"),
        (3.0, "count", "3"),
        (1234567.0, "count", "1,234,567"),
        (64.04, "MiB", "64.0 MiB"),
        (-3.0, "req/min", "-3.0 req/min"),
    ],
)
def test_format_value_by_unit(value: float | None, unit: str, text: str) -> None:
    assert format_value(value, unit) == text


def test_render_has_a_row_for_every_figure_but_empty_counts() -> None:
    res = result(
        processes={"respawn-health": {"cpu_s": 1.0, "peak_rss_mib": 80.0}},
        by_request={"LIST appwrappers": 2.0},
    )
    text = render(res)
    assert text.startswith("## respawn: 10 AppWrappers x 2 pods, 0.1 faults/s for 60s, seed 3\n")
    lines = text.splitlines()
    rows = figures(res)
    skipped = [name for name, value, _ in rows if name.endswith(" n") and not value]
    assert skipped == [], "every measure here has samples"
    for name, value, unit in rows:
        line = f"| {name} | {format_value(value, unit)} |"
        if name.endswith(" n") and not value:
            assert line not in lines
        else:
            assert line in lines, line
    assert "correctness: OK" in lines
    assert (
        "API requests/min at idle: 1,234 with the controller, 1,000 with it stopped; "
        "by request: {'LIST appwrappers': 2.0}"
    ) in lines


def test_render_drops_count_rows_without_samples() -> None:
    res = result(detection=[])
    text = render(res)
    assert "| detection all n |" not in text
    assert "| detection all p50 | — |" in text
    assert "| correctness lost | 0 |" in text, "zero violations are shown: only ' n' rows are dropped"


def test_render_lists_violations_timelines_and_logs() -> None:
    correctness = {
        "ok": False,
        "lost": [f"aw-{i}: lost" for i in range(12)],
        "orphans": ["pod/x"],
        "timelines": {"aw-3": ["t=1 Running", "t=2 Resetting"]},
    }
    res = {**result(correctness=correctness), "logs": "/tmp/bench-logs"}
    lines = render(res).splitlines()
    assert "correctness: VIOLATIONS" in lines
    assert "| correctness lost | 12 |" in lines
    assert [line for line in lines if line.startswith("  lost: ")] == [
        f"  lost: aw-{i}: lost" for i in range(10)
    ]
    assert "  orphans: pod/x" in lines
    assert lines[lines.index("  timeline of aw-3:") + 1 :][:2] == ["    t=1 Running", "    t=2 Resetting"]
    assert "  the testbed's logs are kept in /tmp/bench-logs" in lines


# ------------------------------------------------------------------ compare


def pair() -> dict[str, dict[str, Any]]:
    ours = result(
        "respawn",
        [0.1, 0.2, 0.3],
        verdict=[0.01, 0.02, 0.03],
        processes={"respawn-health": {"cpu_s": 1.0}},
        total_cpu=4.0,
        nats_per_fault=3.0,
        by_request={},
        setup=0.0,
    )
    theirs = result(
        "upstream",
        [1.0, 2.0, 3.0],
        processes={"appwrapper-controller": {"cpu_s": 9.0}},
        total_cpu=10.0,
        nats_per_fault=None,
        by_request={"LIST pods": 6.0},
        setup=5.0,
    )
    return {"respawn": ours, "upstream": theirs}


def test_compare_rows_compute_upstream_over_respawn() -> None:
    rows = {name: cells for name, *cells in compare.compare_rows(pair())}
    assert rows["detection all p50"] == ["200.0 ms", "2,000.0 ms", "10.0x"]
    assert rows["detection all max"] == ["300.0 ms", "3,000.0 ms", "10.0x"]
    assert rows["cpu set-up to baseline (controller)"] == ["4.0 cpu-s", "10.0 cpu-s", "2.5x"]
    assert rows["reaction all p50"] == ["50.0 ms", "50.0 ms", "1.0x"]


def test_compare_rows_give_no_ratio_for_counts_missing_values_or_a_zero_base() -> None:
    rows = {name: cells for name, *cells in compare.compare_rows(pair())}
    assert rows["detection all n"] == ["3", "3", "—"], "counts get no ratio"
    assert rows["faults injected"][2] == "—"
    assert rows["nats messages per fault"] == ["3.0 msg", "—", "—"], "upstream has no value"
    assert rows["set-up: all running"] == ["0.0 ms", "5,000.0 ms", "—"], "no division by zero"
    assert rows["api requests/min idle (controller)"] == ["0.0 req/min", "6.0 req/min", "—"]
    # Figures only one controller has: its own rows, a dash for the other.
    assert rows["verdict all p50"] == ["20.0 ms", "—", "—"]
    assert rows["cpu respawn-health"] == ["1.0 cpu-s", "—", "—"]
    assert rows["cpu appwrapper-controller"] == ["—", "9.0 cpu-s", "—"]


def test_compare_rows_list_every_figure_of_either_run_once_in_order() -> None:
    results = pair()
    names = [row[0] for row in compare.compare_rows(results)]
    ours = [n for n, _, _ in figures(results["respawn"])]
    theirs = [n for n, _, _ in figures(results["upstream"])]
    assert names == ours + [n for n in theirs if n not in ours]


def test_compare_rows_with_a_failed_run() -> None:
    results = {"respawn": pair()["respawn"], "upstream": {"controller": "upstream", "error": "no image"}}
    rows = compare.compare_rows(results)
    assert [n for n, *_ in rows] == [n for n, _, _ in figures(results["respawn"])]
    assert all(theirs == "n/a" and ratio == "—" for _, _, theirs, ratio in rows)
    both_failed = {c: {"controller": c, "error": "x"} for c in CONTROLLERS}
    assert compare.compare_rows(both_failed) == []


def test_compare_render_has_every_row_and_both_verdicts() -> None:
    results = pair()
    results["upstream"]["correctness"] = {"ok": False, "duplicated": ["aw-1: 2 resets for 1 faults"]}
    text = compare.render(results)
    lines = text.splitlines()
    assert lines[0] == "## 10 AppWrappers x 2 pods, 0.1 faults/s for 60s, seed 3"
    assert "| figure | Respawn | upstream | upstream ÷ Respawn |" in lines
    for name, ours, theirs, ratio in compare.compare_rows(results):
        assert f"| {name} | {ours} | {theirs} | {ratio} |" in lines, name
    assert "respawn correctness: OK" in lines
    assert "upstream correctness: VIOLATIONS" in lines
    assert "  duplicated: aw-1: 2 resets for 1 faults" in lines
    assert "  idle API requests/min by request: {'LIST pods': 6.0}" in lines


def test_compare_render_skips_empty_count_rows_and_names_a_run_that_failed() -> None:
    results = {"respawn": result(detection=[]), "upstream": {"controller": "upstream", "error": "no image"}}
    text = compare.render(results)
    assert "| detection all n |" not in text, "0 against n/a: dropped"
    assert "| detection all p50 | — | n/a | — |" in text
    assert "| reaction all n | 2 | n/a | — |" in text
    assert "\nupstream: not run: no image" in text
    assert "upstream correctness" not in text


# ------------------------------------------------------------------ percentiles


def test_percentiles_pick_nearest_ranks_of_an_unsorted_list() -> None:
    samples = [7.0, 3.0, 10.0, 0.0, 5.0, 1.0, 9.0, 2.0, 8.0, 4.0, 6.0]  # 0..10 shuffled
    original = list(samples)
    stats = percentiles(samples)
    assert stats == {"n": 11.0, "p50": 5.0, "p90": 9.0, "p99": 10.0, "max": 10.0, "mean": 5.0}
    assert samples == original, "the input is not sorted in place"
    big = percentiles([float(i) for i in range(1000, -1, -1)])  # 0..1000 descending
    assert (big["p50"], big["p90"], big["p99"], big["max"]) == (500.0, 900.0, 990.0, 1000.0)


def test_percentiles_of_one_sample_and_of_none() -> None:
    assert percentiles([0.25]) == {"n": 1.0, "p50": 0.25, "p90": 0.25, "p99": 0.25, "max": 0.25, "mean": 0.25}
    assert percentiles([]) == {}


def test_fmt_ms_prints_milliseconds_with_one_decimal() -> None:
    stats = {"n": 4.0, "p50": 0.0685, "p90": 0.1, "p99": 1.23456, "max": 2.0, "mean": 0.5}
    assert fmt_ms(stats) == "n=4 p50=68.5ms p90=100.0ms p99=1234.6ms max=2000.0ms"
    assert fmt_ms(percentiles([0.001, 0.002, 0.003])) == "n=3 p50=2.0ms p90=3.0ms p99=3.0ms max=3.0ms"
    assert fmt_ms({}) == "no samples"


# ------------------------------------------------------------------ command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_command_line_defaults_are_the_config_defaults() -> None:
    args = parser().parse_args([])
    assert args.state_dir is None
    assert config_from(args, "upstream") == BenchConfig(controller="upstream")


def test_every_flag_reaches_its_config_field() -> None:
    args = parser().parse_args(
        [
            "--appwrappers", "12", "--pods-per-aw", "3", "--fault-rate", "0.5", "--duration", "30",
            "--seed", "9", "--max-faults", "4", "--mix", "stuck-init=0.5, evict",
            "--gpu-fraction", "0.1", "--pytorch-fraction", "0.9", "--failure-grace", "2s",
            "--retry-pause", "3s", "--warmup-grace", "4s", "--idle", "0", "--settle-timeout", "11",
            "--setup-timeout", "22", "--cleanup-timeout", "33", "--nodes", "7", "--state-dir", "/tmp/x",
        ]
    )  # fmt: skip
    assert args.state_dir == Path("/tmp/x")
    assert config_from(args, "respawn") == BenchConfig(
        controller="respawn",
        appwrappers=12,
        pods_per_aw=3,
        fault_rate=0.5,
        duration=30.0,
        seed=9,
        max_faults=4,
        mix=(("stuck-init", 0.5), ("evict", 1.0)),
        gpu_fraction=0.1,
        pytorch_fraction=0.9,
        failure_grace="2s",
        retry_pause="3s",
        warmup_grace="4s",
        idle_seconds=0.0,
        settle_timeout=11.0,
        setup_timeout=22.0,
        cleanup_timeout=33.0,
        nodes=7,
    )


@pytest.mark.parametrize(
    ("text", "mix"),
    [
        ("pod-failure", (("pod-failure", 1.0),)),
        ("evict=0.25,stuck-init=2", (("evict", 0.25), ("stuck-init", 2.0))),
        (" pod-failure = 3 , evict", (("pod-failure", 3.0), ("evict", 1.0))),
    ],
)
def test_mix_parses_kinds_with_optional_weights(text: str, mix: tuple[tuple[str, float], ...]) -> None:
    assert parse_mix(text) == mix


@pytest.mark.parametrize("text", ["crash=1", "pod-failure,", "", "Evict=1"])
def test_mix_refuses_unknown_kinds(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown fault kind"):
        parse_mix(text)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("crash", "unknown fault kind"),
        ("evict=lots", "weight of 'evict' is not a number"),
        ("evict=-1,pod-failure=2", "weight of 'evict' is negative"),
        ("evict=0,pod-failure=0", "at least one fault kind needs a weight above 0"),
    ],
)
def test_a_bad_mix_on_the_command_line_is_a_usage_error(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["--mix", value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
