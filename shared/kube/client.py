"""The one Kubernetes client layer: raw JSON requests over kubernetes_asyncio's ApiClient.

Respawn works with unstructured objects (any wrapped GVK, the AppWrapper CRD), so this
layer speaks plain dicts and resolves kinds through API discovery instead of using the
generated typed models. Authentication and TLS come from kubeconfig or the in-cluster
service account, exactly as kubernetes_asyncio loads them.

Every failure is a :class:`KubeApiError`, a lost connection included. A request the API server
turned away for now is tried again here, a few times within a couple of seconds, as client-go
does (:func:`retry_delay`): a 429 or an answer with ``Retry-After`` (the server did not act on
it) whatever the verb, after the time the server asked for; a 5xx or a lost connection only for
a read, which is safe to repeat. What is still failing then goes to the caller, whose own retry
(with its own backoff) takes over.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlsplit
from urllib.request import getproxies_environment, proxy_bypass

import aiohttp

from shared import jsoncodec, metrics

if TYPE_CHECKING:
    # kubernetes_asyncio is imported when a connection is made (Kube.connect), not with this
    # module: its client package loads every generated model, a third of a service's imports,
    # and health and autopilot, which never talk to the API server, import this layer too.
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

RETRIES = metrics.counter(
    "respawn_kube_request_retries",
    "Requests to the API server tried again after an answer that said to (429, Retry-After) or a "
    "failed read, by method and status (0: no answer)",
    ["method", "status"],
)

REQUESTS = metrics.counter(
    "respawn_kube_requests",
    "Requests sent to the API server (each try of one counts), by verb (get, list, watch, create, "
    "update, patch, delete) and resource (plural, with its subresource; discovery for the API's "
    "own listings)",
    ["verb", "resource"],
)


class KubeApiError(Exception):
    """A non-2xx answer from the API server, with the server's own message; status 0 when there
    was no answer (reason ``Unavailable``, or ``Timeout``). ``retry_after``: the seconds the
    server asked the client to wait (``Retry-After``), if it did."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: Mapping[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = dict(body or {})
        self.retry_after = retry_after

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.body.get("reason") == "AlreadyExists"

    @property
    def invalid(self) -> bool:
        return self.status in (400, 422)

    @property
    def forbidden(self) -> bool:
        return self.status == 403

    @property
    def transient(self) -> bool:
        # Status 0: no answer (unreachable, timed out) — except an answer that came but cannot
        # be read, which a retry does not change.
        return self.status in (429, 500, 502, 503, 504) or (self.status == 0 and self.reason != "Undecodable")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failed request is tried again in place (:func:`retry_delay`)."""

    # Tries after the first.
    retries: int = 3
    # The first wait when the server names none; it doubles with each try, and is jittered.
    base: float = 0.1
    # No wait is longer: a server that asks for more is left to the caller's own retry.
    max_wait: float = 2.0


RETRY: Final = RetryPolicy()


def retry_delay(method: str, exc: KubeApiError, retried: int, policy: RetryPolicy = RETRY) -> float | None:
    """How long to wait before trying ``method`` again after it failed with ``exc``, having been
    tried again ``retried`` times already; None: do not (raise ``exc``).

    - 429, or any transient answer with ``Retry-After``: the server turned the request away
      without acting on it, so any verb is tried again, after the time the server asked for;
    - another 5xx, or no answer: the server may have acted before it failed, so only a GET is
      repeated. A request that timed out is not: it has had its time.
    """
    if retried >= policy.retries or not exc.transient or exc.reason == "Timeout":
        return None
    backoff = policy.base * 2**retried * random.uniform(0.5, 1.0)
    if exc.status == 429 or exc.retry_after is not None:
        wait = max(backoff, exc.retry_after or 0.0)
        return wait if wait <= policy.max_wait else None
    return backoff if method == "GET" else None


def retry_after_of(headers: Mapping[str, str] | None, body: Mapping[str, Any]) -> float | None:
    """The seconds a failed answer asks the client to wait: its ``Retry-After`` header (in
    seconds; a date is not used), else its ``Status`` body's ``details.retryAfterSeconds``."""
    raw = (headers or {}).get("Retry-After")
    if raw is not None and raw.strip().isdigit():
        return float(raw.strip())
    details = body.get("details")
    seconds = details.get("retryAfterSeconds") if isinstance(details, Mapping) else None
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0:
        return float(seconds)
    return None


