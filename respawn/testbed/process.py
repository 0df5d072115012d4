"""Starting and stopping the testbed's child processes.

Every process runs in its own session (process group) with its output in a log file,
so `down` can kill it and anything it spawned by pid, and a failed start can show
the last lines of the log in its one-line error.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from respawn.testbed.errors import TestbedError
from respawn.waiting import WaitTimeout, eventually, until_sync


@dataclass
class Proc:
    name: str
    pid: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip()[:300] for line in text[-lines:])


def start(name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            popen = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=dict(env) if env is not None else None,
            )
        except OSError as exc:
            raise TestbedError(
                f"cannot start {name} ({argv[0]}): {exc.strerror}; run 'make binaries'"
            ) from exc
    return Proc(name=name, pid=popen.pid, log=log, popen=popen)


def wait_until(
    proc: Proc, ready: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    """Poll ``ready`` until it is true; fail fast (with log lines) if the process dies."""

    def check() -> bool:
        if not proc.alive():
            raise TestbedError(
                f"{proc.name} exited during start-up; last log lines ({proc.log}): {tail(proc.log)}"
            )
        try:
            return bool(ready())
        except Exception:  # readiness probes raise while the server is still coming up
            return False

    try:
        until_sync(f"{proc.name} to be {what}", check, within=timeout, every=interval)
    except WaitTimeout:
        raise TestbedError(
            f"{proc.name} not {what} after {timeout:.0f}s; last log lines ({proc.log}): {tail(proc.log)}"
        ) from None


def stop_pid(pid: int, *, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``timeout``."""
    stop_pids([pid], timeout=timeout)


def stop_pids(pids: Iterable[int], *, timeout: float = 10.0) -> None:
    """:func:`stop_pid` for several processes at once: all are told to stop together, so that
    their graceful shutdowns overlap (one after another, each service's took seconds)."""
    targets = [pid for pid in pids if pid > 0]

    def all_gone() -> bool:
        return all(_gone(pid) for pid in targets)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        # Only what is still there: a pid already reaped may belong to another process by now.
        targets = [pid for pid in targets if not _gone(pid)]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if eventually(all_gone, within=timeout if sig == signal.SIGTERM else 5.0):
            return


def _gone(pid: int) -> bool:
    # Reap if it is our child, so it does not linger as a zombie.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    return not pid_alive(pid) and not _group_alive(pid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
