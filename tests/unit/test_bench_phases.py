"""The benchmark's cost per phase and per service replica: the CPU of each phase from its marks,
the per-service sums, the tables of a run and of a comparison, and the --replicas flag down to
which service processes a run starts. Every input is built by hand; nothing talks to a server.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import pytest

from bench import compare, report
from bench.config import BenchConfig, BenchError, add_arguments, config_from, parse_replicas_flag
from bench.controller import running_services, start_controller, to_start
from bench.procstat import ProcUsage
from bench.report import PHASE_LABELS, PHASES, WHOLE_RUN, by_service, cost, phase_rows, phase_seconds
from bench.run import run
from bench.samples import Mark, Snapshot
from bench.testbed import services
from respawn.testbed.cluster import State

# Above the kernel's highest possible pid (PID_MAX_LIMIT, 2**22): never a live process.
DEAD_PID = 2**22 + 1

PEAK = {1: 100.0, 2: 120.0, 3: 90.0}  # peak RSS (MiB) by pid


@pytest.fixture
def fake_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    def usage(pid: int) -> ProcUsage:
        if pid in PEAK:
            return ProcUsage(cpu_seconds=0.0, rss_mib=10.0, peak_rss_mib=PEAK[pid])
        raise FileNotFoundError(f"/proc/{pid}/stat")

    monkeypatch.setattr(report, "usage", usage)


def marks() -> list[Mark]:
    """Two health replicas and a watcher through every phase; the watcher exits during clean-up
    (it is missing from the last mark)."""
    cpu = [
        {"health-0": 1.0, "health-1": 2.0, "watcher": 0.5},
        {"health-0": 3.0, "health-1": 5.0, "watcher": 4.5},  # set-up
        {"health-0": 3.5, "health-1": 5.5, "watcher": 5.0},  # catch-up
        {"health-0": 3.75, "health-1": 5.5, "watcher": 5.25},  # idle
        {"health-0": 8.0, "health-1": 9.0, "watcher": 9.0},  # faults
        {"health-0": 8.0, "health-1": 9.25, "watcher": 9.0},  # baseline
        {"health-0": 9.0, "health-1": 10.0},  # clean-up
    ]
    walls = [0.0, 30.0, 40.0, 100.0, 250.0, 320.0, 350.0]
    return [Mark(phase, wall, c) for phase, wall, c in zip(("start", *PHASES), walls, cpu, strict=True)]


def phased_cost() -> dict[str, Any]:
    m = marks()
    empty = Snapshot(0.0, {}, {}, {})
    return cost(
        {"health-0": 1, "health-1": 2, "watcher": 3}, m[0].cpu, m[5].cpu, None, None, empty, empty, 0, m
    )


# ------------------------------------------------------------------ CPU per phase


def test_marks_bound_the_phases_in_order_and_their_durations() -> None:
    assert phase_seconds(marks()) == {
        "setup": 30.0,
        "catch_up": 10.0,
        "idle": 60.0,
        "faults": 150.0,
        "baseline": 70.0,
        "cleanup": 30.0,
    }
    assert phase_seconds(marks()[:1]) == {}, "one mark bounds no phase"
    assert list(PHASE_LABELS) == list(PHASES)


def test_cost_gives_each_process_its_cpu_per_phase_and_over_the_whole_run(fake_usage: None) -> None:
    out = phased_cost()
    health0 = out["processes"]["health-0"]
    assert health0["service"] == "health"
    assert health0["cpu_phases_s"] == pytest.approx(
        {"setup": 2.0, "catch_up": 0.5, "idle": 0.25, "faults": 4.25, "baseline": 0.0, "cleanup": 1.0}
    )
    assert health0["cpu_whole_run_s"] == pytest.approx(8.0)
    # cpu_s keeps its meaning: set-up to the end of the baseline window, no clean-up.
    assert health0["cpu_s"] == pytest.approx(7.0)
    assert health0["peak_rss_mib"] == 100.0
    # The phases add up to the whole run.
    assert sum(health0["cpu_phases_s"].values()) == pytest.approx(health0["cpu_whole_run_s"])
    # A process missing from a mark has no figure for the phases that mark bounds.
    watcher = out["processes"]["watcher"]
    assert watcher["cpu_phases_s"]["faults"] == pytest.approx(3.75)
    assert watcher["cpu_phases_s"]["cleanup"] is None
    assert watcher["cpu_whole_run_s"] is None


def test_cost_sums_the_phases_over_every_process(fake_usage: None) -> None:
    out = phased_cost()
    assert out["cpu_phases_s"] == pytest.approx(
        {"setup": 9.0, "catch_up": 1.5, "idle": 0.5, "faults": 11.5, "baseline": 0.25, "cleanup": 1.75}
    )
    # The watcher's whole run is unknown (it exited): the health replicas' 8.0 + 8.0.
    assert out["whole_run_cpu_s"] == pytest.approx(16.0)
    assert out["total_cpu_s"] == pytest.approx(7.0 + 7.25 + 8.5)


def test_cost_sums_replicas_per_service(fake_usage: None) -> None:
    health = phased_cost()["services"]["health"]
    assert health["processes"] == ["health-0", "health-1"]
    assert health["cpu_s"] == pytest.approx(14.25)
    assert health["cpu_whole_run_s"] == pytest.approx(16.0)
    assert health["cpu_phases_s"]["setup"] == pytest.approx(5.0)
    assert health["cpu_phases_s"]["cleanup"] == pytest.approx(1.75)
    assert (health["peak_rss_mib_sum"], health["peak_rss_mib_max"]) == (220.0, 120.0)
    watcher = phased_cost()["services"]["watcher"]
    assert watcher["processes"] == ["watcher"]
    assert watcher["cpu_phases_s"]["cleanup"] is None, "no process of it has the figure"
    assert (watcher["peak_rss_mib_sum"], watcher["peak_rss_mib_max"]) == (90.0, 90.0)


def test_by_service_leaves_unknown_values_out_and_keeps_other_processes_apart() -> None:
    out = by_service(
        {
            "lifecycle-1": {"cpu_s": 2.0, "peak_rss_mib": None, "idle_cpu_percent": 1.5},
            "lifecycle-0": {"cpu_s": 1.0, "peak_rss_mib": 80.0, "idle_cpu_percent": None},
            "appwrapper-controller": {"cpu_s": 5.0},
        }
    )
    assert list(out) == ["appwrapper-controller", "lifecycle"]
    assert out["lifecycle"]["processes"] == ["lifecycle-0", "lifecycle-1"]
    assert out["lifecycle"]["cpu_s"] == 3.0
    assert out["lifecycle"]["idle_cpu_percent"] == 1.5
    assert out["lifecycle"]["cpu_whole_run_s"] is None
    assert out["lifecycle"]["cpu_phases_s"] == {}
    assert (out["lifecycle"]["peak_rss_mib_sum"], out["lifecycle"]["peak_rss_mib_max"]) == (80.0, 80.0)
    assert out["appwrapper-controller"]["processes"] == ["appwrapper-controller"]
    assert out["appwrapper-controller"]["peak_rss_mib_sum"] is None


@pytest.mark.parametrize(
    ("process", "service"),
    [("health", "health"), ("health-1", "health"), ("autopilot-12", "autopilot"),
     ("appwrapper-controller", "appwrapper-controller"), ("health-x", "health-x")],
)  # fmt: skip
def test_a_process_belongs_to_its_service_or_is_its_own(process: str, service: str) -> None:
    assert report.service_name(process) == service


# ------------------------------------------------------------------ tables


def phased_result(controller: str = "respawn") -> dict[str, Any]:
    m = marks()
    return {
        "controller": controller,
        "config": {"appwrappers": 10, "pods_per_aw": 2, "fault_rate": 0.1, "duration": 60, "seed": 3},
        "correctness": {"ok": True},
        "setup": {"all_running_s": 30.0},
        "cleanup_s": 30.0,
        "phases_s": phase_seconds(m),
        "cost": phased_cost(),
    }


def legacy_result() -> dict[str, Any]:
    """A result saved before the phases were measured."""
    return {
        "controller": "upstream",
        "config": {},
        "correctness": {"ok": True},
        "setup": {"all_running_s": 44.0},
        "cleanup_s": 20.0,
        "cost": {
            "total_cpu_s": 6.0,
            "processes": {"appwrapper-controller": {"cpu_s": 6.0, "peak_rss_mib": 70.0}},
        },
    }


def test_phase_rows_cover_every_phase_and_the_whole_run(fake_usage: None) -> None:
    rows = phase_rows(phased_result())
    assert [label for label, _, _ in rows] == [*(PHASE_LABELS[p] for p in PHASES), WHOLE_RUN]
    by_label = {label: (wall, cpu) for label, wall, cpu in rows}
    assert by_label[PHASE_LABELS["cleanup"]] == (30.0, pytest.approx(1.75))
    assert by_label[WHOLE_RUN] == (350.0, pytest.approx(16.0))


def test_phase_rows_of_an_older_result_have_only_set_up_and_clean_up_times() -> None:
    rows = {label: (wall, cpu) for label, wall, cpu in phase_rows(legacy_result())}
    assert rows[PHASE_LABELS["setup"]] == (44.0, None)
    assert rows[PHASE_LABELS["cleanup"]] == (20.0, None)
    assert rows[PHASE_LABELS["idle"]] == (None, None)
    assert rows[WHOLE_RUN] == (None, None)


def test_figures_sum_a_service_with_replicas_and_keep_each_replica(fake_usage: None) -> None:
    table = {name: (value, unit) for name, value, unit in report.figures(phased_result())}
    assert table["cpu whole run incl. clean-up (controller)"] == (pytest.approx(16.0), "cpu-s")
    assert table["cpu health (2 processes)"] == (pytest.approx(14.25), "cpu-s")
    assert table["peak rss health (2 processes, sum)"] == (220.0, "MiB")
    assert table["cpu health-0"] == (pytest.approx(7.0), "cpu-s")
    assert table["peak rss health-1"] == (120.0, "MiB")
    # A service of one process has its own row only.
    assert "cpu watcher" in table
    assert not any(name.startswith("cpu watcher (") for name in table)


def test_render_has_the_phase_table_and_a_row_per_replica(fake_usage: None) -> None:
    lines = report.render(phased_result()).splitlines()
    assert "| phase | wall | controller CPU-s | health | watcher |" in lines
    assert f"| {PHASE_LABELS['setup']} | 30.0 s | 9.00 | 5.00 | 4.00 |" in lines
    assert f"| {PHASE_LABELS['cleanup']} | 30.0 s | 1.75 | 1.75 | — |" in lines
    assert f"| {WHOLE_RUN} | 350.0 s | 16.00 | 16.00 | — |" in lines
    assert "| health-0 | health | 2.00 | 0.50 | 0.25 | 4.25 | 0.00 | 1.00 | 8.00 | 100 |" in lines
    assert "| health-1 | health | 3.00 | 0.50 | 0.00 | 3.50 | 0.25 | 0.75 | 8.00 | 120 |" in lines
    assert "| watcher | watcher | 4.00 | 0.50 | 0.25 | 3.75 | 0.00 | — | — | 90 |" in lines


def test_compare_cpu_phase_rows_give_respawn_over_upstream(fake_usage: None) -> None:
    ours = phased_result()
    theirs = phased_result("upstream")
    theirs["cost"] = {**theirs["cost"], "cpu_phases_s": {p: 2.0 for p in PHASES}, "whole_run_cpu_s": 4.0}
    rows = {row[0]: row[1:] for row in compare.cpu_phase_rows({"respawn": ours, "upstream": theirs})}
    assert list(rows) == [*(PHASE_LABELS[p] for p in PHASES), WHOLE_RUN]
    assert rows[PHASE_LABELS["setup"]] == ("30.0 s", "30.0 s", "9.00 cpu-s", "2.00 cpu-s", "4.50x")
    assert rows[PHASE_LABELS["cleanup"]] == ("30.0 s", "30.0 s", "1.75 cpu-s", "2.00 cpu-s", "0.88x")
    assert rows[WHOLE_RUN] == ("350.0 s", "350.0 s", "16.00 cpu-s", "4.00 cpu-s", "4.00x")


def test_compare_cpu_phase_rows_with_an_older_and_a_failed_run(fake_usage: None) -> None:
    rows = {
        row[0]: row[1:]
        for row in compare.cpu_phase_rows({"respawn": phased_result(), "upstream": legacy_result()})
    }
    assert rows[PHASE_LABELS["cleanup"]] == ("30.0 s", "20.0 s", "1.75 cpu-s", "—", "—")
    assert rows[PHASE_LABELS["setup"]][1] == "44.0 s"
    failed = {"controller": "upstream", "error": "no image"}
    rows = {
        row[0]: row[1:] for row in compare.cpu_phase_rows({"respawn": phased_result(), "upstream": failed})
    }
    assert rows[WHOLE_RUN] == ("350.0 s", "n/a", "16.00 cpu-s", "n/a", "—")
    # A zero upstream figure gives no ratio rather than a division by zero.
    theirs = phased_result("upstream")
    theirs["cost"] = {**theirs["cost"], "whole_run_cpu_s": 0.0}
    rows = {
        row[0]: row[1:] for row in compare.cpu_phase_rows({"respawn": phased_result(), "upstream": theirs})
    }
    assert rows[WHOLE_RUN][4] == "—"


def test_compare_render_shows_the_phases_and_each_controllers_services(fake_usage: None) -> None:
    results = {"respawn": phased_result(), "upstream": legacy_result()}
    lines = compare.render(results).splitlines()
    assert (
        "| phase | wall Respawn | wall upstream | CPU Respawn | CPU upstream | Respawn ÷ upstream |" in lines
    )
    for row in compare.cpu_phase_rows(results):
        assert f"| {' | '.join(row)} |" in lines, row
    assert "respawn, CPU seconds per service and phase (replicas summed):" in lines
    assert not any(line.startswith("upstream, CPU seconds per service") for line in lines), "no phases saved"


@pytest.mark.parametrize(
    ("replicas", "stem"),
    [
        ((), "compare-n100x8-seed1"),
        ((("health", 1),), "compare-n100x8-seed1"),
        ((("health", 2), ("lifecycle", 3)), "compare-n100x8-seed1-health2-lifecycle3"),
    ],
)
def test_result_files_name_replicas_other_than_one(replicas: tuple[tuple[str, int], ...], stem: str) -> None:
    assert compare.result_stem(100, 8, 1, replicas) == stem


# ------------------------------------------------------------------ --replicas


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_replicas_flag_reaches_respawns_config_only() -> None:
    args = parse("--replicas", "health=2, lifecycle=2,watcher=2,autopilot=2")
    want = (("health", 2), ("lifecycle", 2), ("watcher", 2), ("autopilot", 2))
    assert config_from(args, "respawn").replicas == want
    assert config_from(args, "upstream").replicas == (), "the upstream controller is one process"
    assert config_from(parse(), "respawn").replicas == () == BenchConfig().replicas


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("helth=2", "unknown service 'helth'"),
        ("health=9", "health=9: the count must be a whole number from 1 to 8"),
        ("health=0", "the count must be a whole number"),
        ("health", "'health' is not SERVICE=COUNT"),
        ("health=2,health=3", "health is given twice"),
    ],
)
def test_a_bad_replicas_flag_is_a_usage_error(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--replicas", value)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError, match=message.split(":")[0]):
        parse_replicas_flag(value)


def test_replicas_with_the_upstream_controller_are_refused_before_anything_starts() -> None:
    with pytest.raises(BenchError, match="--replicas counts Respawn's services"):
        run(BenchConfig(controller="upstream", replicas=(("health", 2),)))


# ------------------------------------------------------------------ which processes a run starts


def test_on_a_testbed_without_services_one_of_each_is_started_or_the_replicas_asked_for() -> None:
    assert to_start({}, {}) == ["watcher", "health", "lifecycle", "autopilot"]
    assert to_start({}, {"health": 2, "lifecycle": 3, "autopilot": 1}) == [
        "watcher",
        "health-0",
        "health-1",
        "lifecycle-0",
        "lifecycle-1",
        "lifecycle-2",
        "autopilot",
    ]


def test_services_that_run_are_used_as_they_run() -> None:
    running = {"health": ["health-0", "health-1"], "watcher": ["watcher"]}
    assert to_start(running, {}) == ["lifecycle", "autopilot"], "no extra health or watcher process"
    assert to_start(running, {"health": 2, "lifecycle": 2}) == ["lifecycle-0", "lifecycle-1", "autopilot"]


def test_a_service_running_another_count_than_asked_is_refused_with_the_fix() -> None:
    with pytest.raises(BenchError) as exc:
        to_start({"health": ["health"]}, {"health": 2})
    message = str(exc.value)
    assert "runs 1 health process(es) (health), not the 2 --replicas asks for" in message
    assert "respawn local up --state-dir DIR --replicas health=2" in message


def state(tmp_path: Path, pids: dict[str, int]) -> State:
    return State(tmp_path, tmp_path / "kubeconfig", "nats://127.0.0.1:1", "https://127.0.0.1:2", pids=pids)


def test_running_services_finds_replicas_by_name_and_leaves_out_dead_ones(tmp_path: Path) -> None:
    alive = os.getpid()
    pids = {
        "etcd": alive,
        "health-1": alive,
        "health-0": alive,
        "lifecycle": alive,
        "watcher": DEAD_PID,
        "appwrapper-controller": alive,
    }
    bed = state(tmp_path, pids)
    assert running_services(bed) == {"health": ["health-0", "health-1"], "lifecycle": ["lifecycle"]}
    # What the single-service benchmarks settle and print: every replica of every service.
    assert services(bed) == {"health-1": alive, "health-0": alive, "lifecycle": alive, "watcher": DEAD_PID}


def test_a_testbed_whose_replicas_all_run_is_measured_without_starting_anything(tmp_path: Path) -> None:
    alive = os.getpid()
    names = ["watcher-0", "watcher-1", "health-0", "health-1", "lifecycle-0", "lifecycle-1", "autopilot"]
    bed = state(tmp_path, dict.fromkeys(names, alive))
    processes, started = start_controller("respawn", bed, lambda _: None, {"health": 2, "watcher": 2})
    assert started == []
    assert processes == dict.fromkeys(sorted(names), alive)
    with pytest.raises(BenchError, match=r"runs Respawn's services .*health-0, health-1"):
        start_controller("upstream", bed, lambda _: None)


def test_phase_figures_are_rounded_to_a_thousandth() -> None:
    # CPU time comes in 10 ms ticks; differences of floats must not carry noise into the JSON.
    pair = [Mark("start", 0.1, {"p": 0.2}), Mark("setup", 0.3, {"p": 1.1})]
    assert 1.1 - 0.2 != 0.9 and 0.3 - 0.1 != 0.2
    assert report.phase_cpu(pair, "p") == {"setup": 0.9}
    assert report.whole_run_cpu(pair, "p") == 0.9
    assert phase_seconds(pair) == {"setup": 0.2}
