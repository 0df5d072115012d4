"""A kube-apiserver of a test's own on the testbed's etcd, so a test can kill and restart the
API server its services talk to without taking the testbed's control plane (scheduler,
controller manager, kwok) down with it (test support).

It is started with the testbed API server's own command line (read from /proc), on another
port: the same certificates, etcd and admission, so to a client it is that API server.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from respawn.testbed import pki
from respawn.testbed.cluster import State, _client_ctx, _http_ok
from respawn.testbed.errors import TestbedError
from respawn.testbed.ports import free_port
from respawn.testbed.process import Proc, start, stop_pid, wait_until

APISERVER = "kube-apiserver"


def _command_line(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


@dataclass
class ApiServerReplica:
    """Another instance of the testbed's API server; ``kubeconfig`` points a client at it."""

    state: State
    work_dir: Path
    port: int = field(default_factory=free_port)
    proc: Proc | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "kubeconfig"

    def _argv(self) -> list[str]:
        pid = self.state.pids.get(APISERVER)
        if not pid:
            raise TestbedError(f"the testbed in {self.state.state_dir} has no {APISERVER} to copy")
        argv = _command_line(pid)
        # Same flags, another port; no audit log of its own (the file belongs to the testbed's).
        argv = [a for a in argv if not a.startswith("--audit-")]
        return [f"--secure-port={self.port}" if a.startswith("--secure-port=") else a for a in argv]

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        admin = self.state.kubeconfig.read_text()
        self.kubeconfig.write_text(admin.replace(self.state.api_url, self.url))
        self.kubeconfig.chmod(0o600)
        self.proc = start(APISERVER, self._argv(), self.work_dir / "kube-apiserver.log")
        ctx = _client_ctx(pki.Pki(self.state.state_dir / "pki"), "admin")
        wait_until(self.proc, lambda: _http_ok(f"{self.url}/readyz", ctx), timeout=90, what="ready")

    def kill(self) -> None:
        """SIGKILL: connections drop at once, as when the API server's node dies."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        stop_pid(self.proc.pid, timeout=5)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc.pid)
            self.proc = None
