"""The controller under test: started on the testbed if it is not running yet, and paused for
the baseline window."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Mapping

from bench import upstream
from bench.config import BenchError
from bench.progress import Log
from respawn.testbed.cluster import State
from respawn.testbed.process import pid_alive
from respawn.testbed.services import SERVICES, install_crd, start_service


def start_controller(controller: str, state: State, log: Log) -> tuple[dict[str, int], list[str]]:
    """Start what is not running yet; returns the controller's processes and the names started."""
    started: list[str] = []
    respawn_alive = {s: state.pids[s] for s in SERVICES if s in state.pids and pid_alive(state.pids[s])}
    if controller == "respawn":
        if len(respawn_alive) < len(SERVICES):
            install_crd(state.kubeconfig)
            for service in SERVICES:
                if service not in respawn_alive:
                    log(f"starting Respawn service {service}")
                    respawn_alive[service] = start_service(state, service)
                    started.append(service)
        return respawn_alive, started
    if respawn_alive:
        raise BenchError(
            f"the testbed in {state.state_dir} runs Respawn's services ({', '.join(respawn_alive)}), which "
            "would act on the same AppWrappers; start it with 'respawn local up --no-services' "
            "for --controller upstream"
        )
    install_crd(state.kubeconfig)
    ctl = upstream.start(state.kubeconfig, state.state_dir / "logs", log=log)
    state.pids[upstream.PROCESS_NAME] = ctl.pid  # so that `respawn local down` stops it too
    state.save()
    return {upstream.PROCESS_NAME: ctl.pid}, [upstream.PROCESS_NAME]


def _signal(processes: Mapping[str, int], sig: signal.Signals) -> None:
    for pid in processes.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def resume(processes: Mapping[str, int]) -> None:
    """SIGCONT: harmless on a process that runs, so a run always ends with this."""
    _signal(processes, signal.SIGCONT)


@contextlib.contextmanager
def paused(processes: Mapping[str, int]) -> Iterator[None]:
    """SIGSTOP the controller's processes (their connections stay open, they send nothing),
    SIGCONT after."""
    _signal(processes, signal.SIGSTOP)
    try:
        yield
    finally:
        resume(processes)
