"""A fault-injecting proxy in front of the testbed's kube-apiserver (test support).

The services under test get a kubeconfig whose server is this proxy (plain HTTP on loopback,
no credentials); the proxy forwards every request to the real API server over HTTPS with the
testbed's admin client certificate and streams the answer back as it comes, so a watch (a long
chunked answer) works through it as it does directly. A seeded :class:`FaultPolicy` decides, per
request, whether the proxy answers itself instead, as an overloaded or failing API server does:

- ``429 TooManyRequests`` with a ``Retry-After`` header (API Priority and Fairness turning a
  request away);
- ``500 InternalError`` and ``503 ServiceUnavailable``, with the ``Status`` body the API server
  writes;
- a drop: the connection is closed without an answer, as when the API server restarts or a load
  balancer resets it;
- and, for a watch it forwards, a cut: the connection is dropped a moment into the stream,
  mid-answer.

Each client (``kubeconfig(client=...)``) reaches the proxy under a path of its own, so the proxy
counts what it forwarded and what it injected per client, resource and verb (:class:`Tally`).

The proxy runs its own event loop in a thread: a test that blocks its loop (kubectl calls) must
not stall the services' requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from respawn.testbed import pki
from respawn.testbed.cluster import State
from respawn.testbed.modes import Endpoints

__all__ = ["CUT", "DROP", "Fault", "FaultPolicy", "FaultProxy", "Tally", "for_testbed", "request_kind"]

# The faults that are no answer: a request dropped unanswered, a watch cut mid-stream. (The
# others are named by their status code.)
DROP: Final = "drop"
CUT: Final = "cut"

# Headers that belong to one hop (RFC 9110), never forwarded; the proxy frames its own answer.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

_SESSION: Final = web.AppKey("session", aiohttp.ClientSession)

_REASONS: Final = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
_MESSAGES: Final = {
    429: "storage is (re)initializing",
    500: "Internal error occurred: injected by the fault proxy",
    503: "the server is currently unable to handle the request",
}


@dataclass(frozen=True)
class Fault:
    """What the proxy does instead of forwarding: answer with a status code (``"429"``, ``"500"``,
    ``"503"``), :data:`DROP` the request, or :data:`CUT` a watch ``after`` seconds into it."""

    kind: str
    after: float = 0.0

    @property
    def status(self) -> int:
        return int(self.kind) if self.kind.isdigit() else 0


@dataclass
class FaultPolicy:
    """Which requests fail, and how. Decisions come from one seeded generator, in the order the
    requests arrive.

    ``rate``: the share of requests that fail, split between the faults by ``weights``;
    ``cut_rate``: the share of forwarded watches that are cut, ``cut_after`` seconds (uniformly
    between the two bounds) into the stream; ``retry_after``: the ``Retry-After`` of a 429, in
    seconds. ``script``: faults (None: forward) for the first requests, in order, before the
    generator decides. ``enabled`` False forwards everything. ``refused``: (resource, verb) pairs
    answered 503 for as long as they are in it, before anything else is decided.
    """

    seed: int = 1
    rate: float = 0.25
    weights: dict[str, float] = field(default_factory=lambda: {"429": 1.0, "500": 1.0, "503": 1.0, DROP: 0.5})
    cut_rate: float = 0.3
    cut_after: tuple[float, float] = (0.5, 3.0)
    retry_after: int = 1
    script: list[Fault | None] = field(default_factory=list)
    enabled: bool = True
    refused: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def queue(self, *faults: Fault | None) -> None:
        """What the next requests get, in order (None: forwarded), before the generator decides."""
        with self._lock:
            self.script.extend(faults)

    def refuse(self, resource: str, verb: str) -> None:
        """Answer every ``verb`` request on ``resource`` with 503 until :meth:`forward` is called."""
        with self._lock:
            self.refused.add((resource, verb))

    def forward(self, resource: str, verb: str) -> None:
        """Forward ``verb`` requests on ``resource`` again (as the policy decides)."""
        with self._lock:
            self.refused.discard((resource, verb))

    def decide(self, resource: str, verb: str) -> Fault | None:
        with self._lock:
            if not self.enabled:
                return None
            if (resource, verb) in self.refused:
                return Fault("503")
            if self.script:
                return self.script.pop(0)
            if self._random.random() < self.rate:
                kinds = sorted(self.weights)
                [kind] = self._random.choices(kinds, weights=[self.weights[k] for k in kinds])
                return Fault(kind)
            if verb == "watch" and self._random.random() < self.cut_rate:
                return Fault(CUT, self._random.uniform(*self.cut_after))
            return None


class Tally:
    """What the proxy did, by (client, resource, verb, outcome); outcome is ``forwarded``, a
    status code it answered with, or :data:`CUT`. Safe to read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str, str]] = Counter()

    def add(self, client: str, resource: str, verb: str, outcome: str) -> None:
        with self._lock:
            self._counts[(client, resource, verb, outcome)] += 1

    def counts(self) -> Counter[tuple[str, str, str, str]]:
        with self._lock:
            return Counter(self._counts)

    def injected(self, *, client: str | None = None) -> Counter[str]:
        """Faults by outcome (``"429"``, ``"500"``, ``"503"``, ``"drop"``, ``"cut"``), of one
        client or all."""
        out: Counter[str] = Counter()
        for (who, _, _, outcome), n in self.counts().items():
            if outcome != "forwarded" and (client is None or who == client):
                out[outcome] += n
        return out

    def by_verb(self, *, client: str | None = None) -> Counter[tuple[str, str]]:
        """Faults by (verb, outcome), of one client or all."""
        out: Counter[tuple[str, str]] = Counter()
        for (who, _, verb, outcome), n in self.counts().items():
            if outcome != "forwarded" and (client is None or who == client):
                out[(verb, outcome)] += n
        return out

    def requests(self, *, client: str | None = None) -> int:
        """Requests received (forwarded or answered with a fault; a cut watch was forwarded)."""
        return sum(
            n
            for (who, _, _, outcome), n in self.counts().items()
            if outcome != CUT and (client is None or who == client)
        )

    def summary(self) -> str:
        lines = [
            f"{who} {verb} {resource}: {outcome} x{n}"
            for (who, resource, verb, outcome), n in sorted(self.counts().items())
        ]
        return "\n".join(lines)


