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
from respawn.testbed.services import (
    SERVICES,
    install_crd,
    instance_names,
    replicas_of,
    service_of,
    start_service,
)


def running_services(state: State) -> dict[str, list[str]]:
    """The processes of each Respawn service that run on the testbed (``health``, or its replicas
    ``health-0``, ``health-1``, ...), by service; a service that runs none is left out."""
    out: dict[str, list[str]] = {}
    for service in SERVICES:
        names = sorted(n for n in replicas_of(state, service) if pid_alive(state.pids[n]))
        if names:
            out[service] = names
    return out


def to_start(running: Mapping[str, list[str]], replicas: Mapping[str, int]) -> list[str]:
    """The names of the service processes to start so that each service runs ``replicas[service]``
    processes (one when not named): none of a service that runs already with the count asked for,
    or runs at all when no count was asked for (a reused testbed is measured as it runs).

    Raises ``BenchError`` when a service runs with another count than the one asked for: changing
    a reused testbed's services behind its owner's back is `respawn local up --replicas`' job.
    """
    names: list[str] = []
    for service in SERVICES:
        have, wanted = running.get(service, []), replicas.get(service)
        if have:
            if wanted is not None and len(have) != wanted:
                raise BenchError(
                    f"the testbed runs {len(have)} {service} process(es) ({', '.join(have)}), not the "
                    f"{wanted} --replicas asks for; change it with 'respawn local up --state-dir DIR "
                    f"--replicas {service}={wanted}', or leave {service} out of --replicas"
                )
            continue
        names.extend(instance_names(service, wanted or 1))
    return names


def start_controller(
    controller: str, state: State, log: Log, replicas: Mapping[str, int] | None = None
) -> tuple[dict[str, int], list[str]]:
    """Start what is not running yet; returns the controller's processes and the names started.

    For Respawn, ``replicas`` is the number of processes of each service (one when not named);
    every process of every service is returned, replicas under their own names (``health-0``).
    ``none`` is the testbed alone, no controller at all (the control plane measured by itself):
    nothing is started, and a testbed that runs Respawn's services is refused.
    """
    running = running_services(state)
    if controller == "respawn":
        started = to_start(running, replicas or {})
        if started:
            install_crd(state.kubeconfig)
        for name in started:
            log(f"starting Respawn service process {name}")
            service = service_of(name)
            assert service is not None  # names come from instance_names
            start_service(state, service, instance=name.partition("-")[2])
        names = [*(n for ns in running.values() for n in ns), *started]
        return {n: state.pids[n] for n in sorted(names)}, started
    if running:
        listed = ", ".join(n for ns in running.values() for n in ns)
        if controller == "none":
            raise BenchError(
                f"the testbed in {state.state_dir} runs Respawn's services ({listed}), whose work "
                "would be counted as the control plane's; start it with 'respawn local up --no-services'"
            )
        raise BenchError(
            f"the testbed in {state.state_dir} runs Respawn's services ({listed}), which "
            "would act on the same AppWrappers; start it with 'respawn local up --no-services' "
            "for --controller upstream"
        )
    if controller == "none":
        return {}, []
    if replicas:
        raise BenchError("--replicas counts Respawn's services; the upstream controller is one process")
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
