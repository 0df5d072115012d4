"""Self-managed mode: the webhook keeps its own serving certificate, and the NATS passwords Secret.

At start, before it serves, and then every minute (:data:`CHECK_PERIOD`), each replica:

1. makes sure the Secret ``--cert-secret`` in its namespace holds a CA and a serving certificate
   that will do for a while (:func:`services.webhook.certs.assess`): it creates the Secret if
   there is none (a 409 means another replica created it first: that one is read and used), and
   replaces it, with the resourceVersion it read as a precondition, when it needs more (a 409:
   another replica replaced it first; read again);
2. writes the serving certificate and key into the files it serves from (an ``emptyDir``), where
   :class:`services.webhook.server.ServingCert` picks them up;
3. sets the Secret's CA bundle as ``caBundle`` of every webhook of both configurations
   ``--configuration``, where it differs;
4. with ``--nats-users-secret``, creates that Secret with a random password per NATS user if it
   does not exist. An existing one is never changed.

Only step 1 and 2 must succeed before the webhook serves; the others are tried again, sooner
than the period, until they do. The decisions are in ``certs.py``; here is only the I/O.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from services.webhook import certs
from shared import natsusers
from shared.kube import Kube, KubeApiError

log = logging.getLogger("services.webhook.selfmanaged")

CHECK_PERIOD: Final = 60.0
# After a failure, the next try comes sooner: from this, doubling up to the period.
RETRY_FIRST: Final = 1.0
# Attempts at one sync of the Secret while other replicas keep changing it.
_ATTEMPTS: Final = 5
_CONFIGURATIONS: Final = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
_ADMISSION_API: Final = "/apis/admissionregistration.k8s.io/v1"
# Secret types the certificate may be kept in: the one it is created with, and one made by hand.
_CERT_SECRET_TYPES: Final = ("kubernetes.io/tls", "Opaque")
_LABELS: Final = {"app.kubernetes.io/name": "respawn", "app.kubernetes.io/managed-by": "respawn-webhook"}


class SelfManagedError(Exception):
    """The Secret could not be brought to a usable state this time; the message says why."""


@dataclass(frozen=True)
class SelfManagedOptions:
    namespace: str
    cert_secret: str
    service: str
    configuration: str
    extra_hosts: tuple[str, ...]
    # Empty: leave the NATS passwords alone.
    nats_users_secret: str
    cert_file: Path
    key_file: Path

    @property
    def hosts(self) -> tuple[str, ...]:
        return certs.service_hosts(self.service, self.namespace, self.extra_hosts)


def _secret_path(namespace: str, name: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"
    return f"{path}/{quote(name, safe='')}" if name else path


def decoded(secret: Mapping[str, Any] | None) -> dict[str, bytes] | None:
    """The Secret's data, base64-decoded (a value that does not decode is left out)."""
    if secret is None:
        return None
    out: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        with contextlib.suppress(ValueError, TypeError):
            out[str(key)] = base64.b64decode(str(value), validate=True)
    return out


def _encoded(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}


