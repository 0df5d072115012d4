"""The mass-start benchmark at small scale (N=20), run as a user runs it, on the session testbed:
the ceiling (no Respawn service) and Respawn's start are both measured, each creates every Job
and leaves nothing behind, and the services it started are stopped again.

Asserts what was measured, never how fast: the figures depend on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from respawn.testbed.cluster import State, kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import service_of

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
N = 20


def test_both_sides_create_every_job_at_a_measured_rate_and_leave_nothing(
    testbed: Endpoints, tmp_path: Path
) -> None:
    if testbed.state_dir is None:
        pytest.skip("bench.massstart measures the local testbed's own processes (RESPAWN_TESTBED=local)")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.massstart",
            "--state-dir",
            str(testbed.state_dir),
            "--appwrappers",
            str(N),
            "--timeout",
            "60",
            # The pods fit on one node: a node another test left NotReady must not stop the run.
            "--nodes",
            "1",
            "--out",
            str(tmp_path),
            "--json",
        ],
        cwd=REPO,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / f"massstart-n{N}.json").read_text())
    assert json.loads(proc.stdout) == result

    for name in ("ceiling", "respawn"):
        side = result[name]
        assert side["appwrappers"] == side["pods"] == N, name
        assert side["jobs_created"]["n"] == side["jobs_created_stamps"]["n"] == N, name
        assert side["jobs_created"]["per_s_overall"] > 0, name
        assert side["jobs_created"]["per_s_p50_10s"] > 0, name
        assert side["jobs_created_stamps"]["per_s"] > 0, name
        assert side["all_pods_running_s"] > 0, name
        assert side["left"] == [], (name, side["left"])
    assert result["ceiling"]["client"]["per_s"] > 0
    assert result["respawn"]["submission"]["per_s"] > 0
    assert result["respawn"]["lag_s"]["n"] == N
    assert result["ratio"]["per_s_overall"] > 0
    assert set(result["respawn"]["cost"]["services"]) == {"watcher", "health", "lifecycle", "autopilot"}
    assert result["ceiling"]["cost"]["services"] == {}

    # Nothing of either side is left on the cluster, and the services it started are stopped.
    for name in ("ceiling", "respawn"):
        namespace = result[name]["namespace"]
        left = kubectl(
            testbed.kubeconfig, "get", "jobs,pods,appwrappers", "-n", namespace, "-o", "name", check=False
        )
        assert left.stdout.strip() == "", (namespace, left.stdout)
    state = State.load(testbed.state_dir)
    assert state is not None
    assert [n for n in state.pids if service_of(n) is not None] == []
