"""`respawn-webhook`: the AppWrapper admission webhooks over HTTPS.

Serves AdmissionReview v1 on ``/mutate-appwrapper`` (default queue and user labels) and
``/validate-appwrapper`` (the requesting user's right to create every wrapped kind, pod-set
paths, immutable user labels), plus ``/healthz``. The decisions are in ``admission.py``; this
module only moves JSON and asks the API server the SubjectAccessReviews.

The API server calls the webhook with ``failurePolicy: Fail``, so an answer must come back for
every request, however malformed: a validating request that cannot be judged is refused with a
message saying why, and a mutating one is let through unpatched (validation and the CRD's
schema still apply to it).

The serving certificate is re-read when its files change, so a rotated Secret (cert-manager
or by hand) takes effect without a restart. With ``--self-managed-cert`` the webhook makes and
renews the certificate itself, and sets the configurations' caBundle (``selfmanaged.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from services.webhook.admission import (
    AccessCheck,
    AccessResult,
    AdmissionResponse,
    Authorizer,
    ReviewError,
    TemplateLimits,
    decode_body,
    mutate,
    parse_review,
    refusal,
    review_body,
    subject_access_review,
    validate,
)
from services.webhook.selfmanaged import SelfManaged, SelfManagedOptions
from shared import natsusers
from shared.kube import Kube, KubeApiError
from shared.kube.client import split_api_version

# Named explicitly: run as `python -m`, __name__ would be "__main__" in every log line.
log = logging.getLogger("services.webhook.server")

MUTATE_PATH: Final = "/mutate-appwrapper"
VALIDATE_PATH: Final = "/validate-appwrapper"
HEALTH_PATH: Final = "/healthz"
SAR_PATH: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
DEFAULT_PORT: Final = 9443
DEFAULT_CERT_DIR: Final = Path("/etc/respawn-webhook/certs")
DEFAULT_CERT_SECRET: Final = "respawn-webhook-cert"
DEFAULT_SERVICE: Final = "respawn-webhook"
DEFAULT_CONFIGURATION: Final = "respawn-appwrapper"
# Where a pod's service account token puts the pod's namespace.
SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# An AppWrapper may be as large as etcd allows (about 1.5 MiB) and an UPDATE review carries
# two copies of it.
_MAX_REVIEW_BYTES: Final = 8 * 1024 * 1024
# The API server waits 10 s for an answer (timeoutSeconds); a body still arriving after this long
# comes from something else, which must not hold the connection open indefinitely.
_READ_TIMEOUT: Final = 8.0
# The API server gives a webhook 10 s by default; a SubjectAccessReview must come back well
# before that, so the answer can still name the failure.
_SAR_TIMEOUT: Final = 5.0
_CERT_POLL_SECONDS: Final = 10.0


class KubeAuthorizer:
    """Answers access checks with SubjectAccessReviews, resolving kinds through discovery."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    async def _resource(self, api_version: str, kind: str) -> tuple[str, str, str]:
        group, version = split_api_version(api_version)
        try:
            ref = await self._kube.resource(api_version, kind)
        except KubeApiError as exc:
            if not exc.not_found:
                raise
            # A kind the cluster does not serve: ask about every resource of its group, as
            # upstream does. Only someone allowed to create anything there passes, and the
            # creation itself would fail later anyway.
            return group, version, "*"
        return ref.group, ref.version, ref.plural

    async def __call__(self, check: AccessCheck) -> AccessResult:
        try:
            group, version, resource = await self._resource(check.api_version, check.kind)
            review = subject_access_review(check, group=group, version=version, resource=resource)
            answer = await self._kube.request("POST", SAR_PATH, body=review, request_timeout=_SAR_TIMEOUT)
        except KubeApiError as exc:
            log.warning("access check for %s %s failed: %s", check.api_version, check.kind, exc)
            return AccessResult(False, error=str(exc))
        status = answer.get("status") or {}
        if status.get("evaluationError"):
            # Some authorizer in the chain failed, but the chain still answered; that answer
            # stands (a failure never grants anything) and the error is left for operators.
            log.warning("access check for %s: %s", check.kind, status["evaluationError"])
        return AccessResult(status.get("allowed") is True)


