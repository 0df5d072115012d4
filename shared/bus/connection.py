"""Opening the NATS connection: the first connect with a deadline, then reconnecting forever.

Reconnects back off exponentially (:mod:`shared.bus.backoff`) per server, and connection
events are logged once per change rather than once per attempt. TLS (a CA to verify the
server, optionally a client certificate for mutual TLS) and credentials (user and password,
a token, a JWT ``.creds`` file or an nkey seed) are passed to nats-py; no server address is
ever logged or put in an error with the user and password it may carry (:func:`redact_url`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.aio.client
import nats.errors

from shared.bus.backoff import backoff, delay
from shared.bus.errors import BusError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- credentials in URLs

# "scheme://" then the userinfo ("user:password@" or "token@") up to the last "@" before the
# host. Used on free text (an exception's message may quote a URL); a single URL goes through
# redact_url, which also copes with whitespace in a password.
_USERINFO_IN_TEXT = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#]*@")


def redact_url(url: str) -> str:
    """``url`` without its userinfo: ``nats://user:secret@host:4222`` → ``nats://host:4222``.

    Anything else about the URL is kept, so the log still says which server it was.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        # No scheme: nats-py still reads "user:pass@host:4222" as a URL.
        scheme, rest = "", url
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    at = netloc.rfind("@")
    if at < 0:
        return url
    return f"{scheme}{sep}{netloc[at + 1 :]}{tail}"


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it removed (see :func:`redact_url`)."""
    return _USERINFO_IN_TEXT.sub(r"\g<scheme>", text)


def servers_text(servers: Sequence[str]) -> str:
    """The server list for a log line or an error: comma-separated, without credentials."""
    return ", ".join(redact_url(s) for s in servers)


# ---------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class TlsFiles:
    """TLS to the NATS server: verify it against ``ca_file`` (else the system's CAs), and present
    ``cert_file``/``key_file`` when the server asks for a client certificate (mutual TLS).

    ``server_name`` overrides the host name the certificate must match (default: the URL's
    host). ``handshake_first`` starts TLS before the server's greeting, so nothing, not even the
    greeting, ever travels in the clear; the server needs ``tls { handshake_first: true }``.
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    handshake_first: bool = False

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a TLS client certificate needs both cert_file and key_file")


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """A client context that verifies the server; :class:`BusError` names an unreadable file."""
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file) if tls.ca_file else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise BusError(
            f"cannot use the NATS TLS CA file {tls.ca_file}: {exc}; check nats.tls.caFile"
        ) from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise BusError(
                f"cannot use the NATS TLS client certificate {tls.cert_file} / key {tls.key_file}: {exc}; "
                "check nats.tls.certFile and nats.tls.keyFile"
            ) from exc
    return context


