"""The local testbed a run measures on: a running one reused, or one started with enough kwok
nodes and torn down afterwards (its logs kept when the run found violations)."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench import upstream
from bench.config import BenchError
from bench.controller import start_controller
from bench.progress import Log
from respawn.testbed import cluster
from respawn.testbed.cluster import State, node_readiness
from respawn.testbed.process import stop_pid
from respawn.testbed.services import service_of

# The testbed's own processes, measured beside the controller's (their idle CPU is in the JSON).
TESTBED_PROCESSES = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")
# Operators of the wrapped kinds: part of the testbed, not of the control plane (a mass start's
# control-plane figures leave them out), but measured beside it, and waited for before an idle
# window (see bench.run.testbed_quiet).
OPERATOR_PROCESSES = ("training-operator",)


@dataclass
class Testbed:
    state: State
    own: bool  # started for this run (and torn down after it)
    processes: dict[str, int]  # the controller's
    # Set by the caller once the run is known to be correct: only then are the logs deleted.
    ok: bool = False

    @property
    def testbed_processes(self) -> dict[str, int]:
        return {k: v for k, v in self.state.pids.items() if k in (*TESTBED_PROCESSES, *OPERATOR_PROCESSES)}

    @property
    def logs(self) -> Path:
        return self.state.state_dir / "logs"


def running_state(state_dir: Path) -> State | None:
    """The testbed in ``state_dir`` if its core processes all run."""
    state = State.load(state_dir)
    if state is None:
        return None
    core = {k: v for k, v in state.running().items() if k in (*TESTBED_PROCESSES, "nats-server")}
    return state if core and all(core.values()) else None


def ready_nodes(kubeconfig: Path) -> int:
    return node_readiness(kubeconfig)[0]


def _interrupted(signum: int, _frame: object) -> None:
    # Out of whatever the run is doing, into the clean-up: a stopped benchmark must not leave its
    # testbed and controller processes running.
    raise KeyboardInterrupt(f"stopped by signal {signum}")


@contextlib.contextmanager
def testbed(
    controller: str,
    nodes: int,
    state_dir: Path | None,
    log: Log,
    replicas: Mapping[str, int] | None = None,
) -> Iterator[Testbed]:
    """Reuse the running testbed in ``state_dir``, or start one of ``nodes`` nodes; start the
    controller on it (Respawn: ``replicas[service]`` processes of each service, one when not
    named; on a reused testbed the processes that run are used as they are; ``none``: no
    controller). On the way out, stop what was started here."""
    directory = (state_dir or Path(tempfile.mkdtemp(prefix="respawn-bench-"))).resolve()
    state = running_state(directory)
    own = state is None
    started: list[str] = []
    bed: Testbed | None = None
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if state is None:
            if controller == "upstream":
                upstream.build(log=log)  # fail before starting anything if it cannot be built
            log(f"starting a testbed with {nodes} kwok nodes in {directory}")
            state = cluster.up(directory, nodes=nodes, log=log)
        else:
            have = ready_nodes(state.kubeconfig)
            if have < nodes:
                raise BenchError(
                    f"the testbed in {directory} has {have} Ready nodes; this run needs {nodes} "
                    f"(start one with 'respawn local up --nodes {nodes} --no-services', or omit --state-dir)"
                )
        processes, started = start_controller(controller, state, log, replicas)
        bed = Testbed(state, own, processes)
        yield bed
    finally:
        ok = bed is not None and bed.ok
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if state is not None:
            for name in started:
                stop_pid(state.pids.get(name, 0))
        if own:
            # Keep every process's log when something went wrong: the evidence for the timelines.
            cluster.down(directory, keep_logs=not ok)
            if not ok:
                log(f"logs kept in {directory / 'logs'}")
        elif state is not None and started:
            for name in started:
                state.pids.pop(name, None)
                state.ports.pop(f"{name}-probes", None)
            state.save()


def load(state_dir: Path, nodes: int) -> State:
    """The testbed recorded in ``state_dir`` (the single-service benchmarks run on one started
    beforehand); exits naming the command that starts one of ``nodes`` nodes."""
    state = State.load(state_dir)
    if state is None:
        raise SystemExit(
            f"no testbed in {state_dir}; run: respawn local up --state-dir {state_dir} --nodes {nodes}"
        )
    return state


def services(state: State) -> dict[str, int]:
    """The processes of Respawn's services among the testbed's, every replica under its own name
    (``health``, or ``health-0``, ``health-1``, ...)."""
    return {name: pid for name, pid in state.pids.items() if service_of(name) is not None}