def make_app(
    authorize: Authorizer, *, default_queue_name: str, limits: TemplateLimits = TemplateLimits()
) -> web.Application:
    """The webhook's routes; ``authorize`` answers the validating webhook's access checks."""

    async def read(request: web.Request) -> Any:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ReviewError(f"the body is larger than {_MAX_REVIEW_BYTES} bytes") from None
        except TimeoutError:
            raise ReviewError(f"the body did not arrive within {_READ_TIMEOUT:g}s") from None
        return decode_body(raw)

    async def mutate_handler(request: web.Request) -> web.Response:
        body: Any = None
        try:
            body = await read(request)
            review = parse_review(body)
            response = mutate(review, default_queue_name=default_queue_name)
        except ReviewError as exc:
            log.warning("mutating review not understood, admitted unchanged: %s", exc)
            response = AdmissionResponse(allowed=True)
        except Exception:
            log.exception("mutating review failed, admitted unchanged")
            response = AdmissionResponse(allowed=True)
        else:
            if response.patch:
                log.info(
                    "mutate %s %s/%s by %s: labels patched",
                    review.operation,
                    review.namespace,
                    review.name or "(generated)",
                    review.user.username,
                )
        return web.json_response(review_body(body, response))

    async def validate_handler(request: web.Request) -> web.Response:
        body: Any = None
        try:
            body = await read(request)
            review = parse_review(body)
            response = await validate(review, authorize, limits)
        except ReviewError as exc:
            log.warning("validating review refused: %s", exc)
            response = refusal(f"malformed admission review: {exc}")
        except Exception as exc:
            log.exception("validating review failed")
            response = AdmissionResponse(
                allowed=False, code=500, reason="InternalError", message=f"admission check failed: {exc!r}"
            )
        else:
            where = f"{review.namespace}/{review.name or '(generated)'}"
            if response.allowed:
                log.info("validate %s %s by %s: allowed", review.operation, where, review.user.username)
            else:
                log.info(
                    "validate %s %s by %s: denied: %s",
                    review.operation,
                    where,
                    review.user.username,
                    response.message,
                )
        return web.json_response(review_body(body, response))

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=_MAX_REVIEW_BYTES)
    app.router.add_post(MUTATE_PATH, mutate_handler)
    app.router.add_post(VALIDATE_PATH, validate_handler)
    app.router.add_get(HEALTH_PATH, health)
    return app


# ---------------------------------------------------------------------------------------------
# TLS


