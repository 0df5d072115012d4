"""The API-requests benchmark's table: requests and CPU per AppWrapper and per pass (pure)."""

from __future__ import annotations

from bench.apirequests import Phase, table


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