def request_kind(method: str, path: str, query: dict[str, str]) -> tuple[str, str]:
    """(resource, verb) of an API request, as the API server's audit log names them:
    ``pods``/``list``, ``appwrappers``/``watch``, ``jobs``/``delete``; discovery is
    ``discovery``/``get``."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]  # /api/v1/...
    elif parts[:1] == ["apis"]:
        rest = parts[3:]  # /apis/group/version/...
    else:
        return "other", method.lower()
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return "discovery", "get"
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"  # a subresource, e.g. appwrappers/status
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return resource, "watch"
        return resource, "get" if named else "list"
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if method == "DELETE" and not named:
        verb = "deletecollection"
    return resource, verb or method.lower()


def status_body(code: int, resource: str, retry_after: int) -> dict[str, Any]:
    """The ``Status`` the API server answers a failed request with."""
    details: dict[str, Any] = {"kind": resource}
    if code == 429:
        details["retryAfterSeconds"] = retry_after
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": _MESSAGES[code],
        "reason": _REASONS[code],
        "details": details,
        "code": code,
    }


class FaultProxy:
    """The proxy: :meth:`start` it, hand :meth:`kubeconfig` to the services, :meth:`stop` it."""

    def __init__(self, upstream: str, state_dir: Path, policy: FaultPolicy) -> None:
        """``upstream``: the API server's URL; ``state_dir``: the testbed's, whose PKI holds the
        CA and the admin client certificate."""
        self.upstream = upstream.rstrip("/")
        self.policy = policy
        self.tally = Tally()
        keys = pki.Pki(state_dir / "pki")
        self._ssl = ssl.create_default_context(cafile=str(keys.ca_crt))
        crt, key = keys.client("admin")
        self._ssl.load_cert_chain(str(crt), str(key))
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._errors: list[BaseException] = []

    # ------------------------------------------------------------------ life

    def start(self) -> FaultProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(30) or self._errors:
            raise RuntimeError(f"the fault proxy did not start: {self._errors!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(ready))
        except BaseException as exc:
            self._errors.append(exc)
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        # No pool limit: every watch holds a connection for as long as it runs. The answer is
        # relayed as the API server sent it (compressed or not), so it is not decompressed here.
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=0)
        session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app[_SESSION] = session
        app.router.add_route("*", "/{client}/{path:.*}", self._handle)
        # A client that goes away takes its relay with it (a watch would otherwise be relayed to
        # nobody until the API server ends it), and stopping does not wait for watches to end.
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()
            await session.close()

    # ------------------------------------------------------------------ clients

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, directory: Path, *, client: str) -> Path:
        """A kubeconfig that reaches the API server through this proxy, counted as ``client``."""
        path = directory / f"kubeconfig-{client}-via-proxy"
        path.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: fault-proxy
  cluster:
    server: {self.url}/{client}
users:
- name: {client}
  user:
    token: not-checked-by-the-proxy
contexts:
- name: fault-proxy
  context:
    cluster: fault-proxy
    user: {client}
current-context: fault-proxy
"""
        )
        return path

    # ------------------------------------------------------------------ requests

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        client = request.match_info["client"]
        path = "/" + request.match_info["path"]
        query = dict(request.query)
        resource, verb = request_kind(request.method, path, query)
        fault = self.policy.decide(resource, verb)
        if fault is not None and fault.kind == DROP:
            self.tally.add(client, resource, verb, DROP)
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)  # never sent: the connection is gone
        if fault is not None and fault.status:
            self.tally.add(client, resource, verb, fault.kind)
            headers = {"Retry-After": str(self.policy.retry_after)} if fault.status == 429 else {}
            return web.json_response(
                status_body(fault.status, resource, self.policy.retry_after),
                status=fault.status,
                headers=headers,
            )
        self.tally.add(client, resource, verb, "forwarded")
        session = request.app[_SESSION]
        headers = CIMultiDict(
            (k, v)
            for k, v in request.headers.items()
            if k.lower() not in _HOP_BY_HOP and k.lower() != "authorization"
        )
        body = await request.read() if request.can_read_body else None
        try:
            upstream = await session.request(
                request.method,
                self.upstream + path,
                params=request.query,
                headers=headers,
                data=body,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            # The API server itself is unreachable: answer as a gateway would.
            failure = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 502}
            return web.json_response({**failure, "message": repr(exc)}, status=502)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP_BY_HOP:
                    response.headers.add(k, v)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            if fault is not None and fault.kind == CUT:
                return await self._relay_then_cut(request, response, upstream, client, resource, verb, fault)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def _relay_then_cut(
        self,
        request: web.Request,
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        client: str,
        resource: str,
        verb: str,
        fault: Fault,
    ) -> web.StreamResponse:
        """Relay a watch for ``fault.after`` seconds, then drop the connection mid-answer (no
        final chunk): the client sees its watch break, as when the API server goes away."""
        deadline = asyncio.get_running_loop().time() + fault.after
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                chunk = await asyncio.wait_for(upstream.content.readany(), timeout=left)
            except TimeoutError:
                break
            if not chunk:
                await response.write_eof()  # the watch ended by itself first
                return response
            await response.write(chunk)
        self.tally.add(client, resource, verb, CUT)
        transport = request.transport
        if transport is not None:
            transport.abort()
        with contextlib.suppress(Exception):
            upstream.close()
        return response


def for_testbed(testbed: Endpoints, policy: FaultPolicy) -> FaultProxy:
    """A started proxy in front of the testbed's API server. Only the local testbed has one: the
    proxy authenticates with its admin certificate, so on any other the test is skipped."""
    if testbed.state_dir is None:
        pytest.skip("the fault proxy authenticates with the local testbed's admin certificate")
    state = State.load(testbed.state_dir)
    assert state is not None, f"no testbed state in {testbed.state_dir}"
    return FaultProxy(state.api_url, testbed.state_dir, policy).start()