def _check_readable(path: str | Path, what: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise BusError(f"cannot read the NATS {what} {path}: {exc.strerror}") from None


def _hint(error: str) -> str:
    """What to check for the last connection error, if it says enough to tell."""
    lowered = error.lower()
    if "certificate verify failed" in lowered or "certificateverify" in lowered:
        return "; the server's certificate could not be verified: check nats.tls.caFile (and serverName)"
    if "ssl" in lowered or "tls" in lowered:
        return "; check the NATS TLS settings (nats.tls) against the server's"
    if "authorization" in lowered:
        return "; check the NATS credentials"
    return "; check NATS_URL and that the server is up"


# ---------------------------------------------------------------------- connection state

_PERMISSION_VIOLATION = re.compile(r"permissions violation for publish to \"?([^\"\s]+)\"?", re.IGNORECASE)
# Publish permission violations remembered per subject; a misconfiguration denies a handful of
# subjects, and a bound keeps a hostile stream of them from growing memory.
_DENIALS_KEPT = 1024


@dataclass
class ConnectionState:
    """What the connection callbacks learnt: reconnect count (consumers re-bind on change), last error,
    and the subjects the server refused a publish on (it says so only in an asynchronous error)."""

    service: str
    reconnects: int = 0
    last_error: str = ""
    # The last error that says what is wrong (credentials, TLS), which a plain connection reset
    # that the server sends after it may hide from last_error.
    telling_error: str = ""
    closing: bool = False
    _disconnected_at: float | None = None
    _denied: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # Called after every reconnect (the bus wakes its idle consumers so that they bind again).
    on_reconnect: list[Callable[[], None]] = field(default_factory=list)

    async def on_error(self, exc: Exception) -> None:
        text = redact(f"{type(exc).__name__}: {exc}".strip())
        if isinstance(exc, ssl.SSLError | nats.errors.AuthorizationError) or "authorization" in text.lower():
            self.telling_error = text
        denied = _PERMISSION_VIOLATION.search(str(exc))
        if denied:
            self._denied[denied.group(1)] = time.monotonic()
            self._denied.move_to_end(denied.group(1))
            while len(self._denied) > _DENIALS_KEPT:
                self._denied.popitem(last=False)
        if text != self.last_error:  # once per distinct error, not once per reconnect attempt
            log.warning("NATS client error: %s", text)
        self.last_error = text

    def publish_denied(self, subject: str, *, since: float) -> bool:
        """Whether the server refused a publish on ``subject`` at or after ``since`` (monotonic)."""
        at = self._denied.get(subject)
        return at is not None and at >= since

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
        for listener in list(self.on_reconnect):
            try:
                listener()
            except Exception:  # one listener's bug must not keep the others from hearing it
                log.exception("a reconnect listener failed")

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


def connect_options(
    servers: Sequence[str],
    *,
    name: str,
    state: ConnectionState,
    user: str | None,
    password: str | None,
    token: str | None,
    creds: str | Path | None,
    nkey_seed_file: str | Path | None,
    tls: TlsFiles | None,
    inbox_prefix: str | None,
    reconnect_wait_max: float,
) -> dict[str, Any]:
    """The keyword arguments of ``nats.connect``; :class:`BusError` for unusable files."""
    if creds is not None and nkey_seed_file is not None:
        raise BusError("use either a NATS credentials file or an nkey seed file, not both")
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
    for path, what, key in (
        (creds, "credentials file", "user_credentials"),
        (nkey_seed_file, "nkey seed file", "nkeys_seed"),
    ):
        if path is None:
            continue
        _check_readable(path, what)
        # nats-py signs the server's challenge with the nkeys package, which it imports only
        # when connecting; without it every connection attempt would fail the same way.
        if importlib.util.find_spec("nkeys") is None:
            raise BusError(f"a NATS {what} needs the nkeys package: pip install 'nats-py[nkeys]'")
        options[key] = str(path)
    if tls is not None:
        options["tls"] = tls_context(tls)
        if tls.server_name:
            options["tls_hostname"] = tls.server_name
        if tls.handshake_first:
            options["tls_handshake_first"] = True
    if inbox_prefix:
        # Per-user inbox: with NATS subject permissions a user may be limited to its own replies.
        options["inbox_prefix"] = inbox_prefix
    return options


class Client(nats.aio.client.Client):
    """nats-py's client, with its answer to a server PONG made safe.

    Each flush sends a PING and waits on a future queued for its PONG; PONGs come back in order.
    A flush that was cancelled (its caller was, or its own timeout ran out) leaves its future
    queued, cancelled, and nats-py's reader then calls ``set_result`` on it when that PONG
    arrives: the InvalidStateError ends the reading task for good, and from then on no
    message, acknowledgement or reply reaches the process (every request times out) while
    the connection looks alive. Lifecycle hit it on the way out, when stopping its consumers
    cancelled a subscription's drain. Here a PONG still answers its own PING, but a future
    nobody waits for any more is left alone.
    """

    async def _process_pong(self) -> None:
        if self._pongs:
            future = self._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0


async def open_connection(
    options: Mapping[str, Any],
    *,
    state: ConnectionState,
    tls: TlsFiles | None,
    connect_deadline: float | None,
) -> Any:
    """The nats-py client connected with ``options`` (from :func:`connect_options`, given the
    same ``state`` and ``tls``); :class:`BusError` names the server (never its credentials) and
    the last error."""
    servers: Sequence[str] = options["servers"]
    name = options["name"]
    where = servers_text(servers)
    try:
        async with asyncio.timeout(connect_deadline):
            nc = Client()
            await nc.connect(**options)
    except TimeoutError:
        last = state.telling_error or state.last_error or "none"
        raise BusError(
            f"could not connect to NATS at {where} within {connect_deadline:.0f}s "
            f"(last error: {last}){_hint(last)}"
        ) from None
    except nats.errors.Error as exc:
        raise BusError(
            f"could not connect to NATS at {where}: {redact(str(exc))}; check the URL and credentials"
        ) from None
    if tls is not None and not tls.handshake_first and not nc._server_info.get("tls_required"):
        # nats-py only upgrades to TLS when the server asks for it; a server (or anything in
        # between) that does not would get every message in the clear.
        await nc.close()
        raise BusError(
            f"the NATS server at {where} does not require TLS although nats.tls is configured; "
            "enable TLS on the server (or set nats.tls.handshakeFirst)"
        )
    url = nc.connected_url
    log.info("connected to NATS at %s as %s", redact_url(url.geturl()) if url else where, name)
    return nc
