"""Reading objects from the API server (and making the tests' namespaces) without starting a
kubectl process each time.

The tests and the testbed's helpers poll the API server a few times a second while they wait
for something (a phase, a pod, a rollout). A ``kubectl get … -o json`` costs about a tenth of a
CPU-second (the binary starting and reading its discovery cache) where the request itself costs
a few milliseconds, so on a small machine the polling competed with what it was waiting for.
:func:`get_object` answers the same reads over one kept-alive HTTPS connection per kubeconfig
and gives what kubectl would print: the object without its ``managedFields``, or a ``List``
whose items carry their ``apiVersion`` and ``kind``. :func:`create_namespace` and
:func:`delete_namespace` do what ``kubectl create namespace`` and ``kubectl delete namespace
--wait=false`` do, for the namespace each test makes and drops, and :func:`merge_patch` what
``kubectl patch --type=merge`` does (a pod's status as a kubelet writes it, a node's labels),
:func:`create` what ``kubectl create -f - -o json`` does for one object (an access review), and
:func:`apply` what ``kubectl apply --server-side`` does for one object of a kind it knows.

It speaks only what the testbed's kubeconfigs hold (a server, a CA or
``insecure-skip-tls-verify``, a client certificate or a bearer token) and only the kinds in
:data:`RESOURCES`; anything else (another kind, an exec credential plugin, a flag it does not
know) is handed to kubectl, so a caller never needs to know which way a read went.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.client
import json
import ssl
import tempfile
import threading
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from respawn.testbed.cluster import kubectl
from respawn.testbed.errors import TestbedError

__all__ = [
    "RESOURCES",
    "Query",
    "apply",
    "create",
    "create_namespace",
    "delete_namespace",
    "get_object",
    "loads",
    "merge_patch",
    "parse_get",
]


@dataclasses.dataclass(frozen=True)
class Resource:
    group_version: str  # "v1" for the core group
    plural: str
    namespaced: bool

    def base(self) -> str:
        return (
            f"/api/{self.group_version}" if "/" not in self.group_version else f"/apis/{self.group_version}"
        )


def _kinds(group_version: str, namespaced: bool, *names: tuple[str, ...]) -> dict[str, Resource]:
    # Each tuple: plural first, then the singular and kubectl's short names.
    return {alias: Resource(group_version, aliases[0], namespaced) for aliases in names for alias in aliases}


# The kinds read here; kubectl's names for them (plural, singular, short names).
RESOURCES: dict[str, Resource] = {
    **_kinds(
        "v1",
        True,
        ("pods", "pod", "po"),
        ("events", "event", "ev"),
        ("configmaps", "configmap", "cm"),
        ("services", "service", "svc"),
        ("serviceaccounts", "serviceaccount", "sa"),
        ("secrets", "secret"),
        ("persistentvolumeclaims", "persistentvolumeclaim", "pvc"),
    ),
    **_kinds(
        "v1",
        False,
        ("nodes", "node", "no"),
        ("namespaces", "namespace", "ns"),
        ("persistentvolumes", "persistentvolume", "pv"),
    ),
    **_kinds("batch/v1", True, ("jobs", "job")),
    **_kinds(
        "apps/v1",
        True,
        ("deployments", "deployment", "deploy"),
        ("statefulsets", "statefulset", "sts"),
        ("daemonsets", "daemonset", "ds"),
    ),
    **_kinds("workload.codeflare.dev/v1beta2", True, ("appwrappers", "appwrapper", "aw")),
    # Kueue's (when the testbed runs it) by its full name only: its preferred version.
    "workloads.kueue.x-k8s.io": Resource("kueue.x-k8s.io/v1beta2", "workloads", True),
}


@dataclasses.dataclass(frozen=True)
class Query:
    """One ``kubectl get`` as a request: an object by name, or a list."""

    resource: Resource
    name: str | None = None
    namespace: str | None = None  # None: the kubeconfig's namespace ("default")
    all_namespaces: bool = False
    label_selector: str | None = None
    field_selector: str | None = None

    def path(self) -> str:
        where = ""
        if self.resource.namespaced and not (self.all_namespaces and self.name is None):
            where = f"/namespaces/{urllib.parse.quote(self.namespace or 'default', safe='')}"
        path = f"{self.resource.base()}{where}/{self.resource.plural}"
        if self.name is not None:
            return f"{path}/{urllib.parse.quote(self.name, safe='')}"
        params = {
            key: value
            for key, value in (("labelSelector", self.label_selector), ("fieldSelector", self.field_selector))
            if value
        }
        return f"{path}?{urllib.parse.urlencode(params)}" if params else path


_VALUED = {
    "-n": "namespace",
    "--namespace": "namespace",
    "-l": "label_selector",
    "--selector": "label_selector",
    "--field-selector": "field_selector",
}


def parse_get(args: Sequence[str]) -> Query | None:
    """The request for ``kubectl get <args> -o json``, or None for what is left to kubectl
    (a kind not in :data:`RESOURCES`, ``kind/name``, several names, any other flag)."""
    positional: list[str] = []
    fields: dict[str, Any] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        flag, eq, inline = arg.partition("=")
        if flag in _VALUED and arg.startswith("-"):
            if not eq:
                if not rest:
                    return None
                inline = rest.pop(0)
            fields[_VALUED[flag]] = inline
        elif arg in ("-A", "--all-namespaces"):
            fields["all_namespaces"] = True
        elif arg.startswith("-"):
            return None
        else:
            positional.append(arg)
    if not 1 <= len(positional) <= 2 or positional[0] not in RESOURCES:
        return None
    name = positional[1] if len(positional) == 2 else None
    if name is not None and fields.keys() & {"label_selector", "field_selector", "all_namespaces"}:
        return None  # kubectl refuses these with a name; let it say so
    return Query(RESOURCES[positional[0]], name=name, **fields)


@dataclasses.dataclass
class _Client:
    """One kept-alive connection to the API server a kubeconfig names."""

    host: str
    port: int
    context: ssl.SSLContext
    headers: dict[str, str]
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    conn: http.client.HTTPSConnection | None = None

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """The status and body of the answer. A request on a connection the server had closed
        is sent once more on a new one, so it may reach the server twice: the callers' requests
        are reads, writes whose repeat they recognise, or patches (the same patch twice is one)."""
        headers = self.headers if body is None else {**self.headers, "Content-Type": content_type}
        with self.lock:
            while True:
                reused = self.conn is not None
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection(
                        self.host, self.port, context=self.context, timeout=30
                    )
                try:
                    self.conn.request(method, path, body=body, headers=headers)
                    response = self.conn.getresponse()
                    return response.status, response.read()
                except (http.client.HTTPException, OSError) as exc:
                    self.conn.close()
                    self.conn = None
                    # A kept-alive connection the server has closed meanwhile (idle, restarted)
                    # fails in many ways (a reset, an EOF in the TLS layer, an empty answer):
                    # one new connection. A new connection that fails is the answer.
                    if not reused:
                        raise TestbedError(f"{method} {path}: {exc}") from exc

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


def _load_client_cert(ctx: ssl.SSLContext, user: dict[str, Any]) -> None:
    cert, key = user.get("client-certificate"), user.get("client-key")
    if cert and key:
        ctx.load_cert_chain(cert, key)
    elif "client-certificate-data" in user and "client-key-data" in user:
        # ssl loads a certificate and its key only from files; this kubeconfig embeds them.
        with tempfile.TemporaryDirectory(prefix="respawn-kubeconfig-") as tmp:
            cert_file, key_file = Path(tmp) / "client.crt", Path(tmp) / "client.key"
            cert_file.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key_file.write_bytes(base64.b64decode(user["client-key-data"]))
            ctx.load_cert_chain(cert_file, key_file)


def _client_of(kubeconfig: Path) -> _Client | None:
    """A client for what the kubeconfig's current context names, or None when it holds
    something only kubectl can use."""
    try:
        config = yaml.safe_load(kubeconfig.read_text())
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        context = contexts[config["current-context"]]
        if context.get("namespace"):
            return None  # a namespace of its own: kubectl's default for reads without -n
        cluster = {c["name"]: c["cluster"] for c in config.get("clusters") or []}[context["cluster"]]
        user = {u["name"]: u.get("user") or {} for u in config.get("users") or []}[context["user"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None
    if set(cluster) - {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
    }:
        return None
    if set(user) - {
        "client-certificate",
        "client-key",
        "client-certificate-data",
        "client-key-data",
        "token",
    }:
        return None
    url = urllib.parse.urlsplit(str(cluster.get("server", "")))
    if url.scheme != "https" or not url.hostname or url.path not in ("", "/"):
        return None
    try:
        ctx = _server_context(cluster)
    except (OSError, ValueError, ssl.SSLError):
        return None  # kubectl says what is wrong with it
    try:
        _load_client_cert(ctx, user)
    except (OSError, ValueError, ssl.SSLError):
        return None  # kubectl says what is wrong with them
    headers = {"Accept": "application/json"}
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    return _Client(url.hostname, url.port or 443, ctx, headers)


def _server_context(cluster: dict[str, Any]) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
    else:
        ctx = ssl.create_default_context()
    return ctx


# One client per kubeconfig file; a file rewritten since (another testbed in its place) gets a
# new one, and the old connection is closed.
_clients: dict[str, tuple[int, _Client | None]] = {}
_clients_lock = threading.Lock()


def _client(kubeconfig: Path) -> _Client | None:
    try:
        path, mtime = str(kubeconfig.resolve()), kubeconfig.stat().st_mtime_ns
    except OSError:
        return None
    with _clients_lock:
        known = _clients.get(path)
        if known is not None and known[0] == mtime:
            return known[1]
        if known is not None and known[1] is not None:
            known[1].close()
        client = _client_of(kubeconfig)
        _clients[path] = (mtime, client)
        return client


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    # kubectl leaves them out unless asked (--show-managed-fields).
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _as_kubectl_prints(query: Query, body: dict[str, Any]) -> dict[str, Any]:
    if query.name is not None:
        return _without_managed_fields(body)
    # A list as kubectl prints it: kind List, each item with its apiVersion and kind.
    kind = str(body.get("kind", "")).removesuffix("List")
    items = [
        _without_managed_fields({"apiVersion": query.resource.group_version, "kind": kind, **item})
        for item in body.get("items") or []
    ]
    return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def loads(payload: str | bytes) -> Any:
    """``json.loads``, with room for objects nested deeper than Python's decoder follows by default.

    The API server takes objects nested thousands of levels deep (a CRD that keeps unknown
    fields); one such object, left by anyone in any namespace, must not make every list that
    holds it unreadable. Those are decoded again as the services decode them."""
    try:
        return json.loads(payload)
    except RecursionError:
        # Imported here: it loads the services' Kubernetes client, which few reads need.
        from shared.kube.client import KubeApiError, decode_body

        try:
            return decode_body(payload, "the answer")
        except KubeApiError as exc:
            raise TestbedError(exc.message) from None


def get_object(kubeconfig: Path, *args: str) -> Any | None:
    """What ``kubectl get <args> -o json`` prints, parsed; None when the named object does not
    exist. Raises :class:`TestbedError` for any other failure, as :func:`kubectl` does."""
    query = parse_get(args)
    client = _client(kubeconfig) if query is not None else None
    if query is None or client is None:
        proc = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
        if proc.returncode == 0:
            return loads(proc.stdout)
        if "(NotFound)" in proc.stderr:
            return None
        raise TestbedError(f"kubectl get {' '.join(args)} failed: {proc.stderr.strip()}")
    status, payload = client.request("GET", query.path())
    if status == 404 and query.name is not None:
        return None
    try:
        body = loads(payload) if status == 200 else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise TestbedError(f"get {' '.join(args)} failed: {status} {_status_message(payload)}")
    return _as_kubectl_prints(query, body)


def _status_message(payload: bytes) -> str:
    try:
        body = json.loads(payload)
    except ValueError:
        body = None
    return str(body.get("message")) if isinstance(body, dict) else payload[:200].decode(errors="replace")


def _write(
    client: _Client,
    method: str,
    path: str,
    body: Any,
    *,
    what: str,
    content_type: str = "application/json",
    ok: tuple[int, ...] = (200, 201),
) -> bytes:
    """Send ``body`` (as JSON) and return the answer's body; raise :class:`TestbedError` naming
    ``what`` unless the server answered with one of ``ok``."""
    status, payload = client.request(method, path, json.dumps(body).encode(), content_type)
    if status not in ok:
        raise TestbedError(f"{what} failed: {status} {_status_message(payload)}")
    return payload


def create_namespace(kubeconfig: Path, name: str) -> None:
    """``kubectl create namespace <name>``; raises :class:`TestbedError` if it is not made."""
    client = _client(kubeconfig)
    if client is None:
        kubectl(kubeconfig, "create", "namespace", name)
        return
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    # 409: a repeat of a create that was made (see _Client.request).
    _write(client, "POST", "/api/v1/namespaces", manifest, what=f"create namespace {name}", ok=(201, 409))


def delete_namespace(kubeconfig: Path, name: str) -> None:
    """``kubectl delete namespace <name> --wait=false``, failures ignored (a clean-up)."""
    client = _client(kubeconfig)
    if client is None:
        kubectl(kubeconfig, "delete", "namespace", name, "--wait=false", check=False)
        return
    with contextlib.suppress(TestbedError):
        client.request("DELETE", f"/api/v1/namespaces/{urllib.parse.quote(name, safe='')}")


def merge_patch(
    kubeconfig: Path,
    kind: str,
    name: str,
    patch: dict[str, Any],
    *,
    namespace: str | None = None,
    subresource: str | None = None,
) -> None:
    """``kubectl patch <kind> <name> [-n <namespace>] [--subresource=…] --type=merge -p <patch>``;
    raises :class:`TestbedError` if the server refuses it (a missing object among others)."""
    resource = RESOURCES.get(kind)
    client = _client(kubeconfig) if resource is not None else None
    if resource is None or client is None:
        args = ["patch", kind, name, *(["-n", namespace] if namespace else [])]
        args += [*([f"--subresource={subresource}"] if subresource else []), "--type=merge"]
        kubectl(kubeconfig, *args, "-p", json.dumps(patch))
        return
    path = Query(resource, name=name, namespace=namespace).path()
    if subresource:
        path += f"/{urllib.parse.quote(subresource, safe='')}"
    what = f"patch {kind} {name}"
    _write(client, "PATCH", path, patch, what=what, content_type="application/merge-patch+json", ok=(200,))


def create(kubeconfig: Path, obj: dict[str, Any], *, plural: str, namespace: str | None = None) -> Any:
    """``kubectl create --validate=false -f - -o json`` of ``obj`` (of the resource ``plural`` of
    its ``apiVersion``): what the server answered, parsed. Raises :class:`TestbedError` if it
    refuses. Meant for objects whose creation has no lasting effect, or is not repeated by the
    caller: a request sent again on a new connection (see ``_Client.request``) creates it twice,
    or is refused as already there."""
    client = _client(kubeconfig)
    if client is None:
        args = [
            "create",
            "--validate=false",
            *(["-n", namespace] if namespace else []),
            "-f",
            "-",
            "-o",
            "json",
        ]
        return loads(kubectl(kubeconfig, *args, stdin=json.dumps(obj)).stdout)
    resource = Resource(str(obj.get("apiVersion", "")), plural, namespaced=namespace is not None)
    path = Query(resource, namespace=namespace).path()
    return loads(_write(client, "POST", path, obj, what=f"create {obj.get('kind')}"))


def _group(group_version: str) -> str:
    return group_version.rpartition("/")[0] if "/" in group_version else ""


def apply(kubeconfig: Path, manifest: dict[str, Any], *, namespace: str | None = None) -> None:
    """``kubectl apply --server-side --force-conflicts -n <namespace> -f -`` of one object:
    created if absent, else its fields as ``manifest`` gives them (the testbed's field manager
    owns them). A kind not in :data:`RESOURCES` (or of another group) goes through
    ``kubectl apply``. Raises :class:`TestbedError` if the server refuses it."""
    version = str(manifest.get("apiVersion", ""))
    resource = RESOURCES.get(str(manifest.get("kind", "")).lower())
    meta = manifest.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    client = _client(kubeconfig)
    if (
        resource is None
        or _group(resource.group_version) != _group(version)
        or not isinstance(name, str)
        or client is None
    ):
        args = ["apply", "--server-side", "--force-conflicts", *(["-n", namespace] if namespace else [])]
        kubectl(kubeconfig, *args, "-f", "-", stdin=json.dumps(manifest))
        return
    # The manifest's version of the kind's group (the table names one version per kind).
    path = Query(dataclasses.replace(resource, group_version=version), name=name, namespace=namespace).path()
    query = urllib.parse.urlencode({"fieldManager": "kubectl", "force": "true"})
    # JSON is YAML: the apply patch type takes it as it is.
    what = f"apply {manifest.get('kind')} {name}"
    _write(
        client, "PATCH", f"{path}?{query}", manifest, what=what, content_type="application/apply-patch+yaml"
    )
