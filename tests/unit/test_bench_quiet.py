"""Before its idle window the benchmark waits for the testbed's controllers that keep reacting to a
set-up (the controller manager and the training operator) to go quiet, and only for those: real
processes, one burning CPU for a while, measured from /proc."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench import procstat
from bench import run as bench_run
from bench.run import QUIET_BEFORE_IDLE, Bench

# Busy until it has used ``BUSY_S`` seconds of CPU, then asleep until killed. CPU, not wall time:
# on a loaded machine (four test workers on two cores) a process busy for a stretch of wall time
# may get too little of a core in it to count as busy, and the wait would rightly end early.
BUSY_S = 2.0
BUSY = f"import time\nwhile time.process_time() < {BUSY_S}: pass\ntime.sleep(600)\n"
# The window the busy operator is measured over: long enough that, loaded as above, it still gets
# well over the tenth of a core that counts as busy.
WINDOW_S = 2.0
IDLE = "import time\ntime.sleep(600)\n"


@pytest.fixture
def procs() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for proc in started.values():
        proc.kill()
        proc.wait()


def _bench(pids: dict[str, int]) -> Bench:
    logged: list[str] = []
    return cast(Bench, SimpleNamespace(testbed_processes=pids, log=logged.append, logged=logged))


def _start(procs: dict[str, subprocess.Popen[bytes]], name: str, code: str) -> int:
    procs[name] = subprocess.Popen([sys.executable, "-c", code])
    return procs[name].pid


def test_the_training_operator_is_waited_for_like_the_controller_manager() -> None:
    assert "kube-controller-manager" in QUIET_BEFORE_IDLE
    assert "training-operator" in QUIET_BEFORE_IDLE


def test_the_idle_window_waits_until_a_busy_training_operator_is_quiet(
    procs: dict[str, subprocess.Popen[bytes]],
) -> None:
    pids = {
        "kube-controller-manager": _start(procs, "kcm", IDLE),
        "training-operator": _start(procs, "operator", BUSY),
    }
    bench = _bench(pids)
    waited = asyncio.run(bench_run.testbed_quiet(bench, window=WINDOW_S))
    assert waited is not None
    # It went on only once the operator had stopped burning CPU: it had used its whole budget.
    assert procstat.cpu_seconds(pids)["training-operator"] >= BUSY_S * 0.9
    assert any("training-operator" in line for line in cast(Any, bench).logged)


def test_processes_that_do_not_react_to_a_set_up_are_not_waited_for(
    procs: dict[str, subprocess.Popen[bytes]],
) -> None:
    # The API server is busy whenever anything is (it serves the benchmark's own watches too):
    # waiting for it would measure nothing more.
    pids = {
        "kube-controller-manager": _start(procs, "kcm", IDLE),
        "kube-apiserver": _start(procs, "apiserver", BUSY),
    }
    t0 = time.monotonic()
    waited = asyncio.run(bench_run.testbed_quiet(_bench(pids), window=0.5))
    assert waited is not None and waited < BUSY_S
    assert time.monotonic() - t0 < BUSY_S


def test_without_either_controller_there_is_nothing_to_wait_for() -> None:
    assert asyncio.run(bench_run.testbed_quiet(_bench({"kube-apiserver": 1}), window=0.5)) == 0.0
