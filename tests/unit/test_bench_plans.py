"""The benchmark harness's pure parts: what it plans, how it reads figures, how it compares."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench import compare, run
from bench.common import fmt_ms, percentiles
from shared.appwrapper import params
from shared.appwrapper.constants import API_VERSION, KIND


def cfg(**changes: Any) -> run.BenchConfig:
    return run.BenchConfig(**changes)


# ------------------------------------------------------------------ plans


def test_the_workload_has_exact_shares_and_depends_only_on_the_seed() -> None:
    config = cfg(appwrappers=200, gpu_fraction=0.25, pytorch_fraction=0.4, seed=7)
    plan = run.plan_workload(config)
    assert len(plan) == 200
    assert len({s.name for s in plan}) == 200
    assert sum(s.gpu for s in plan) == 50
    assert sum(s.kind == "pytorchjob" for s in plan) == 80
    assert run.plan_workload(config) == plan
    assert run.plan_workload(cfg(appwrappers=200, gpu_fraction=0.25, pytorch_fraction=0.4, seed=8)) != plan


def test_names_sort_in_submission_order() -> None:
    names = [s.name for s in run.plan_workload(cfg(appwrappers=12))]
    assert names[:3] == ["aw-00", "aw-01", "aw-02"]
    assert names == sorted(names)


def test_faults_arrive_at_about_the_rate_within_the_duration_with_the_mix() -> None:
    config = cfg(fault_rate=2.0, duration=500.0, mix=(("pod-failure", 3.0), ("evict", 1.0)), seed=3)
    faults = run.plan_faults(config)
    assert 850 <= len(faults) <= 1150  # Poisson: 1,000 expected
    assert all(0 < f.at <= 500.0 for f in faults)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    share = sum(f.kind == "pod-failure" for f in faults) / len(faults)
    assert 0.70 <= share <= 0.80
    assert {f.kind for f in faults} == {"pod-failure", "evict"}
    assert run.plan_faults(config) == faults


def test_fault_count_is_capped_and_a_given_plan_is_used_as_is() -> None:
    assert len(run.plan_faults(cfg(fault_rate=5.0, duration=100.0, max_faults=7))) == 7
    assert run.plan_faults(cfg(fault_rate=0.0)) == []
    given = (run.PlannedFault(1.0, "evict"),)
    assert run.plan_faults(cfg(fault_plan=given)) == list(given)


def test_nodes_leave_headroom_for_pods_and_for_gpus() -> None:
    config = cfg(appwrappers=100, pods_per_aw=8, gpu_fraction=0.0)
    workload = run.plan_workload(config)
    # 800 pods at 100 a node, plus a quarter, plus 2.
    assert run.nodes_needed(config, workload, []) == 12
    gpus = cfg(appwrappers=100, pods_per_aw=8, gpu_fraction=0.5)
    # 400 GPU pods at 8 a node decide: 50 * 1.25 + 2.
    assert run.nodes_needed(gpus, run.plan_workload(gpus), []) == 65
    assert run.nodes_needed(cfg(appwrappers=1, pods_per_aw=1), run.plan_workload(cfg(appwrappers=1)), []) == 4


def test_a_job_manifest_is_an_appwrapper_with_the_configured_periods() -> None:
    config = cfg(failure_grace="3s", retry_pause="7s")
    spec = run.AwSpec("aw-1", "job", 4, True)
    aw = run.appwrapper_manifest(spec, config)
    assert (aw["apiVersion"], aw["kind"]) == (API_VERSION, KIND)
    annotations = aw["metadata"]["annotations"]
    assert annotations[params.FAILURE_GRACE_PERIOD_ANNOTATION] == "3s"
    assert annotations[params.RETRY_PAUSE_PERIOD_ANNOTATION] == "7s"
    job = aw["spec"]["components"][0]["template"]
    assert job["kind"] == "Job"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {run.GPU_RESOURCE: "1"}}


def test_a_pytorchjob_manifest_has_one_master_and_the_rest_workers() -> None:
    aw = run.appwrapper_manifest(run.AwSpec("aw-2", "pytorchjob", 8, False), cfg())
    replicas = aw["spec"]["components"][0]["template"]["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] == 7
    assert replicas["Master"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    assert replicas["Master"]["template"]["spec"]["containers"][0]["resources"] == {}
    single = run.appwrapper_manifest(run.AwSpec("aw-3", "pytorchjob", 1, False), cfg())
    assert "Worker" not in single["spec"]["components"][0]["template"]["spec"]["pytorchReplicaSpecs"]


# ------------------------------------------------------------------ reading figures


def test_api_requests_sum_per_verb_and_resource() -> None:
    text = "\n".join(
        [
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="200",resource="pods",verb="LIST"} 3',
            'apiserver_request_total{code="500",resource="pods",verb="LIST"} 2',
            'apiserver_request_total{code="200",resource="appwrappers",subresource="status",verb="PATCH"} 5',
            'apiserver_request_total{code="200",verb="GET"} 1',
            "# TYPE other_total counter",
            'other_total{verb="LIST"} 100',
        ]
    )
    assert run.api_requests(text + "\n") == {"LIST pods": 5.0, "PATCH appwrappers/status": 5.0, "GET -": 1.0}


def fault(kind: str, **times: float) -> run.Fault:
    return run.Fault(id=1, kind=kind, aw="aw-1", t0=100.0, counted=True, **times)  # type: ignore[arg-type]


def test_latencies_start_at_the_fault_and_recovery_excludes_grace_and_pause() -> None:
    config = cfg(failure_grace="2s", retry_pause="3s")
    faults = [
        fault("pod-failure", t_verdict=100.05, t_unhealthy=100.25, t_delete=100.3, t_recovered=110.0),
        fault("evict", t_unhealthy=100.5, t_recovered=105.0),
        fault("stuck-init", deadline=130.0, t_unhealthy=130.2),
        fault("pod-failure", timed=False, t_unhealthy=101.0),
    ]
    lat = run.latencies(faults, config)
    assert lat["detection"]["pod-failure"] == pytest.approx([0.25])
    assert lat["detection"]["stuck-init"] == pytest.approx([0.2]), "from the warmup deadline"
    assert lat["detection"]["all"] == pytest.approx([0.25, 0.5, 0.2]), "untimed faults are left out"
    assert lat["verdict"]["all"] == pytest.approx([0.05])
    assert lat["reaction"]["all"] == pytest.approx([0.05])
    # Pod failure: 10 s - 3 s pause - 2 s failure grace; eviction: 5 s - 3 s pause (no grace).
    assert lat["recovery"]["pod-failure"] == pytest.approx([5.0])
    assert lat["recovery"]["evict"] == pytest.approx([2.0])


def test_percentiles_of_a_known_list_and_of_none() -> None:
    stats = percentiles([float(i) for i in range(1, 101)])
    assert (stats["n"], stats["p50"], stats["p90"], stats["p99"], stats["max"]) == (100, 51, 90, 99, 100)
    assert stats["mean"] == pytest.approx(50.5)
    assert percentiles([]) == {}
    assert fmt_ms({}) == "no samples"
    assert fmt_ms(percentiles([0.01, 0.02])).startswith("n=2 p50=")


def test_values_are_formatted_by_unit() -> None:
    assert run.format_value(None, "s") == "—"
    assert run.format_value(0.0685, "s") == "68.5 ms"
    assert run.format_value(23.9, "s") == "23.9 s"
    assert run.format_value(1234.0, "count") == "1,234"
    assert run.format_value(1.25, "% of a core") == "1.2 % of a core"


def result(detection: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "controller": "respawn",
        "config": {"appwrappers": 10, "pods_per_aw": 2, "fault_rate": 0.1, "duration": 60, "seed": 1},
        "latency": {"detection": {"all": detection, "pod-failure": detection}},
        "faults": {"injected": {"pod-failure": len(detection)}},
        "correctness": {"duplicated": ["aw-1: 2 resets for 1 faults"]},
        "setup": {"all_running_s": 12.0},
        "cleanup_s": 3.0,
        "cost": {
            "total_cpu_s": 9.0,
            "api_requests_per_min_idle": {
                "with_controller": 10.0,
                "controller_stopped": 8.0,
                "controller_by_request": {"LIST appwrappers": 2.0, "WATCH pods": 5.0, "POST events": 9.0},
            },
        },
        **extra,
    }


def test_figures_name_every_measure_and_leave_watches_and_events_out_of_idle_requests() -> None:
    rows = {name: value for name, value, _ in run.figures(result([0.1, 0.2, 0.3]))}
    assert rows["detection all n"] == 3
    assert rows["detection all p50"] == pytest.approx(0.2)
    assert rows["faults injected"] == 3
    assert rows["correctness duplicated"] == 1
    assert rows["api requests/min idle (controller)"] == 2.0
    assert "verdict all n" not in rows, "no verdict samples: no verdict rows"
    text = run.render(result([0.1]))
    assert "| detection all p50 | 100.0 ms |" in text
    assert "| correctness duplicated | 1 |" in text


def test_compare_puts_both_controllers_side_by_side_with_the_ratio() -> None:
    ours = result([0.1, 0.1, 0.1])
    theirs = {**result([10.0, 10.0, 10.0]), "controller": "upstream"}
    rows = {r[0]: r[1:] for r in compare.compare_rows({"respawn": ours, "upstream": theirs})}
    assert rows["detection all p50"] == ("100.0 ms", "10.0 s", "100.0x")
    assert rows["detection all n"][2] == "—", "counts get no ratio"
    failed = {"respawn": ours, "upstream": {"controller": "upstream", "error": "not built"}}
    rows = {r[0]: r[1:] for r in compare.compare_rows(failed)}
    assert rows["detection all p50"] == ("100.0 ms", "n/a", "—")
    assert "detection all p50" in compare.render(failed)


def test_command_line_builds_the_config_and_refuses_an_unknown_fault_kind() -> None:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    args = parser.parse_args(["--appwrappers", "5", "--mix", "evict=2,pod-failure", "--retry-pause", "1s"])
    config = run.config_from(args, "upstream")
    assert (config.controller, config.appwrappers, config.retry_pause) == ("upstream", 5, "1s")
    assert config.mix == (("evict", 2.0), ("pod-failure", 1.0))
    with pytest.raises(argparse.ArgumentTypeError, match="unknown fault kind 'crash'"):
        run._mix("crash=1")
