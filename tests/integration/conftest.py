"""Fixtures for tests that run Respawn's services as real processes on the testbed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints
from respawn.testbed.services import ServiceProcess, spawn_service
from shared.appwrapper.constants import CRD_NAME
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


@pytest.fixture
def service(testbed: Endpoints, tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start Respawn services as separate processes; all are stopped after the test."""
    started: list[ServiceProcess] = []

    def start(name: str, *, instance: str = "", env: dict[str, str] | None = None) -> ServiceProcess:
        sp = spawn_service(
            name,
            kubeconfig=testbed.kubeconfig,
            nats_url=testbed.nats_url,
            log_dir=tmp_path / "logs",
            instance=instance,
            env=env,
        )
        started.append(sp)
        return sp

    yield start
    for sp in started:
        sp.stop()
