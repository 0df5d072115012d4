"""Shared fixtures: the real testbed (Kubernetes control plane + NATS) and per-test namespaces.

``make test`` runs the suite in several pytest-xdist workers (``-n N --dist loadfile``), each
with a testbed of its own (the session fixture below, under the worker's own temporary
directory), each running whole modules or the ``host`` group (``tests/groups.py``).

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
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

from respawn.testbed import kubeapi
from respawn.testbed.modes import Endpoints, open_testbed
from tests.groups import group_of, start_rank

# The NATS-only fixtures live in their own module; load them when present.
pytest_plugins = ["tests.nats_fixtures"] if importlib.util.find_spec("tests.nats_fixtures") else []


class ModuleScheduling(LoadFileScheduling):
    """``--dist loadfile``, with the host modules as one file (``tests/groups.py``)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    # A scheduler rather than xdist_group marks: xdist reads those by renaming the tests' ids,
    # which pytest >= 9.2 no longer lets it do.
    return ModuleScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest groups first (``tests/groups.py``): none of them must be the last to start."""
    items.sort(key=lambda item: start_rank(item.nodeid))  # stable: each group keeps its order


def _worker_dir(base: str) -> Path:
    """A state directory given in the environment, one per xdist worker (``gw0``, ``gw1``, …)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return Path(base) / worker if worker else Path(base)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    given = os.environ.get("RESPAWN_TEST_STATE_DIR")
    state_dir = _worker_dir(given) if given else tmp_path_factory.mktemp("testbed")
    with open_testbed(state_dir) as endpoints:
        yield endpoints


@pytest.fixture
def namespace(testbed: Endpoints) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    kubeapi.create_namespace(testbed.kubeconfig, name)
    yield name
    kubeapi.delete_namespace(testbed.kubeconfig, name)
