"""The mass-start benchmark's own parts: the Jobs its ceiling creates, the rates and lags it
derives from watch events and creationTimestamps, and the testbed alone (no controller) it
measures the ceiling on. Every input is built by hand; nothing talks to a server.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.config import BenchError
from bench.controller import start_controller
from bench.massstart import (
    MassConfig,
    StartTracker,
    ceiling_job,
    cost,
    creation_rates,
    render,
    stamp_rate,
    summarise,
)
from bench.plan import AwSpec, plan_workload
from bench.samples import Mark
from bench.tracker import AwRec
from bench.workload import appwrapper_manifest
from respawn.testbed.cluster import State
from services.lifecycle.hooks import hooks_for
from shared.appwrapper.constants import APPWRAPPER_LABEL, COMPONENT_ANNOTATION
from shared.config import LifecycleConfig, OperatorConfig


def test_the_start_is_of_plain_jobs_and_the_ceiling_has_as_many_creates_in_flight_as_lifecycle_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RESPAWN_LIFECYCLE_WORKERS", raising=False)
    monkeypatch.delenv("RESPAWN_CONFIG", raising=False)
    cfg = MassConfig(appwrappers=30, pods_per_aw=2)
    workload = plan_workload(cfg.bench_config())
    assert len(workload) == 30
    assert {(s.kind, s.pods, s.gpu) for s in workload} == {("job", 2, False)}
    assert cfg.ceiling_concurrency == LifecycleConfig().workers == 8
    # The services started by the benchmark inherit its environment: so does the ceiling.
    monkeypatch.setenv("RESPAWN_LIFECYCLE_WORKERS", "5")
    assert MassConfig().ceiling_concurrency == 5


def test_the_ceiling_creates_the_job_the_appwrapper_wraps_with_lifecycles_labels_and_no_owner() -> None:
    cfg = MassConfig().bench_config()
    spec = AwSpec("aw-007", "job", 2, False)
    job = ceiling_job(spec, cfg, "ns", hooks_for(OperatorConfig()))
    wrapped = appwrapper_manifest(spec, cfg)["spec"]["components"][0]["template"]

    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["metadata"]["name"] == wrapped["metadata"]["name"]
    assert job["metadata"]["namespace"] == "ns"
    assert job["metadata"]["labels"][APPWRAPPER_LABEL] == "aw-007"
    assert COMPONENT_ANNOTATION in job["metadata"]["annotations"]
    # No AppWrapper exists to own it: an owner reference would have the garbage collector delete it.
    assert "ownerReferences" not in job["metadata"]
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert job["spec"]["template"]["metadata"]["labels"][APPWRAPPER_LABEL] == "aw-007"
    assert job["spec"]["template"]["spec"]["containers"] == wrapped["spec"]["template"]["spec"]["containers"]


def test_creation_rates_count_n_over_first_to_last_and_take_the_median_of_whole_windows() -> None:
    # 10/s for 10 s, then 30/s for 10 s, then 20/s for 10 s, then 5 more in a last, cut-short window.
    times = [100 + i / 10 for i in range(100)]
    times += [110 + i / 30 for i in range(300)]
    times += [120 + i / 20 for i in range(200)]
    times += [130 + i / 10 for i in range(5)]
    rates = creation_rates(times, t0=99.0)

    assert rates["n"] == 605
    assert rates["first_after_s"] == 1.0
    assert rates["last_after_s"] == pytest.approx(31.4)
    assert rates["per_s_overall"] == pytest.approx(605 / 30.4)
    assert rates["windows_per_s"] == pytest.approx([10.0, 30.0, 20.0])
    assert rates["per_s_p50_10s"] == pytest.approx(20.0)


def test_a_start_shorter_than_a_window_has_its_overall_rate_as_median_and_none_has_no_rate() -> None:
    rates = creation_rates([5.0, 5.5, 6.0], t0=4.0)
    assert rates["windows_per_s"] == []
    assert rates["per_s_overall"] == rates["per_s_p50_10s"] == pytest.approx(3.0)
    assert creation_rates([], t0=0.0) == {"n": 0}


def test_creation_timestamps_are_whole_seconds_so_the_first_and_last_second_both_count() -> None:
    t = datetime(2025, 1, 1, tzinfo=UTC)
    assert stamp_rate([t] * 20) == {"n": 20, "span_s": 1.0, "per_s": 20.0}
    assert stamp_rate([t, t + timedelta(seconds=9)])["per_s"] == pytest.approx(0.2)
    assert stamp_rate([]) == {"n": 0}


def _job(owner: str, stamp: str) -> dict[str, object]:
    return {
        "kind": "Job",
        "metadata": {
            "name": owner,
            "uid": f"j-{owner}",
            "labels": {APPWRAPPER_LABEL: owner},
            "creationTimestamp": stamp,
        },
    }


def _pod(owner: str, uid: str, phase: str, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": uid, "uid": uid, "labels": {APPWRAPPER_LABEL: owner}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:09Z"
    return {"metadata": meta, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": phase}}


def test_the_tracker_keeps_first_sightings_and_the_moment_the_last_pod_runs() -> None:
    tracker = StartTracker(pods=2)
    for name in ("a", "b"):
        tracker.aws[name] = AwRec(AwSpec(name, "job", 1, False))
    tracker.on_appwrapper("ADDED", {"metadata": {"name": "a"}}, 1.0)
    tracker.on_appwrapper("MODIFIED", {"metadata": {"name": "a"}}, 2.0)
    tracker.on_appwrapper("ADDED", {"metadata": {"name": "stranger"}}, 2.0)
    tracker.on_component("ADDED", _job("a", "2025-01-01T00:00:03Z"), 3.0)
    tracker.on_component("MODIFIED", _job("a", "2025-01-01T00:00:03Z"), 4.0)
    assert tracker.aw_seen == {"a": 1.0}
    assert tracker.job_seen == {"a": 3.0}
    assert tracker.job_stamps == {"a": datetime(2025, 1, 1, 0, 0, 3, tzinfo=UTC)}

    tracker.on_pod("ADDED", _pod("a", "p1", "Running"), 5.0)
    tracker.on_pod("ADDED", _pod("b", "p2", "Pending"), 5.5)
    tracker.on_pod("MODIFIED", _pod("a", "p1", "Running", deleting=True), 6.0)
    tracker.on_pod("MODIFIED", _pod("b", "p2", "Running"), 7.0)
    assert tracker.t_all_running is None, "a pod being deleted is not running"
    tracker.on_pod("ADDED", _pod("a", "p3", "Running"), 8.0)
    assert tracker.t_all_running == 8.0
    tracker.on_pod("DELETED", _pod("a", "p3", "Running"), 9.0)
    assert tracker.t_all_running == 8.0, "the first moment every pod ran is kept"


def test_the_testbed_alone_starts_nothing_and_refuses_one_running_respawns_services(tmp_path: Path) -> None:
    alive = os.getpid()
    bare = State(
        tmp_path, tmp_path / "kubeconfig", "nats://127.0.0.1:1", "https://127.0.0.1:2", pids={"etcd": alive}
    )
    assert start_controller("none", bare, lambda _: None) == ({}, [])
    busy = State(
        tmp_path,
        tmp_path / "kubeconfig",
        "nats://127.0.0.1:1",
        "https://127.0.0.1:2",
        pids={"lifecycle": alive},
    )
    with pytest.raises(BenchError, match=r"runs Respawn's services \(lifecycle\).*--no-services"):
        start_controller("none", busy, lambda _: None)


def _side(rate: float, marks: list[Mark], controller: dict[str, int]) -> dict[str, Any]:
    return {
        "namespace": "ns",
        "appwrappers": 10,
        "pods": 10,
        "client": {"per_s": rate},
        "submission": {"per_s": 100.0},
        "jobs_created": {"n": 10, "per_s_overall": rate, "per_s_p50_10s": rate, "last_after_s": 10 / rate},
        "jobs_created_stamps": {"n": 10, "span_s": 1.0, "per_s": rate},
        "lag_s": {"p50": 0.5, "p99": 2.0, "max": 2.5},
        "all_pods_running_s": 20 / rate,
        "cleanup_s": 3.0,
        "left": [],
        "cost": cost(marks, controller, {"kube-apiserver": 1, "etcd": 2, "nats-server": 3}),
    }


def test_cpu_is_summed_over_the_control_plane_and_the_services_and_the_table_shows_both_sides() -> None:
    cluster = {"kube-apiserver": 1.0, "etcd": 0.5, "nats-server": 0.1}
    ceiling_marks = [
        Mark("begin", 0.0, cluster),
        Mark("start", 10.0, {"kube-apiserver": 3.0, "etcd": 1.0, "nats-server": 0.1}),
    ]
    respawn_marks = [
        Mark("begin", 0.0, {**cluster, "lifecycle": 1.0, "health-0": 0.0, "health-1": 0.0}),
        Mark(
            "start",
            20.0,
            {
                "kube-apiserver": 9.0,
                "etcd": 2.5,
                "nats-server": 1.1,
                "lifecycle": 4.0,
                "health-0": 1.0,
                "health-1": 2.0,
            },
        ),
        Mark(
            "catch_up",
            21.0,
            {
                "kube-apiserver": 9.5,
                "etcd": 2.5,
                "nats-server": 1.2,
                "lifecycle": 4.5,
                "health-0": 1.0,
                "health-1": 2.0,
            },
        ),
    ]
    ceiling = _side(40.0, ceiling_marks, {})
    respawn = _side(10.0, respawn_marks, {"lifecycle": 4, "health-0": 5, "health-1": 6})

    assert ceiling["cost"]["control_plane_cpu_phases_s"] == {"start": 2.5}, (
        "nats-server is not the control plane"
    )
    assert ceiling["cost"]["services"] == {}
    assert respawn["cost"]["control_plane_cpu_phases_s"] == {"start": 10.0, "catch_up": 0.5}
    assert respawn["cost"]["controller_cpu_phases_s"] == {"start": 6.0, "catch_up": 0.5}
    assert respawn["cost"]["services"]["health"] == {
        "processes": ["health-0", "health-1"],
        "cpu_phases_s": {"start": 3.0, "catch_up": 0.0},
    }

    ratios = summarise(ceiling, respawn)
    assert ratios["per_s_overall"] == ratios["per_s_p50_10s"] == ratios["per_s_stamps"] == 0.25
    assert ratios["all_pods_running_s"] == 4.0
    table = render(
        {
            "config": {"appwrappers": 10, "pods_per_aw": 1},
            "testbed": {"nodes": 4},
            "ceiling": ceiling,
            "respawn": respawn,
            "ratio": ratios,
        }
    )
    assert "| **Jobs created, overall** (watch: N over first to last) | 40.0/s | 10.0/s | 0.25x |" in table
    assert "| **CPU-s control plane, start** | 2.50 | 10.00 | 4.00x |" in table
    assert "| CPU-s health, start / catch-up | — | 3.00 / 0.00 |  |" in table
    assert "| AppWrapper → its Job, p50 / p99 / max | — | 500 ms / 2.0 s / 2.5 s |  |" in table