def _write_if_changed(path: Path, content: bytes, mode: int) -> bool:
    """Replace ``path`` by ``content`` in one rename (so a reader sees the old or the new file,
    never half of one); False if it already held it."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == content:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return True


class SelfManaged:
    """The I/O of self-managed mode against one API server (module docstring)."""

    def __init__(
        self,
        kube: Kube,
        options: SelfManagedOptions,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._kube = kube
        self._options = options
        self._clock = clock
        self._warned_users: frozenset[str] = frozenset()
        # A step other than the certificate's is still to be done: the next round comes sooner.
        self._pending = False
        # The CA bundle last written, for the configurations.
        self.ca_bundle: bytes = b""

    # ------------------------------------------------------------------ the certificate

    async def _read_secret(self, name: str) -> dict[str, Any] | None:
        try:
            return await self._kube.request("GET", _secret_path(self._options.namespace, name))
        except KubeApiError as exc:
            if exc.not_found:
                return None
            raise

    async def ensure_certificate(self) -> dict[str, bytes]:
        """The Secret's data once it holds a usable CA and serving certificate (made here if
        needed). Raises KubeApiError or SelfManagedError."""
        opts = self._options
        for _ in range(_ATTEMPTS):
            secret = await self._read_secret(opts.cert_secret)
            data = decoded(secret)
            now = self._clock()
            assessment = certs.assess(data, opts.hosts, now)
            if assessment.need is certs.Need.NOTHING:
                return data or {}
            log.info(
                "Secret %s/%s: %s; issuing a new %s",
                opts.namespace,
                opts.cert_secret,
                assessment.reason,
                "CA and serving certificate" if assessment.need is certs.Need.CA else "serving certificate",
            )
            fresh = certs.issue(data, assessment.need, opts.hosts, now)
            try:
                if secret is None:
                    await self._create_cert_secret(fresh)
                else:
                    await self._replace_cert_secret(secret, fresh)
            except KubeApiError as exc:
                if exc.conflict:
                    # Another replica created or replaced it first: read what it wrote.
                    log.info(
                        "Secret %s/%s was written by another replica; reading it",
                        opts.namespace,
                        opts.cert_secret,
                    )
                    continue
                raise
            return fresh
        raise SelfManagedError(
            f"Secret {opts.namespace}/{opts.cert_secret} changed under every one of {_ATTEMPTS} attempts"
        )

    async def _create_cert_secret(self, data: Mapping[str, bytes]) -> None:
        opts = self._options
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": opts.cert_secret,
                "namespace": opts.namespace,
                "labels": {**_LABELS, "app.kubernetes.io/component": "webhook"},
            },
            "type": "kubernetes.io/tls",
            "data": _encoded(data),
        }
        await self._kube.request("POST", _secret_path(opts.namespace), body=body)
        log.info("Secret %s/%s created", opts.namespace, opts.cert_secret)

    async def _replace_cert_secret(self, secret: Mapping[str, Any], data: Mapping[str, bytes]) -> None:
        opts = self._options
        kind = secret.get("type") or "Opaque"
        if kind not in _CERT_SECRET_TYPES:
            raise SelfManagedError(
                f"Secret {opts.namespace}/{opts.cert_secret} is of type {kind}, not one a certificate is "
                f"kept in ({', '.join(_CERT_SECRET_TYPES)}); delete it so the webhook can make its own"
            )
        meta = secret.get("metadata") or {}
        # The resourceVersion read: if another replica replaced the Secret since, this is a 409.
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                key: meta[key]
                for key in (
                    "name",
                    "namespace",
                    "labels",
                    "annotations",
                    "resourceVersion",
                    "ownerReferences",
                )
                if key in meta
            },
            "type": kind,
            "data": _encoded(data),
        }
        await self._kube.request("PUT", _secret_path(opts.namespace, opts.cert_secret), body=body)
        log.info("Secret %s/%s replaced", opts.namespace, opts.cert_secret)

    def write_files(self, data: Mapping[str, bytes]) -> bool:
        """The serving pair into the files served from; True if either changed. The key first:
        until the certificate follows, the pair does not match and the server keeps the old one."""
        opts = self._options
        key_changed = _write_if_changed(opts.key_file, data[certs.KEY], 0o600)
        cert_changed = _write_if_changed(opts.cert_file, data[certs.CERT], 0o644)
        return key_changed or cert_changed

    # ------------------------------------------------------------------ the configurations

    async def patch_configurations(self, bundle: bytes) -> bool:
        """``bundle`` as caBundle of every webhook of both configurations where it is not yet
        (:func:`certs.bundle_needs_update`); False if a configuration is missing."""
        name = self._options.configuration
        encoded = base64.b64encode(bundle).decode()
        complete = True
        for plural in _CONFIGURATIONS:
            path = f"{_ADMISSION_API}/{plural}/{quote(name, safe='')}"
            try:
                conf = await self._kube.request("GET", path)
            except KubeApiError as exc:
                if not exc.not_found:
                    raise
                log.warning("%s %s not found; its caBundle is set once it exists", plural, name)
                complete = False
                continue
            ops: list[dict[str, Any]] = []
            for index, hook in enumerate(conf.get("webhooks") or []):
                current = (hook.get("clientConfig") or {}).get("caBundle")
                current_pem = base64.b64decode(current) if current else None
                if certs.bundle_needs_update(current_pem, bundle):
                    # The test keeps the index honest: the list may have changed since the GET.
                    ops.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook.get("name")})
                    ops.append(
                        {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded}
                    )
            if ops:
                await self._kube.request("PATCH", path, body=ops, content_type="application/json-patch+json")
                log.info("%s %s: caBundle set on %d webhook(s)", plural, name, len(ops) // 2)
        return complete

    # ------------------------------------------------------------------ NATS passwords

    async def ensure_nats_users(self) -> None:
        name = self._options.nats_users_secret
        if not name:
            return
        namespace = self._options.namespace
        existing = await self._read_secret(name)
        if existing is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {**_LABELS, "app.kubernetes.io/component": "nats"},
                },
                "type": "Opaque",
                "data": _encoded(
                    {u: natsusers.generate_password().encode() for u in natsusers.DEFAULT_USERS}
                ),
            }
            try:
                await self._kube.request("POST", _secret_path(namespace), body=body)
            except KubeApiError as exc:
                if not exc.already_exists:
                    raise
                log.info("Secret %s/%s was created by another replica", namespace, name)
                return
            log.info(
                "Secret %s/%s created with a password for %s",
                namespace,
                name,
                ", ".join(natsusers.DEFAULT_USERS),
            )
            return
        missing = frozenset(u for u in natsusers.DEFAULT_USERS if u not in (existing.get("data") or {}))
        if missing and missing != self._warned_users:
            # Never changed: the passwords in it are the ones NATS and the services run with.
            log.warning(
                "Secret %s/%s has no password for %s; left as it is (a NATS server without one "
                "does not start)",
                namespace,
                name,
                ", ".join(sorted(missing)),
            )
        self._warned_users = missing

    # ------------------------------------------------------------------ the loop

    async def sync_certificate(self) -> None:
        """Steps 1 and 2: the Secret, then the files."""
        data = await self.ensure_certificate()
        if self.write_files(data):
            log.info("serving certificate written to %s", self._options.cert_file)
        self.ca_bundle = data[certs.CA_CERT]

    async def sync(self) -> bool:
        """One round of every step; True if every one is done (False: try again soon). The
        certificate's failure is raised; the others' are logged."""
        await self.sync_certificate()
        done = True
        try:
            done = await self.patch_configurations(self.ca_bundle)
        except KubeApiError as exc:
            log.warning("setting caBundle of %s failed: %s", self._options.configuration, exc)
            done = False
        try:
            await self.ensure_nats_users()
        except KubeApiError as exc:
            log.warning("making sure Secret %s exists failed: %s", self._options.nats_users_secret, exc)
            done = False
        return done

    async def start(self, stopping: asyncio.Event) -> bool:
        """The first round, tried until the certificate is in the files (True) or ``stopping``
        is set (False). Files that cannot be written (OSError) are not tried again."""
        delay = RETRY_FIRST
        while not stopping.is_set():
            try:
                self._pending = not await self.sync()
                return True
            except (KubeApiError, SelfManagedError) as exc:
                log.error("the serving certificate is not ready yet: %s; trying again in %.0fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            delay = min(delay * 2, CHECK_PERIOD)
        return False

    async def run(self, stopping: asyncio.Event) -> None:
        """Every :data:`CHECK_PERIOD` (sooner after a failure), another round, until ``stopping``."""
        retry = RETRY_FIRST
        delay = retry if self._pending else CHECK_PERIOD
        while not stopping.is_set():
            # Jitter, so that replicas started together do not keep asking together.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay * random.uniform(0.9, 1.1))
            if stopping.is_set():
                return
            try:
                ok = await self.sync()
            except (KubeApiError, SelfManagedError, OSError) as exc:
                log.error("keeping the serving certificate failed: %s", exc)
                ok = False
            if ok:
                delay, retry = CHECK_PERIOD, RETRY_FIRST
            else:
                delay, retry = retry, min(retry * 2, CHECK_PERIOD)
