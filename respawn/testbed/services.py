"""Running Respawn's services as separate processes against a testbed."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed.cluster import Log, State, _http_ok, _quiet, kubectl, wait_for
from respawn.testbed.errors import TestbedError
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until

SERVICES = ("watcher", "health", "lifecycle", "autopilot")


def service_env(
    kubeconfig: Path, nats_url: str, extra: dict[str, str] | None = None, *, probe_port: int = 0
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "KUBECONFIG": str(kubeconfig),
            "NATS_URL": nats_url,
            "RESPAWN_PROBE_PORT": str(probe_port),
            "RESPAWN_PROBE_LOOPBACK": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass
class ServiceProcess:
    name: str
    proc: Proc
    probe_port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.alive()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def stop(self) -> None:
        stop_pid(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL, as a node failure or an OOM kill would (no graceful shutdown)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        stop_pid(self.proc.pid, timeout=2)


def spawn_service(
    service: str,
    *,
    kubeconfig: Path,
    nats_url: str,
    log_dir: Path,
    instance: str = "",
    env: dict[str, str] | None = None,
    ready_timeout: float = 60,
) -> ServiceProcess:
    """Start ``python -m services.<service>`` and wait until its /readyz answers 200."""
    name = f"{service}{'-' + instance if instance else ''}"
    port = free_port()
    proc = start(
        name,
        [sys.executable, "-m", f"services.{service}"],
        log_dir / f"{name}.log",
        env=service_env(kubeconfig, nats_url, env, probe_port=port),
    )
    # A service that cannot start (bad config, no NATS) exits at once; catch that here.
    try:
        wait_until(
            proc, lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=ready_timeout, what="ready"
        )
    except TestbedError:
        stop_pid(proc.pid)
        raise
    return ServiceProcess(name, proc, port)


def start_service(
    state: State, service: str, *, instance: str = "", env: dict[str, str] | None = None
) -> int:
    """Start one service process for a testbed; its pid is recorded in the state for `down`.

    On a testbed whose NATS requires TLS the service trusts the testbed's CA
    (``RESPAWN_NATS_TLS_CA_FILE``, as nats.tls.caFile in docs/configuration.md)."""
    sp = spawn_service(
        service,
        kubeconfig=state.kubeconfig,
        nats_url=state.nats_url,
        log_dir=state.state_dir / "logs",
        instance=instance,
        env={**state.nats_tls_env(), **(env or {})},
    )
    state.pids[sp.name] = sp.pid
    state.ports[f"{sp.name}-probes"] = sp.probe_port
    state.save()
    return sp.pid


CRD_DIR = Path(__file__).resolve().parents[2] / "deploy" / "crd"


def install_crd(kubeconfig: Path) -> None:
    """Install Respawn's AppWrapper CRD (and its admission policy) and wait until it is served."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-k", str(CRD_DIR))
    kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/appwrappers.workload.codeflare.dev",
    )
    wait_for(
        lambda: kubectl(kubeconfig, "get", "appwrappers", "-A", check=False).returncode == 0,
        timeout=60,
        what="the AppWrapper API to be served",
    )


def start_all(state: State, *, log: Log = _quiet, env: dict[str, str] | None = None) -> list[str]:
    started: list[str] = []
    log("installing the AppWrapper CRD")
    install_crd(state.kubeconfig)
    for service in SERVICES:
        if service not in state.pids:
            log(f"starting service {service}")
            start_service(state, service, env=env)
            started.append(service)
    return started
