"""Running Respawn's services as separate processes against a testbed."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from respawn.testbed.cluster import Log, State, _http_ok, _quiet, kubectl, wait_for
from respawn.testbed.errors import TestbedError
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, pid_alive, start, stop_pid, stop_pids, wait_until

SERVICES = ("watcher", "health", "lifecycle", "autopilot")
# The most replicas of one service `local up --replicas` starts: each is a Python process of
# 90-190 MiB (README, "Performance") on the machine that also runs the control plane, and eight of
# each of the four services is already 32 of them.
MAX_REPLICAS = 8
# Where a service's replicas learn which one they are (docs/deploy.md, "Replicas").
INSTANCE_ENV = "RESPAWN_INSTANCE"


def parse_replicas(text: str) -> dict[str, int]:
    """``health=2,lifecycle=2`` as ``{"health": 2, "lifecycle": 2}``.

    Raises ``ValueError`` with a message naming the item that is wrong and what is expected.
    """
    counts: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        service, sep, raw = item.partition("=")
        service, raw = service.strip(), raw.strip()
        if not sep or not service or not raw:
            raise ValueError(f"{item!r} is not SERVICE=COUNT (e.g. health=2)")
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}; choose from {', '.join(SERVICES)}")
        if service in counts:
            raise ValueError(f"{service} is given twice")
        if not re.fullmatch(r"[0-9]+", raw) or not 1 <= int(raw) <= MAX_REPLICAS:
            raise ValueError(f"{service}={raw}: the count must be a whole number from 1 to {MAX_REPLICAS}")
        counts[service] = int(raw)
    return counts


def instance_names(service: str, count: int) -> list[str]:
    """The names of ``count`` replicas of ``service``: of its processes, log files and
    ``RESPAWN_INSTANCE``. One replica is named after the service alone, as before there were
    replicas (scripts and benchmarks find it as ``health``); more are ``health-0``, ``health-1``…"""
    return [service] if count == 1 else [f"{service}-{i}" for i in range(count)]


def service_of(name: str) -> str | None:
    """The service a process named ``name`` (``health``, ``health-1``) runs; None: no service."""
    service, _, index = name.partition("-")
    return service if service in SERVICES and (not index or index.isdigit()) else None


def replicas_of(state: State, service: str) -> list[str]:
    """The names of the processes of ``service`` that the testbed in ``state`` records."""
    return [name for name in state.pids if service_of(name) == service]


def replica_table(state: State) -> dict[str, list[dict[str, Any]]]:
    """Every recorded replica of every service, as ``local status --json`` and ``local up --json``
    show them (docs/cli.md): instance name, pid, probe port, whether it runs."""
    return {
        service: [
            {
                "instance": name,
                "pid": state.pids[name],
                "probePort": state.ports.get(f"{name}-probes"),
                "running": pid_alive(state.pids[name]),
            }
            for name in names
        ]
        for service in SERVICES
        if (names := replicas_of(state, service))
    }


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


def stop_all(processes: Iterable[ServiceProcess]) -> None:
    """Stop several services together: their graceful shutdowns overlap."""
    stop_pids([sp.proc.pid for sp in processes])


def process_name(service: str, instance: str = "") -> str:
    return f"{service}{'-' + instance if instance else ''}"


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
    name = process_name(service, instance)
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

    Its process name (``health``, or ``health-<instance>``) is its ``RESPAWN_INSTANCE`` too: unique
    among the testbed's processes, so no two replicas share an identity. It is set last, so that
    nothing inherited or passed in can make them share one.

    On a testbed whose NATS requires TLS the service trusts the testbed's CA
    (``RESPAWN_NATS_TLS_CA_FILE``, as nats.tls.caFile in docs/configuration.md)."""
    sp = spawn_service(
        service,
        kubeconfig=state.kubeconfig,
        nats_url=state.nats_url,
        log_dir=state.state_dir / "logs",
        instance=instance,
        env={**state.nats_tls_env(), **(env or {}), INSTANCE_ENV: process_name(service, instance)},
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


def replica_plan(service: str, have: list[str], requested: int | None) -> tuple[list[str], list[str]]:
    """Which replicas of ``service`` to start and which to stop, given the names of those that
    run (``have``) and the count asked for (None: keep what runs, else run one)."""
    wanted = instance_names(service, requested or len(have) or 1)
    return [n for n in wanted if n not in have], [n for n in have if n not in wanted]


def start_all(
    state: State,
    *,
    replicas: Mapping[str, int] | None = None,
    log: Log = _quiet,
    env: dict[str, str] | None = None,
) -> list[str]:
    """Run ``replicas[service]`` processes of each service named there, and of every other one
    what already runs (one if none does); returns the names of the processes started.

    On a running testbed only what differs changes: missing replicas are started (each waited
    for until ready) before surplus ones are stopped, so the service never runs with none.
    """
    started: list[str] = []
    log("installing the AppWrapper CRD")
    install_crd(state.kubeconfig)
    for service in SERVICES:
        have = replicas_of(state, service)
        start, stop = replica_plan(service, have, (replicas or {}).get(service))
        for name in start:
            log(f"starting service {service}" + (f" ({name})" if name != service else ""))
            start_service(state, service, instance=name.partition("-")[2], env=env)
            started.append(name)
        for name in stop:
            log(f"stopping {name} (pid {state.pids[name]}): not among the {service} replicas asked for")
            stop_pid(state.pids.pop(name))
            state.ports.pop(f"{name}-probes", None)
            state.save()
    return started
