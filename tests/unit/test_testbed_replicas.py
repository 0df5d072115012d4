"""`respawn local up --replicas`: the flag, the names of the replicas, what a running testbed
changes, and how `local status` lists the replicas (the processes themselves: test_testbed_cli.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from respawn.cli.main import app
from respawn.testbed.cluster import State
from respawn.testbed.services import (
    MAX_REPLICAS,
    SERVICES,
    instance_names,
    parse_replicas,
    replica_plan,
    service_of,
)

# A pid that no process has (above any pid_max Linux allows).
GONE = 2**30


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("health=2", {"health": 2}),
        ("health=2,lifecycle=2,watcher=2,autopilot=2", dict.fromkeys(SERVICES, 2)),
        (" health = 3 , watcher=1 ", {"health": 3, "watcher": 1}),
        (f"lifecycle={MAX_REPLICAS}", {"lifecycle": MAX_REPLICAS}),
    ],
)
def test_replicas_are_read_per_service(text: str, counts: dict[str, int]) -> None:
    assert parse_replicas(text) == counts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("helth=2", "unknown service 'helth'; choose from watcher, health, lifecycle, autopilot"),
        ("webhook=2", "unknown service 'webhook'; choose from watcher, health, lifecycle, autopilot"),
        ("health=two", "health=two: the count must be a whole number from 1 to 8"),
        ("health=2.5", "health=2.5: the count must be a whole number from 1 to 8"),
        ("health=-1", "health=-1: the count must be a whole number from 1 to 8"),
        ("health=0", "health=0: the count must be a whole number from 1 to 8"),
        ("health=9", "health=9: the count must be a whole number from 1 to 8"),
        ("health", "'health' is not SERVICE=COUNT (e.g. health=2)"),
        ("health=", "'health=' is not SERVICE=COUNT (e.g. health=2)"),
        ("=2", "'=2' is not SERVICE=COUNT (e.g. health=2)"),
        ("health=2,", "'' is not SERVICE=COUNT (e.g. health=2)"),
        ("health=2,health=3", "health is given twice"),
    ],
)
def test_a_bad_replica_count_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_replicas(text)
    assert str(caught.value) == message


def test_one_replica_keeps_the_service_name_and_more_are_numbered_all_distinct() -> None:
    assert instance_names("health", 1) == ["health"]
    assert instance_names("health", 3) == ["health-0", "health-1", "health-2"]
    every = [n for s in SERVICES for count in (1, MAX_REPLICAS) for n in instance_names(s, count)]
    assert len(every) == len(set(every))
    assert {service_of(n) for n in every} == set(SERVICES)


@pytest.mark.parametrize(
    ("name", "service"),
    [
        ("health", "health"),
        ("health-7", "health"),
        ("watcher-0", "watcher"),
        ("kube-apiserver", None),
        ("nats-server", None),
        ("health-probes", None),
        ("etcd", None),
    ],
)
def test_a_process_is_a_replica_of_its_service_only(name: str, service: str | None) -> None:
    assert service_of(name) == service


@pytest.mark.parametrize(
    ("have", "requested", "start", "stop"),
    [
        ([], None, ["health"], []),  # the default: one, as before replicas
        ([], 2, ["health-0", "health-1"], []),
        (["health-0", "health-1"], None, [], []),  # `up` again without the flag changes nothing
        (["health-0", "health-1"], 2, [], []),
        (["health-0", "health-1"], 3, ["health-2"], []),
        (["health-0", "health-1", "health-2"], 2, [], ["health-2"]),
        (["health"], 2, ["health-0", "health-1"], ["health"]),
        (["health-0", "health-1"], 1, ["health"], ["health-0", "health-1"]),
    ],
)
def test_a_running_testbed_changes_only_the_replicas_that_differ(
    have: list[str], requested: int | None, start: list[str], stop: list[str]
) -> None:
    assert replica_plan("health", have, requested) == (start, stop)


# ------------------------------------------------------------------------------ command line


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--replicas", "helth=2"], "error: --replicas: unknown service 'helth'; choose from"),
        (
            ["--replicas", "health=x"],
            "error: --replicas: health=x: the count must be a whole number from 1 to 8",
        ),
        (
            ["--replicas", "health=9"],
            "error: --replicas: health=9: the count must be a whole number from 1 to 8",
        ),
        (["--replicas", "health=2", "--no-services"], "error: --replicas: cannot go with --no-services"),
    ],
)
def test_a_bad_replicas_flag_is_one_usage_error_line_and_starts_nothing(
    tmp_path: Path, args: list[str], line: str
) -> None:
    state_dir = tmp_path / "tb"
    result = invoke("local", "up", "--state-dir", str(state_dir), *args)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith(line), result.output
    assert not state_dir.exists()


def recorded(tmp_path: Path, pids: dict[str, int], ports: dict[str, int]) -> Path:
    state = State(tmp_path, tmp_path / "kubeconfig", "nats://127.0.0.1:1", "https://127.0.0.1:2", pids, ports)
    state.save()
    return tmp_path


def test_local_status_lists_every_replica_with_its_pid_and_probe_port(tmp_path: Path) -> None:
    me = os.getpid()
    pids = {"etcd": me, "watcher": me, "health-0": me, "health-1": GONE}
    state_dir = recorded(tmp_path, pids, {"etcd": 1, "watcher-probes": 4001, "health-0-probes": 4002})
    result = invoke("local", "status", "--state-dir", str(state_dir), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    # The keys of before, unchanged: every process by name.
    assert out["version"] == "respawn.cli/v1"
    assert out["running"] is False
    assert out["processes"] == {"etcd": True, "watcher": True, "health-0": True, "health-1": False}
    # And every replica of every service that has one, in order.
    assert out["replicas"] == {
        "watcher": [{"instance": "watcher", "pid": me, "probePort": 4001, "running": True}],
        "health": [
            {"instance": "health-0", "pid": me, "probePort": 4002, "running": True},
            {"instance": "health-1", "pid": GONE, "probePort": None, "running": False},
        ],
    }

    table = invoke("local", "status", "--state-dir", str(state_dir))
    assert table.exit_code == 0, table.output
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in table.output.splitlines()]
    rows = {row[0]: row[1:] for row in cells if len(row) == 4}
    assert rows["health-0"] == [str(me), "4002", "running"]
    assert rows["health-1"] == [str(GONE), "", "stopped"]
    assert rows["etcd"] == [str(me), "", "running"]


def test_local_status_without_a_testbed_has_no_replicas(tmp_path: Path) -> None:
    result = invoke("local", "status", "--state-dir", str(tmp_path), "--json")
    assert result.exit_code == 3  # not found: no testbed in --state-dir
    assert json.loads(result.output) == {
        "version": "respawn.cli/v1",
        "running": False,
        "processes": {},
        "replicas": {},
    }
