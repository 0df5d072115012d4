"""What the cluster reports about one failed pod: the facts a failure is classified on.

Only what Kubernetes itself records is here (container exits, waiting reasons, the pod's phase,
reason, message and conditions), plus two facts that need more than the pod to know: whether the
pod was deleted by someone other than Respawn, and the state of its node. Nothing here reads a
clock or does I/O; the caller builds the facts from what it observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

__all__ = [
    "SIGNALS",
    "ContainerExit",
    "FailureFacts",
    "NodeState",
    "PodCondition",
    "signal_name",
]

# Linux signal numbers (pods run on Linux; Python's signal module names the host's signals,
# which need not be the node's). A process killed by signal N exits 128 + N by convention.
SIGNALS: Final[dict[int, str]] = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    5: "SIGTRAP",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    10: "SIGUSR1",
    11: "SIGSEGV",
    12: "SIGUSR2",
    13: "SIGPIPE",
    14: "SIGALRM",
    15: "SIGTERM",
    16: "SIGSTKFLT",
    17: "SIGCHLD",
    18: "SIGCONT",
    19: "SIGSTOP",
    20: "SIGTSTP",
    21: "SIGTTIN",
    22: "SIGTTOU",
    23: "SIGURG",
    24: "SIGXCPU",
    25: "SIGXFSZ",
    26: "SIGVTALRM",
    27: "SIGPROF",
    28: "SIGWINCH",
    29: "SIGIO",
    30: "SIGPWR",
    31: "SIGSYS",
}

# Ready: the node is known and reports Ready. NotReady/Unknown: its Ready condition says so
# (Unknown: the node controller lost contact). Deleted: the Node object is gone. "" means the
# caller does not know (e.g. the pod was never scheduled).
NodeState = Literal["", "Ready", "NotReady", "Unknown", "Deleted"]


def signal_name(exit_code: int) -> str:
    """The signal a container exit code stands for (``137`` → ``SIGKILL``), or ''.

    Only 129..159 (128 + a standard signal) count: larger codes are an application's own choice.
    """
    return SIGNALS.get(exit_code - 128, "") if 128 < exit_code < 160 else ""


@dataclass(frozen=True, slots=True)
class ContainerExit:
    """One container's last state: terminated (with its exit code) or waiting (with a reason)."""

    name: str
    init: bool = False
    # None: the container is not terminated (it is waiting, or its state is unknown).
    exit_code: int | None = None
    # The terminated reason (OOMKilled, Error, Completed, ContainerCannotRun, ...) or, for a
    # waiting container, the waiting reason (ErrImagePull, ImagePullBackOff, InvalidImageName,
    # CreateContainerConfigError, ...).
    reason: str = ""
    # The termination message (at most 4 KiB, the kubelet's limit) or the waiting message.
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.exit_code is not None and self.exit_code != 0

    @property
    def signal(self) -> str:
        return signal_name(self.exit_code) if self.exit_code is not None else ""


@dataclass(frozen=True, slots=True)
class PodCondition:
    type: str
    status: str = "True"
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class FailureFacts:
    """Everything a failure of one pod is judged on."""

    pod: str
    node: str = ""
    phase: str = "Failed"
    # status.reason and status.message of the pod (Evicted, Preempting, Terminated, NodeLost,
    # OutOfcpu, UnexpectedAdmissionError, ...).
    reason: str = ""
    message: str = ""
    # Init containers first, then the others, each in the pod spec's order.
    containers: tuple[ContainerExit, ...] = ()
    conditions: tuple[PodCondition, ...] = ()
    # The pod was deleted (or is being deleted) by someone other than Respawn.
    deleted_externally: bool = False
    node_state: NodeState = ""
    # When the pod failed (its last container's finish time, else when it was seen Failed).
    failed_at: datetime | None = None

    def exit_codes(self, *, init: bool = True) -> tuple[int, ...]:
        """Non-zero exit codes of terminated containers, in container order."""
        return tuple(
            c.exit_code
            for c in self.containers
            if c.exit_code is not None and c.exit_code != 0 and (init or not c.init)
        )

    @property
    def signals(self) -> tuple[str, ...]:
        """Signals that killed containers (from exit codes 129..159), in container order."""
        return tuple(s for s in (c.signal for c in self.containers if c.failed) if s)

    @property
    def first_failed(self) -> ContainerExit | None:
        """The container that stands for the failure: the first non-init container that failed,
        else the first init container that failed (an init failure stops the pod before the
        others start)."""
        failed = [c for c in self.containers if c.failed]
        return next((c for c in failed if not c.init), failed[0] if failed else None)

    def true_conditions(self) -> tuple[PodCondition, ...]:
        return tuple(c for c in self.conditions if c.status == "True")
