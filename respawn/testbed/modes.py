"""Where a test session's Kubernetes API and NATS server come from (RESPAWN_TESTBED)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed.errors import TestbedError

MODES = ("local", "existing", "testcontainers")


@dataclass(frozen=True)
class Endpoints:
    kubeconfig: Path
    nats_url: str
    mode: str
    state_dir: Path | None = None


def mode() -> str:
    value = os.environ.get("RESPAWN_TESTBED", "local")
    if value not in MODES:
        raise TestbedError(f"RESPAWN_TESTBED={value!r} is not one of {', '.join(MODES)}")
    return value


@contextlib.contextmanager
def open_testbed(state_dir: Path, *, nodes: int = 4) -> Iterator[Endpoints]:
    m = mode()
    if m == "existing":
        kubeconfig = os.environ.get("KUBECONFIG")
        nats_url = os.environ.get("NATS_URL")
        if not kubeconfig or not nats_url:
            raise TestbedError("RESPAWN_TESTBED=existing needs KUBECONFIG and NATS_URL in the environment")
        yield Endpoints(Path(kubeconfig), nats_url, m)
        return
    if m == "testcontainers":
        yield from _testcontainers(state_dir)
        return
    from respawn.testbed import cluster

    state = cluster.up(state_dir, nodes=nodes)
    try:
        yield Endpoints(state.kubeconfig, state.nats_url, m, state.state_dir)
    finally:
        cluster.down(state_dir)


def _testcontainers(state_dir: Path) -> Iterator[Endpoints]:
    try:
        from testcontainers.k3s import K3SContainer  # type: ignore[import-not-found, unused-ignore]
        from testcontainers.nats import NatsContainer  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise TestbedError("RESPAWN_TESTBED=testcontainers needs 'pip install -e .[testcontainers]'") from exc
    state_dir.mkdir(parents=True, exist_ok=True)
    with K3SContainer() as k3s, NatsContainer(jetstream=True) as nats:
        kubeconfig = state_dir / "kubeconfig"
        kubeconfig.write_text(k3s.config_yaml())
        yield Endpoints(kubeconfig, nats.nats_uri(), "testcontainers", state_dir)
