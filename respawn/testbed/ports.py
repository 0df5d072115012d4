"""Loopback port helpers for the testbed."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import time
from pathlib import Path

from respawn.testbed.process import pid_alive

# Where Linux says its ephemeral ports are, and what it uses when it cannot be read.
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)
# The lowest port handed out: below it sit many well-known services' defaults.
_LOWEST = 10_000
# Ports handed out by this process, newest last: not handed out again while remembered, as the
# process they were for may not have bound them yet.
_handed_out: list[int] = []
_REMEMBERED = 512
_ATTEMPTS = 200
# Ports handed out by any process on the machine, one file per port holding the pid that took it.
# Testbeds started side by side (one per test worker) pick all their ports first and bind them
# one by one over many seconds; without a shared record, two could pick the same free port and
# the later one fails with "address already in use". A reservation holds while its process
# lives, and at most RESERVATION_TTL, by which time the port is bound or was never needed.
RESERVATIONS = Path(tempfile.gettempdir()) / "respawn-ports"
RESERVATION_TTL = 600.0


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), from ``text`` (the contents of
    ``ip_local_port_range``) or that file; the Linux default when neither can be read."""
    if text is None:
        try:
            text = _EPHEMERAL_RANGE.read_text(encoding="ascii")
        except OSError:
            return _DEFAULT_EPHEMERAL
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return _DEFAULT_EPHEMERAL
    first, last = int(parts[0]), int(parts[1])
    return (first, last) if 0 < first <= last <= 65535 else _DEFAULT_EPHEMERAL


def candidate_range(ephemeral: tuple[int, int]) -> tuple[int, int] | None:
    """The ports :func:`free_port` picks from: those between :data:`_LOWEST` and the ephemeral
    range, or above it, whichever is larger; None when neither has a thousand ports."""
    first, last = ephemeral
    below = (_LOWEST, first - 1)
    above = (last + 1, 65535)
    best = max(below, above, key=lambda r: r[1] - r[0])
    return best if best[1] - best[0] >= 1000 else None


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, outside the kernel's ephemeral range.

    The caller binds it later, often in another process. A port the OS picks (bind to 0) comes
    from the ephemeral range, from which every outgoing connection also takes its local port:
    one made meanwhile (by the control plane's own clients, say) can take it, and the process
    it was for then fails with "address already in use". Outside that range only another
    listener can take it. Falls back to the OS's pick when the range leaves no room outside.
    """
    span = candidate_range(ephemeral_range())
    if span is not None:
        for _ in range(_ATTEMPTS):
            port = random.randint(*span)
            if port in _handed_out or port_in_use(port) or not reserve(port):
                continue
            _remember(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _remember(port)
    return port


def reserve(port: int, *, directory: Path | None = None, now: float | None = None) -> bool:
    """Record ``port`` as this process's; False when a live process (not this one) holds it.

    Creating the file is atomic (``O_EXCL``), so of two processes picking the same port at once
    only one gets it. A reservation whose process is gone, or older than
    :data:`RESERVATION_TTL`, is replaced. Where no reservation can be written (a read-only
    temporary directory), the port is taken unrecorded, as before reservations existed.
    """
    base = RESERVATIONS if directory is None else directory
    at = time.time() if now is None else now
    path = base / str(port)
    try:
        base.mkdir(mode=0o1777, parents=True, exist_ok=True)
    except OSError:
        return True
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if _held(path, at):
                return False
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        except OSError:
            return True
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _held(path: Path, now: float) -> bool:
    """Whether the reservation at ``path`` still holds: young enough, and its process alive
    (this process's own counts as not held: it is free to hand the port out again)."""
    try:
        age = now - path.stat().st_mtime
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return False  # removed meanwhile
    if age > RESERVATION_TTL:
        return False
    if not text:
        return True  # being written this instant
    return text.isdigit() and int(text) != os.getpid() and pid_alive(int(text))


def _remember(port: int) -> None:
    _handed_out.append(port)
    del _handed_out[:-_REMEMBERED]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True if something accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0