_VERBS: Final = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_kind(
    method: str, path: str, query: Mapping[str, str | int | bool] | None = None
) -> tuple[str, str]:
    """(verb, resource) of a request, as the API server's own ``apiserver_request_total`` names
    them: a GET of a collection is a ``list`` (``watch`` with ``watch=true``), of one object a
    ``get``; the resource is the plural, with ``/subresource``, or ``discovery`` for a path
    that names no resource (``/api/v1``, ``/apis/batch/v1``)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    # /api/v1/... or /apis/<group>/<version>/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource; /api/v1/namespaces/<ns> alone is the namespace
    if not rest:
        return "get", "discovery"
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    if method != "GET":
        return _VERBS.get(method, method.lower()), resource
    if len(rest) >= 2:
        return "get", resource
    watching = (query or {}).get("watch")
    return ("watch" if watching is True or str(watching).lower() == "true" else "list"), resource


@dataclass(frozen=True, slots=True)
class ResourceRef:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


def split_api_version(api_version: str) -> tuple[str, str]:
    if "/" in api_version:
        group, _, version = api_version.partition("/")
        return group, version
    return "", api_version


def decode_body(raw: bytes | str, what: str) -> dict[str, Any]:
    """A JSON answer of the API server, or a ``KubeApiError`` (reason ``Undecodable``) naming
    ``what`` when it cannot be read.

    The API server stores objects nested deeper than Python's decoder can follow (it recurses
    once per level and gives up near 1,000): such an answer must fail as one API error that the
    caller handles per object, not as a RecursionError that escapes every handler.
    """
    try:
        try:
            data = jsoncodec.loads(raw)
        except RecursionError:
            # One deep object must not make a whole LIST page (every other object on it)
            # unreadable: decode again with room for it; what then cannot handle the object
            # fails for that object alone.
            data = _decode_deep(raw)
    except RecursionError:
        raise KubeApiError(0, "Undecodable", f"{what}: the answer is nested too deeply to decode") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise KubeApiError(0, "Undecodable", f"{what}: the answer is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KubeApiError(0, "Undecodable", f"{what}: the answer is not a JSON object")
    return data


# The deepest nesting decoded at all; the API server itself refuses JSON nested deeper than 10,000.
DEEP_DECODE_LIMIT = 12_000
_DEEP_DECODE_STACK = 256 * 1024 * 1024


def _decode_deep(raw: bytes | str) -> Any:
    """``json.loads`` with room for :data:`DEEP_DECODE_LIMIT` levels, in a thread of its own.

    The decoder recurses on the C stack once per level; a thread with a large stack and a raised
    recursion limit lets it finish. The caller (the event loop) waits for it: deep answers are
    rare (admission refuses such templates when the webhook is installed).
    """
    outcome: dict[str, Any] = {}

    def decode() -> None:
        before = sys.getrecursionlimit()
        sys.setrecursionlimit(max(before, DEEP_DECODE_LIMIT + 100))
        try:
            outcome["value"] = json.loads(raw)
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome["error"] = exc
        finally:
            sys.setrecursionlimit(before)

    default = threading.stack_size()
    threading.stack_size(_DEEP_DECODE_STACK)
    try:
        worker = threading.Thread(target=decode, name="deep-json-decode")
        worker.start()
    finally:
        threading.stack_size(default)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _api_exception() -> type[ApiException]:
    """kubernetes_asyncio's error class. An ``except`` clause evaluates this only when an error
    reaches it, by which time a connection (and so the package) exists."""
    from kubernetes_asyncio.client.exceptions import ApiException

    return ApiException


def _error_from(exc: ApiException) -> KubeApiError:
    body: dict[str, Any] = {}
    message = str(exc.reason or "")
    raw: Any = exc.body
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if isinstance(raw, str) and raw:
        try:
            body = json.loads(raw)
            message = str(body.get("message") or message)
        except json.JSONDecodeError:
            message = raw[:500]
    if not isinstance(body, dict):
        body = {}
    headers = exc.headers if isinstance(exc.headers, Mapping) else None
    return KubeApiError(
        int(exc.status or 0),
        str(exc.reason or ""),
        message,
        body,
        retry_after=retry_after_of(headers, body),
    )


def _error_from_body(status: int, reason: str, raw: bytes, headers: Mapping[str, str] | None) -> KubeApiError:
    body: dict[str, Any] = {}
    message = reason
    if raw:
        try:
            body = json.loads(raw)
            message = str(body.get("message") or message)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            message = raw[:500].decode(errors="replace")
    if not isinstance(body, dict):
        body = {}
    return KubeApiError(status, reason, message, body, retry_after=retry_after_of(headers, body))


def _no_answer(method: str, path: str, exc: BaseException) -> KubeApiError:
    """A request that got no (complete) answer: timed out, refused, or the connection was lost
    (aiohttp's own errors are not all OSErrors)."""
    reason = "Timeout" if isinstance(exc, TimeoutError) else "Unavailable"
    return KubeApiError(0, reason, f"{method} {path}: {exc!r}")


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``/``HTTP_PROXY``, unless
    ``NO_PROXY`` matches the host), read as Kubernetes clients read them; None for none."""
    parts = urlsplit(url)
    proxies = getproxies_environment()
    proxy = proxies.get(parts.scheme or "https")
    if not proxy or proxy_bypass(parts.hostname or ""):
        return None
    return proxy


# How long a connection to the API server may stay idle in the pool (seconds): under the API
# server's own 90 s, so that the client, not the server, closes it.
KEEPALIVE: Final = 60.0


class Kube:
    """An authenticated connection to one API server."""

    def __init__(self, api: k8s_client.ApiClient) -> None:
        self.api = api
        self._resources: dict[tuple[str, str], ResourceRef] = {}
        self._discovery_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, kubeconfig: str | os.PathLike[str] | None = None, *, qps_pool: int = 64) -> Kube:
        """From ``kubeconfig`` (or $KUBECONFIG); in a pod, from the service account."""
        from kubernetes_asyncio import client as k8s_client
        from kubernetes_asyncio import config as k8s_config

        configuration = k8s_client.Configuration()
        path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
        if path:
            await k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        configuration.connection_pool_maxsize = qps_pool
        if not configuration.proxy:
            configuration.proxy = env_proxy(str(configuration.host))
        api = k8s_client.ApiClient(configuration)
        # kubernetes_asyncio's session trusts the environment, and aiohttp then re-reads the
        # proxy variables and ~/.netrc (in a thread) on every request: about 15 % of lifecycle's
        # CPU with 10,000 AppWrappers. The proxy is resolved once above instead, and the API
        # server authenticates by token or certificate, never by netrc.
        api.rest_client.pool_manager._trust_env = False
        # aiohttp closes a connection idle for 15 s. Lifecycle's requests come in bursts further
        # apart than that (a reset every few seconds), and each burst then paid a TCP and TLS
        # handshake per connection: CPU, and milliseconds on a reset's first request. The API
        # server closes an idle connection only after 90 s.
        connector = api.rest_client.pool_manager.connector
        if connector is not None:
            connector._keepalive_timeout = KEEPALIVE
        return cls(api)

    async def close(self) -> None:
        await self.api.close()

    # ------------------------------------------------------------- raw requests

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        request_timeout: float | None = 30.0,
        retry: RetryPolicy | None = RETRY,
    ) -> dict[str, Any]:
        """One request, tried again as :func:`retry_delay` says (``retry`` None: never)."""
        retried = 0
        while True:
            try:
                return await self._request(
                    method, path, query, body=body, content_type=content_type, seconds=request_timeout
                )
            except KubeApiError as exc:
                delay = retry_delay(method, exc, retried, retry) if retry is not None else None
                if delay is None:
                    raise
                RETRIES.labels(method=method, status=str(exc.status)).inc()
                log.debug("%s %s failed (%s); trying again in %.2fs", method, path, exc, delay)
                await asyncio.sleep(delay)
                retried += 1

    async def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int | bool] | None,
        *,
        body: Any,
        content_type: str,
        seconds: float | None,
    ) -> dict[str, Any]:
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]
        verb, resource = request_kind(method, path, query)
        REQUESTS.labels(verb=verb, resource=resource).inc()
        try:
            resp = await self.api.call_api(
                path,
                method,
                query_params=params,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=seconds,
            )
            raw = await resp.read()
        except _api_exception() as exc:
            raise _error_from(exc) from exc
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise _no_answer(method, path, exc) from exc
        status = int(getattr(resp, "status", 200))
        if status >= 400:
            # Without preloading, kubernetes_asyncio hands back error answers instead of raising.
            raise _error_from_body(
                status, str(getattr(resp, "reason", "") or ""), raw, getattr(resp, "headers", None)
            )
        return decode_body(raw, f"{method} {path}") if raw else {}

    async def stream_lines(
        self, path: str, *, query: Mapping[str, str | int | bool], request_timeout: float | None
    ) -> AsyncIterator[bytes]:
        """A long-running GET whose body is newline-delimited JSON (watch)."""
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]
        verb, resource = request_kind("GET", path, query)
        REQUESTS.labels(verb=verb, resource=resource).inc()
        try:
            resp = await self.api.call_api(
                path,
                "GET",
                query_params=params,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=request_timeout,
            )
        except _api_exception() as exc:
            raise _error_from(exc) from exc
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise _no_answer("GET", path, exc) from exc
        status = int(getattr(resp, "status", 200))
        if status >= 400:
            try:
                raw = await resp.read()
            except (TimeoutError, OSError, aiohttp.ClientError) as exc:
                raise _no_answer("GET", path, exc) from exc
            finally:
                resp.release()
            raise _error_from_body(
                status, str(getattr(resp, "reason", "") or ""), raw, getattr(resp, "headers", None)
            )
        try:
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if line.strip():
                    yield line
        finally:
            resp.release()

    # ------------------------------------------------------------- discovery

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        """Resolve (apiVersion, kind) to its REST resource through discovery (cached)."""
        key = (api_version, kind)
        if key in self._resources:
            return self._resources[key]
        async with self._discovery_lock:
            if key in self._resources:
                return self._resources[key]
            group, version = split_api_version(api_version)
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            try:
                listing = await self.request("GET", path)
            except KubeApiError as exc:
                if exc.not_found:
                    raise KubeApiError(
                        404, "NotFound", f"no API group/version {api_version} on this cluster"
                    ) from exc
                raise
            for res in listing.get("resources", []):
                if "/" in res["name"]:
                    continue
                ref = ResourceRef(group, version, res["name"], res["kind"], bool(res.get("namespaced")))
                self._resources[(api_version, res["kind"])] = ref
            if key not in self._resources:
                raise KubeApiError(
                    404, "NotFound", f"kind {kind} is not served by {api_version} on this cluster"
                )
            return self._resources[key]

    def forget(self, api_version: str, kind: str) -> None:
        """Drop a cached resolution (e.g. after a CRD was installed or removed)."""
        self._resources.pop((api_version, kind), None)

    # ------------------------------------------------------------- typed helpers

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.request("GET", ref.path(namespace, name))

    async def list(
        self, ref: ResourceRef, namespace: str | None = None, **query: str | int | bool
    ) -> dict[str, Any]:
        return await self.request("GET", ref.path(namespace), query=query)

    async def create(
        self,
        ref: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        query: dict[str, str | int | bool] = {"dryRun": "All"} if dry_run else {}
        return await self.request("POST", ref.path(namespace), body=dict(body), query=query)

    async def replace_status(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT the status subresource: carries metadata.resourceVersion, so a stale write is a 409."""
        meta = body["metadata"]
        return await self.request(
            "PUT", ref.path(meta.get("namespace"), meta["name"], "status"), body=dict(body)
        )

    async def replace(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        return await self.request("PUT", ref.path(meta.get("namespace"), meta["name"]), body=dict(body))

    async def patch(
        self,
        ref: ResourceRef,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        return await self.request(
            "PATCH", ref.path(namespace, name, subresource), body=patch, content_type=patch_type
        )

    async def delete(
        self,
        ref: ResourceRef,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> dict[str, Any] | None:
        """Delete; None if it was already gone. ``uid`` makes it a no-op for a newer namesake."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            return await self.request("DELETE", ref.path(namespace, name), body=body)
        except KubeApiError as exc:
            if exc.not_found or (exc.conflict and uid):
                return None
            raise

    async def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        type_: str,
        reason: str,
        message: str,
        component: str,
        now_iso: str,
        name: str | None = None,
    ) -> None:
        """A core/v1 Event on ``involved`` (best effort is the caller's decision). With ``name``
        it is created under that name, so telling the same thing twice is a 409 (AlreadyExists)
        instead of a second Event; without, under a generated one."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        named = {"name": name} if name else {"generateName": f"{meta['name']}."}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {**named, "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", ""),
                "kind": involved.get("kind", ""),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now_iso,
            "lastTimestamp": now_iso,
            "count": 1,
        }
        await self.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body=event)
