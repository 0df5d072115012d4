"""Fixtures for tests that run Respawn's services as real processes on the testbed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess, spawn_service, stop_all
from shared.appwrapper.constants import CRD_NAME
from tests.integration.faultproxy import FaultPolicy, FaultProxy, for_testbed
from tests.waiting import until_sync

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "crd"

ServiceFactory = Callable[..., ServiceProcess]


@pytest.fixture(scope="session")
def appwrapper_crd(testbed: Endpoints) -> Path:
    """The AppWrapper CRD, installed once per session and served before tests use it."""
    kubectl(testbed.kubeconfig, "apply", "--server-side", "--force-conflicts", "-k", str(CRD_DIR))
    kubectl(testbed.kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
    until_sync(
        "the AppWrapper CRD to be served",
        lambda: kubectl(testbed.kubeconfig, "get", "appwrappers", "-A", check=False),
        done=lambda proc: proc.returncode == 0,
        within=60,
    )
    return testbed.kubeconfig


@contextlib.contextmanager
def services_on(kubeconfig: Path, nats_url: str, log_dir: Path) -> Iterator[ServiceFactory]:
    """``start(name, *, instance="", env=None)`` for Respawn services as separate processes
    against ``kubeconfig`` and ``nats_url``; every one started is stopped at the end."""
    started: list[ServiceProcess] = []

    def start(name: str, *, instance: str = "", env: dict[str, str] | None = None) -> ServiceProcess:
        # The session's testbed and NATS outlive a test, and so do its verdicts: an autopilot
        # would count the infrastructure faults of earlier tests and quarantine a node under a
        # later one. Only the tests of node quarantine turn it on.
        env = {"RESPAWN_NODE_QUARANTINE_ENABLED": "false", **(env or {})}
        sp = spawn_service(
            name, kubeconfig=kubeconfig, nats_url=nats_url, log_dir=log_dir, instance=instance, env=env
        )
        started.append(sp)
        return sp

    try:
        yield start
    finally:
        stop_all(started)


@pytest.fixture
def service(testbed: Endpoints, tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start Respawn services as separate processes; all are stopped after the test."""
    with services_on(testbed.kubeconfig, testbed.nats_url, tmp_path / "logs") as start:
        yield start


@pytest.fixture
def scripted(testbed: Endpoints) -> Iterator[FaultProxy]:
    """A fault proxy in front of the testbed's API server that fails only what a test queues
    (``scripted.policy.queue``) or refuses (``scripted.policy.refuse``)."""
    running = for_testbed(testbed, FaultPolicy(rate=0.0, cut_rate=0.0))
    yield running
    running.stop()
