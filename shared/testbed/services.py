"""Running Respawn's services as separate processes against a testbed."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from shared.testbed.cluster import Log, State, _http_ok, _quiet
from shared.testbed.errors import TestbedError
from shared.testbed.ports import free_port
from shared.testbed.process import start, stop_pid, wait_until

SERVICES = ("watcher", "health", "lifecycle", "autopilot")


def implemented(service: str) -> bool:
    """A service is started by `local up` once its package has a ``service`` module."""
    return importlib.util.find_spec(f"services.{service}.service") is not None


def service_env(state: State, extra: dict[str, str] | None = None, *, probe_port: int = 0) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "KUBECONFIG": str(state.kubeconfig),
            "NATS_URL": state.nats_url,
            "RESPAWN_PROBE_PORT": str(probe_port),
            "RESPAWN_PROBE_LOOPBACK": "1",
        }
    )
    if extra:
        env.update(extra)
    return env


def start_service(
    state: State, service: str, *, instance: str = "", env: dict[str, str] | None = None
) -> int:
    """Start one service process; returns its pid (recorded in the state for `down`)."""
    name = f"{service}{'-' + instance if instance else ''}"
    port = free_port()
    proc = start(
        name,
        [sys.executable, "-m", f"services.{service}"],
        state.state_dir / "logs" / f"{name}.log",
        env=service_env(state, env, probe_port=port),
    )
    state.pids[name] = proc.pid
    state.ports[f"{name}-probes"] = port
    state.save()
    # A service that cannot start (bad config, no NATS) exits at once; catch that here.
    try:
        wait_until(proc, lambda: _http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=60, what="ready")
    except TestbedError:
        stop_pid(proc.pid)
        raise
    return proc.pid


def stop_service(state: State, name: str) -> None:
    pid = state.pids.pop(name, 0)
    stop_pid(pid)
    state.save()


def start_all(state: State, *, log: Log = _quiet) -> list[str]:
    started = []
    for service in SERVICES:
        if implemented(service) and service not in state.pids:
            log(f"starting service {service}")
            start_service(state, service)
            started.append(service)
    return started


def run_in_foreground(service: str, config: Path | None) -> int:
    if config is not None:
        os.environ["RESPAWN_CONFIG"] = str(config)
    if not implemented(service):
        print(f"error: service {service!r} is not available in this build", file=sys.stderr)
        return 2
    module = importlib.import_module(f"services.{service}.__main__")
    main = module.main
    main()
    return 0