@dataclass
class ServingCert:
    """The serving certificate, reloaded into the same SSL context when its files change."""

    cert_file: Path
    key_file: Path

    def __post_init__(self) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(self.cert_file, self.key_file)
        self._stamp = self._files_stamp()

    def _files_stamp(self) -> tuple[tuple[int, int], ...]:
        stats = (self.cert_file.stat(), self.key_file.stat())
        return tuple((s.st_mtime_ns, s.st_size) for s in stats)

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed; a half-written pair keeps the old cert."""
        try:
            stamp = self._files_stamp()
            if stamp == self._stamp:
                return False
            # New handshakes use what the context holds; connections already open keep theirs.
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded (keeping the current one): %s", exc)
            return False
        self._stamp = stamp
        log.info("serving certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), _CERT_POLL_SECONDS)
            self.reload_if_changed()


# ---------------------------------------------------------------------------------------------
# Process


@dataclass(frozen=True)
class Options:
    host: str
    port: int
    cert_file: Path
    key_file: Path
    config: Path | None
    # None: the certificate files are made by someone else (a mounted Secret).
    self_managed: SelfManagedOptions | None = None


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _pod_namespace() -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except OSError:
        return ""


def parse_options(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> Options:
    environ = dict(os.environ) if env is None else env
    parser = argparse.ArgumentParser(
        prog="respawn-webhook", description="AppWrapper admission webhooks (mutating and validating)."
    )
    # Not RESPAWN_WEBHOOK_PORT: that is the service-link variable Kubernetes derives from a
    # Service named respawn-webhook ("tcp://10.0.0.7:443").
    parser.add_argument(
        "--host",
        default=environ.get("RESPAWN_WEBHOOK_LISTEN_ADDRESS", "0.0.0.0"),
        help="address to listen on (default all)",
    )
    parser.add_argument(
        "--port",
        type=int,
        # A string default goes through `type`, so a bad variable is a usage error, not a trace.
        default=environ.get("RESPAWN_WEBHOOK_LISTEN_PORT", str(DEFAULT_PORT)),
        help=f"HTTPS port (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--cert-file",
        type=Path,
        default=Path(environ.get("RESPAWN_WEBHOOK_CERT_FILE", DEFAULT_CERT_DIR / "tls.crt")),
        help="PEM serving certificate (chain)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        default=Path(environ.get("RESPAWN_WEBHOOK_KEY_FILE", DEFAULT_CERT_DIR / "tls.key")),
        help="PEM private key of the serving certificate",
    )
    parser.add_argument("--config", type=Path, default=None, help="operator configuration file")
    managed = parser.add_argument_group(
        "self-managed certificate",
        "the webhook makes and renews its own serving certificate (docs/webhooks.md)",
    )
    managed.add_argument(
        "--self-managed-cert",
        nargs="?",
        const=True,
        type=_flag,
        # A string default goes through `type`, so a bad variable is a usage error, not a trace.
        default=environ.get("RESPAWN_WEBHOOK_SELF_MANAGED_CERT", "false"),
        help="keep a CA and serving certificate in --cert-secret, write them to --cert-file and "
        "--key-file, and set the caBundle of the --configuration webhook configurations",
    )
    managed.add_argument(
        "--namespace",
        default=environ.get("RESPAWN_WEBHOOK_NAMESPACE") or _pod_namespace(),
        help="namespace of the Secrets and the Service (default: the pod's)",
    )
    managed.add_argument(
        "--cert-secret",
        default=environ.get("RESPAWN_WEBHOOK_CERT_SECRET", DEFAULT_CERT_SECRET),
        help=f"Secret that keeps the CA and the serving certificate (default {DEFAULT_CERT_SECRET})",
    )
    managed.add_argument(
        "--service-name",
        default=environ.get("RESPAWN_WEBHOOK_SERVICE_NAME", DEFAULT_SERVICE),
        help="Service the API server calls; the certificate names <service>.<namespace>.svc "
        f"(default {DEFAULT_SERVICE})",
    )
    managed.add_argument(
        "--cert-host",
        action="append",
        default=None,
        help="another DNS name or IP address for the certificate (repeatable)",
    )
    managed.add_argument(
        "--configuration",
        default=environ.get("RESPAWN_WEBHOOK_CONFIGURATION", DEFAULT_CONFIGURATION),
        help="name of the mutating and of the validating webhook configuration "
        f"(default {DEFAULT_CONFIGURATION})",
    )
    managed.add_argument(
        "--nats-users-secret",
        default=environ.get("RESPAWN_WEBHOOK_NATS_USERS_SECRET", ""),
        help=f"create this Secret with a random password per NATS user if it does not exist (usually "
        f"{natsusers.SECRET_NAME}; default: none)",
    )
    args = parser.parse_args(argv)
    self_managed = None
    if args.self_managed_cert:
        if not args.namespace:
            parser.error("--self-managed-cert needs --namespace (or RESPAWN_WEBHOOK_NAMESPACE) outside a pod")
        hosts = args.cert_host
        if hosts is None:
            hosts = [h.strip() for h in environ.get("RESPAWN_WEBHOOK_CERT_HOSTS", "").split(",")]
        self_managed = SelfManagedOptions(
            namespace=args.namespace,
            cert_secret=args.cert_secret,
            service=args.service_name,
            configuration=args.configuration,
            extra_hosts=tuple(h for h in hosts if h),
            nats_users_secret=args.nats_users_secret,
            cert_file=args.cert_file,
            key_file=args.key_file,
        )
    elif args.nats_users_secret:
        parser.error("--nats-users-secret is part of the self-managed mode: add --self-managed-cert")
    return Options(args.host, args.port, args.cert_file, args.key_file, args.config, self_managed)


async def serve(options: Options) -> int:
    from shared.config import ConfigError, load_config

    try:
        config = load_config(options.config)
    except ConfigError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    try:
        kube = await Kube.connect(config.kubeconfig)
    except Exception as exc:
        log.error("cannot configure Kubernetes access: %s", exc)
        return 2
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        return await _serve(options, config, kube, stopping)
    finally:
        await kube.close()


async def _serve(options: Options, config: Any, kube: Kube, stopping: asyncio.Event) -> int:
    managed = SelfManaged(kube, options.self_managed) if options.self_managed else None
    if managed is not None:
        try:
            if not await managed.start(stopping):
                return 0
        except OSError as exc:
            log.error("cannot write the serving certificate to %s: %s", options.cert_file, exc)
            return 2
    try:
        cert = ServingCert(options.cert_file, options.key_file)
    except (OSError, ssl.SSLError) as exc:
        log.error("cannot load the serving certificate %s / %s: %s", options.cert_file, options.key_file, exc)
        return 2
    limits = TemplateLimits(
        max_depth=config.admission.max_template_depth, max_bytes=config.admission.max_template_bytes
    )
    app = make_app(KubeAuthorizer(kube), default_queue_name=config.default_queue_name, limits=limits)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, options.host, options.port, ssl_context=cert.context)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s:%d: %s", options.host, options.port, exc)
            return 2
        log.info(
            "webhook serving on https://%s:%d (default queue %r, templates at most %d levels deep "
            "and %d bytes%s)",
            options.host,
            options.port,
            config.default_queue_name,
            limits.max_depth,
            limits.max_bytes,
            ", self-managed certificate" if managed else "",
        )
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(cert.watch(stopping))
            if managed is not None:
                tasks.create_task(managed.run(stopping))
    finally:
        log.info("webhook shutting down")
        await runner.cleanup()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    from shared.telemetry import TelemetryError, setup_telemetry

    options = parse_options(argv)
    try:
        telemetry = setup_telemetry("webhook")
    except TelemetryError as exc:
        log.error("invalid telemetry settings: %s", exc)
        sys.exit(2)
    try:
        code = asyncio.run(serve(options))
    finally:
        telemetry.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
