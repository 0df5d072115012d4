"""Opening the NATS connection: the first connect with a deadline, then reconnecting forever.

Reconnects back off exponentially (:mod:`shared.bus.backoff`) per server, and connection
events are logged once per change rather than once per attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors

from shared.bus.backoff import backoff, delay
from shared.bus.errors import BusError

log = logging.getLogger(__name__)


@dataclass
class ConnectionState:
    """What the connection callbacks learnt: reconnect count (consumers re-bind on change), last error."""

    service: str
    reconnects: int = 0
    last_error: str = ""
    closing: bool = False
    _disconnected_at: float | None = None

    async def on_error(self, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}".strip()
        if text != self.last_error:  # once per distinct error, not once per reconnect attempt
            log.warning("NATS client error: %s", text)
        self.last_error = text

    async def on_disconnected(self) -> None:
        if self.closing:
            return
        if self._disconnected_at is None:
            self._disconnected_at = time.monotonic()
            log.warning("disconnected from NATS; reconnecting")

    async def on_reconnected(self) -> None:
        self.reconnects += 1
        down = time.monotonic() - self._disconnected_at if self._disconnected_at is not None else 0.0
        self._disconnected_at = None
        log.warning("reconnected to NATS after %.1fs", down)

    async def on_closed(self) -> None:
        log.info("NATS connection closed")


def reconnect_handler(cap: float) -> Callable[[list[Any], dict[str, Any]], tuple[Any, float]]:
    """nats-py's ``reconnect_to_server_handler``: the server tried least, after a delay of 50 ms
    doubling with that server's failed attempts, up to ``cap``."""
    wait = backoff(0.05, cap)

    def choose(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        return server, delay(wait, server.reconnects + 1)

    return choose


async def open_connection(
    servers: Sequence[str],
    *,
    name: str,
    state: ConnectionState,
    user: str | None,
    password: str | None,
    token: str | None,
    creds: str | Path | None,
    inbox_prefix: str | None,
    connect_deadline: float | None,
    reconnect_wait_max: float,
) -> Any:
    """The connected nats-py client; :class:`BusError` names the server and the last error."""
    options: dict[str, Any] = {
        "servers": list(servers),
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_to_server_handler": reconnect_handler(reconnect_wait_max),
        "connect_timeout": 2,
        # Only the first connection uses this fixed wait; reconnects use the backoff handler.
        "reconnect_time_wait": 0.5,
        "error_cb": state.on_error,
        "disconnected_cb": state.on_disconnected,
        "reconnected_cb": state.on_reconnected,
        "closed_cb": state.on_closed,
    }
    if user is not None:
        options["user"] = user
    if password is not None:
        options["password"] = password
    if token is not None:
        options["token"] = token
    if creds is not None:
        options["user_credentials"] = str(creds)
    if inbox_prefix:
        # Per-user inbox: with NATS subject permissions a user may be limited to its own replies.
        options["inbox_prefix"] = inbox_prefix
    where = ", ".join(servers)
    try:
        async with asyncio.timeout(connect_deadline):
            nc = await nats.connect(**options)
    except TimeoutError:
        raise BusError(
            f"could not connect to NATS at {where} within {connect_deadline:.0f}s "
            f"(last error: {state.last_error or 'none'}); check NATS_URL and that the server is up"
        ) from None
    except nats.errors.Error as exc:
        raise BusError(f"could not connect to NATS at {where}: {exc}; check the URL and credentials") from exc
    log.info("connected to NATS at %s as %s", nc.connected_url.netloc if nc.connected_url else where, name)
    return nc
