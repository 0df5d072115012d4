"""A small in-memory API server and lifecycle stream for the lifecycle's shell (unit tests only).

It keeps the API's rules that the lifecycle's guards rely on, and nothing more:

- a write carrying a stale ``metadata.resourceVersion`` is a 409 Conflict; every write bumps it;
- PUT of the status subresource changes only the status; a merge patch merges metadata;
- a create of an existing name is 409 AlreadyExists; ``generateName`` picks a fresh name;
- a delete with ``preconditions.uid`` of another object is a 409 Conflict (the client layer then
  reports None, as :meth:`shared.kube.Kube.delete` does);
- every object gets a uid and a ``creationTimestamp`` (the *server's* clock, which tests may
  set apart from lifecycle's), and each status write a managedFields time;
- the stream drops a message whose ``Nats-Msg-Id`` it already holds (JetStream de-duplication).

Faults are injected by the tests (``fail`` hooks), never by the fake deciding on its own.

This is the one fake of lifecycle's ``KubeReads``/``KubeWrites`` in the tests: every call is also
logged with its arguments (:attr:`FakeKube.sent`), so a test that only checks what lifecycle asked
for reads that log instead of defining a recorder of its own.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from services.lifecycle.executor import EVENTS
from shared.appwrapper.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from shared.kube import KubeApiError, ResourceRef
from shared.kubetime import format_kube_time
from shared.messages import Message

AWS = ResourceRef(group=GROUP, version=VERSION, plural=PLURAL, kind=KIND, namespaced=True)
PODS = ResourceRef(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
JOBS = ResourceRef(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)
NODES = ResourceRef(group="", version="v1", plural="nodes", kind="Node", namespaced=False)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

# A hook may raise to inject a fault into one call: (verb, resource plural, name) -> None.
Fault = Callable[[str, str, str], None]


def conflict(message: str = "the object has been modified") -> KubeApiError:
    return KubeApiError(409, "Conflict", message, {"reason": "Conflict"})


@dataclass(frozen=True)
class Sent:
    """One call lifecycle made: the verb, the resource, the object's name and what came with it
    (the body or patch, and the keyword arguments)."""

    verb: str
    plural: str
    name: str
    namespace: str | None = None
    body: Any = None
    kw: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class FakeKube:
    """The calls lifecycle's reader and executor make, against dicts held here."""

    server_now: Callable[[], datetime] = lambda: T0
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    fault: Fault | None = None
    # Lifecycle names every Event it records when it has a clock to name them by; a test of an
    # executor made without one lets it ask the client to name them (``create_event``).
    unnamed_events: bool = False
    _rv: itertools.count[int] = field(default_factory=lambda: itertools.count(100))
    _uid: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _gen: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # ----------------------------------------------------------------- helpers for tests

    def put(self, ref: ResourceRef, obj: Mapping[str, Any], *, keep_version: bool = False) -> dict[str, Any]:
        """Store ``obj`` as if created by someone (not lifecycle); ``keep_version``: at the
        resourceVersion it names rather than a fresh one."""
        obj = copy.deepcopy(dict(obj))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta.setdefault("creationTimestamp", format_kube_time(self.server_now()))
        if not (keep_version and meta.get("resourceVersion")):
            meta["resourceVersion"] = str(next(self._rv))
        obj.setdefault("apiVersion", ref.api_version)
        obj.setdefault("kind", ref.kind)
        self.objects[(ref.plural, meta.get("namespace", ""), meta["name"])] = obj
        return copy.deepcopy(obj)

    def stored(self, ref: ResourceRef, name: str, namespace: str = "team") -> dict[str, Any] | None:
        found = self.objects.get((ref.plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def all(self, ref: ResourceRef, namespace: str = "team") -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (p, ns, _), o in sorted(self.objects.items())
            if p == ref.plural and ns == namespace
        ]

    def sent_as(self, verb: str) -> list[Sent]:
        return [s for s in self.sent if s.verb == verb]

    def _check(
        self,
        verb: str,
        ref: ResourceRef,
        name: str,
        namespace: str | None = None,
        body: Any = None,
        **kw: Any,
    ) -> None:
        self.calls.append((verb, ref.plural, name))
        if self.fault is not None:
            self.fault(verb, ref.plural, name)
        # What reached the server: a call an injected fault stopped is in ``calls`` only.
        self.sent.append(Sent(verb, ref.plural, name, namespace, copy.deepcopy(body), kw))

    def _get(self, ref: ResourceRef, name: str, namespace: str | None) -> dict[str, Any]:
        found = self.objects.get((ref.plural, namespace or "", name))
        if found is None:
            raise KubeApiError(404, "NotFound", f"{ref.plural} {name} not found", {"reason": "NotFound"})
        return found

    def _to_replace(self, verb: str, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        """The stored object a PUT of ``body`` replaces (409 if ``body`` holds another version)."""
        meta = body["metadata"]
        self._check(verb, ref, meta["name"], meta.get("namespace"), body)
        current = self._get(ref, meta["name"], meta.get("namespace"))
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise conflict()
        return current

    # ----------------------------------------------------------------- KubeReads / KubeWrites
    # A deliberate mirror of shared.kube.Kube's signatures (as the Protocols of
    # services/lifecycle/reader.py and executor.py are): this fake stands in for the client.

    async def resource(self, api_version: str, kind: str) -> ResourceRef:
        for ref in (AWS, PODS, JOBS, NODES, EVENTS):
            if (ref.api_version, ref.kind) == (api_version, kind):
                return ref
        raise KubeApiError(404, "NotFound", f"kind {kind} is not served")

    async def get(self, ref: ResourceRef, name: str, namespace: str | None = None) -> dict[str, Any]:
        self._check("get", ref, name, namespace)
        return copy.deepcopy(self._get(ref, name, namespace))

    async def list(self, ref: ResourceRef, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        self._check("list", ref, "", namespace, **query)
        selector = str(query.get("labelSelector", ""))
        key, _, value = selector.partition("=")
        items = [
            copy.deepcopy(o)
            for (plural, ns, _), o in sorted(self.objects.items())
            if plural == ref.plural
            and (namespace is None or ns == namespace)
            and (not key or (o["metadata"].get("labels") or {}).get(key) == value)
        ]
        return {"items": items, "metadata": {"resourceVersion": str(next(self._rv))}}

    async def create(
        self,
        ref: ResourceRef,
        body: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', '')}{next(self._gen):05d}"
        self._check("create", ref, meta["name"], namespace, body, dry_run=dry_run)
        meta["namespace"] = namespace or meta.get("namespace", "")
        if (ref.plural, meta["namespace"], meta["name"]) in self.objects:
            raise KubeApiError(
                409, "Conflict", f"{ref.plural} {meta['name']} already exists", {"reason": "AlreadyExists"}
            )
        meta["uid"] = f"uid-{next(self._uid)}"
        meta["creationTimestamp"] = format_kube_time(self.server_now())
        meta["resourceVersion"] = str(next(self._rv))
        if not dry_run:
            self.objects[(ref.plural, meta["namespace"], meta["name"])] = obj
        return copy.deepcopy(obj)

    async def replace(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        current = self._to_replace("replace", ref, body)
        new = copy.deepcopy(dict(body))
        new["status"] = copy.deepcopy(current.get("status"))
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[(ref.plural, meta.get("namespace", ""), meta["name"])] = new
        return copy.deepcopy(new)

    async def replace_status(self, ref: ResourceRef, body: Mapping[str, Any]) -> dict[str, Any]:
        current = self._to_replace("replace_status", ref, body)
        current["status"] = copy.deepcopy(body.get("status"))
        current["metadata"]["resourceVersion"] = str(next(self._rv))
        current["metadata"]["managedFields"] = [
            {
                "manager": "lifecycle",
                "operation": "Update",
                "subresource": "status",
                "time": format_kube_time(self.server_now()),
            }
        ]
        return copy.deepcopy(current)

    async def patch(
        self,
        ref: ResourceRef,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        self._check("patch", ref, name, namespace, patch, patch_type=patch_type)
        current = self._get(ref, name, namespace)
        if patch_type == "application/json-patch+json":
            _json_patch(current, patch)
            current["metadata"]["resourceVersion"] = str(next(self._rv))
            return copy.deepcopy(current)
        assert patch_type == "application/merge-patch+json", "only merge and JSON patches are modelled"
        meta_patch = dict(patch.get("metadata") or {})
        expected = meta_patch.pop("resourceVersion", None)
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise conflict()
        _merge(current["metadata"], meta_patch)
        current["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(current)

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
        self._check(
            "delete",
            ref,
            name,
            namespace,
            grace_period_seconds=grace_period_seconds,
            propagation=propagation,
            uid=uid,
        )
        key = (ref.plural, namespace or "", name)
        current = self.objects.get(key)
        if current is None:
            return None
        if uid and current["metadata"]["uid"] != uid:
            return None  # the precondition failed: Kube.delete reports that as None
        del self.objects[key]
        # The garbage collector, at once: what this object controlled goes too.
        owned = [
            k
            for k, o in self.objects.items()
            if any(
                r.get("uid") == current["metadata"]["uid"] for r in o["metadata"].get("ownerReferences") or []
            )
        ]
        for k in owned:
            del self.objects[k]
        return current

    async def create_event(self, involved: Mapping[str, Any], **kw: Any) -> None:
        if not self.unnamed_events:
            raise AssertionError("lifecycle names every Event it records")
        meta = involved.get("metadata") or {}
        self.sent.append(Sent("create_event", EVENTS.plural, "", meta.get("namespace"), None, kw))


def _merge(into: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _json_patch(into: dict[str, Any], ops: list[Mapping[str, Any]]) -> None:
    """The ``test`` and ``replace`` operations of a JSON patch (RFC 6902), on object members."""
    for op in ops:
        *parents, leaf = op["path"].strip("/").split("/")
        target = into
        for key in parents:
            target = target[key]
        if op["op"] == "test":
            if target.get(leaf) != op["value"]:
                raise KubeApiError(422, "Invalid", f"the test of {op['path']} failed", {"reason": "Invalid"})
        elif op["op"] == "replace":
            target[leaf] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"JSON patch op {op['op']} is not modelled")


@dataclass
class Published:
    duplicate: bool


@dataclass
class FakeStream:
    """The lifecycle stream: keeps every message, drops a repeated Nats-Msg-Id."""

    messages: list[tuple[str, Message, str]] = field(default_factory=list)
    fail: Callable[[Message], None] | None = None

    async def publish(self, subject: str, message: Message, *, msg_id: str | None) -> Published:
        if self.fail is not None:
            self.fail(message)
        assert msg_id, "every lifecycle message has a deterministic id"
        if any(seen == msg_id for _, _, seen in self.messages):
            return Published(duplicate=True)
        self.messages.append((subject, message, msg_id))
        return Published(duplicate=False)


def _nothing_is_published(message: Message) -> None:
    raise AssertionError(f"nothing is published here, yet {message!r} was")


def no_bus() -> FakeStream:
    """A stream for an executor that must publish nothing."""
    return FakeStream(fail=_nothing_is_published)


def job_appwrapper(
    name: str = "train", *, job: str = "train-job", generate: bool = False, suspend: bool = False
) -> dict[str, Any]:
    """An AppWrapper around one Job (``generate``: the Job has only a generateName)."""
    job_meta: dict[str, Any] = {"generateName": f"{job}-"} if generate else {"name": job}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": "team", "generation": 1},
        "spec": {
            "suspend": suspend,
            "components": [
                {
                    "template": {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": job_meta,
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "m", "image": "x"}],
                                },
                            },
                        },
                    }
                }
            ],
        },
    }
