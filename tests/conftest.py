"""Shared fixtures: the real testbed (Kubernetes control plane + NATS) and per-test namespaces.

RESPAWN_TESTBED selects where the servers come from:
- ``local`` (default): started here by ``respawn.testbed.cluster.up`` (no Docker);
- ``existing``: KUBECONFIG and NATS_URL from the environment;
- ``testcontainers``: K3s and NATS containers (needs a Docker engine).
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from respawn.testbed.cluster import kubectl
from respawn.testbed.modes import Endpoints, open_testbed

# The NATS-only fixtures live in their own module; load them when present.
pytest_plugins = ["tests.nats_fixtures"] if importlib.util.find_spec("tests.nats_fixtures") else []


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    state_dir = Path(os.environ.get("RESPAWN_TEST_STATE_DIR") or tmp_path_factory.mktemp("testbed"))
    with open_testbed(state_dir) as endpoints:
        yield endpoints


@pytest.fixture
def namespace(testbed: Endpoints) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubectl(testbed.kubeconfig, "create", "namespace", name)
    yield name
    kubectl(testbed.kubeconfig, "delete", "namespace", name, "--wait=false", check=False)
