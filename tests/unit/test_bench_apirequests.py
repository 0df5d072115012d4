"""The API-requests benchmark's table: requests and CPU per AppWrapper and per pass (pure)."""

from __future__ import annotations

from bench.apirequests import Phase, table, watcher_counters


def phase(name: str, passes: float, cpu: dict[str, float]) -> Phase:
    return Phase(name, 10.0, passes, requests={("update", "appwrappers/status"): 300.0}, cpu=cpu)


def test_the_table_gives_each_services_cpu_per_appwrapper_and_lifecycles_per_pass() -> None:
    phases = [
        phase("create", 500, {"lifecycle": 2.0, "watcher": 2.5, "health": 1.0}),
        phase("reset", 2000, {"lifecycle": 5.0, "watcher": 6.0, "health": 2.5}),
    ]
    lines = table(phases, 100).splitlines()
    cpu = {line.split()[0]: line for line in lines if "per pass" in line and "ms" in line}
    # 2.0 CPU-s over 100 AppWrappers is 20 ms each; over 500 passes, 4 ms each.
    assert cpu["create"].strip() == (
        "create     health 1.00 (10.00), lifecycle 2.00 (20.00), watcher 2.50 (25.00); "
        "lifecycle per pass 4.00 ms"
    )
    assert "lifecycle 5.00 (50.00)" in cpu["reset"] and "per pass 2.50 ms" in cpu["reset"]
    # The requests are still given per AppWrapper and per pass: 300 updates, 3 per AppWrapper.
    create = next(line for line in lines if line.startswith("create ") and "|" in line)
    assert "3.00|0.60" in create


def test_a_run_without_cpu_figures_prints_no_cpu_section() -> None:
    lines = table([phase("create", 500, {})], 100).splitlines()
    assert not any(line.startswith("CPU-seconds") for line in lines)
    assert lines[-1] == "  update  appwrappers/status           3.00"


WATCHER_METRICS = """\
# HELP respawn_watcher_observations_published_total Observations published, by kind
# TYPE respawn_watcher_observations_published_total counter
respawn_watcher_observations_published_total{kind="observation.pod"} 4100.0
respawn_watcher_observations_published_total{kind="observation.appwrapper"} 700.0
# HELP respawn_watcher_observations_unchanged_total Watch events whose relevant state did not change
# TYPE respawn_watcher_observations_unchanged_total counter
respawn_watcher_observations_unchanged_total{kind="observation.pod"} 1421.0
# HELP respawn_watcher_objects_failed_total Objects not published
# TYPE respawn_watcher_objects_failed_total counter
respawn_watcher_objects_failed_total{kind="observation.pod",reason="too-large"} 3.0
"""


def test_the_watchers_counters_are_read_by_what_it_did_and_kind() -> None:
    assert watcher_counters(WATCHER_METRICS) == {
        ("published", "observation.pod"): 4100.0,
        ("published", "observation.appwrapper"): 700.0,
        ("unchanged", "observation.pod"): 1421.0,
    }


def test_the_table_gives_the_observations_per_appwrapper_published_and_skipped() -> None:
    reset = phase("reset", 2000, {"watcher": 4.0})
    reset.observations = {
        ("published", "observation.pod"): 4100.0,
        ("unchanged", "observation.pod"): 1421.0,
        ("published", "observation.appwrapper"): 700.0,
    }
    lines = table([reset], 100).splitlines()
    heading = lines.index("watch events the watcher published | skipped as unchanged (per AppWrapper):")
    # An AppWrapper kind with nothing skipped shows 0.00 after the bar, not a missing cell.
    assert lines[heading + 1] == "  reset      observation.appwrapper 7.00|0.00, observation.pod 41.00|14.21"


def test_a_run_without_the_watchers_counters_prints_no_observation_section() -> None:
    lines = table([phase("create", 500, {"watcher": 1.0})], 100).splitlines()
    assert not any(line.startswith("watch events") for line in lines)
