"""NATS accounts, users and subject permissions: one user per service, one account per outside reader.

Every service connects as its own user in the account ``RESPAWN`` and may publish only what it
produces (the watcher observations, health verdicts, lifecycle lifecycle events, autopilot node
verdicts), plus the JetStream API requests, acks and dead letters of what it consumes (the
watcher's dead letters: objects it could not publish). The
permissions are derived from what :mod:`shared.bus` and the services actually send (see
:data:`_BUS`); ``tests/integration/test_nats_permissions.py`` proves them on a real server.

- **Consumers.** A service may create, read, pull from and ack only consumers under its own
  names. Fixed durable names (lifecycle's) appear literally in its permissions and are denied to
  every other user; a service that names its consumers afresh on every start
  (:func:`shared.bus.replay_consumer_name`) gets a ``*`` for the name, pinned to its filter
  subject, with the other services' fixed durables denied.
- **Streams.** Every service may look up and create every stream (``Bus.ensure_streams`` runs in
  each at start, so they can start in any order), but only a stream's one owner
  (:data:`STREAM_OWNERS`) may update its configuration. No user may delete or purge a stream.
- **Replicas.** The replicas of every service find each other in the KV bucket
  ``RESPAWN_MEMBERS`` (:class:`shared.bus.membership.Membership`, stream :data:`MEMBERS_STREAM`):
  a service may write only its own group's keys (``$KV.RESPAWN_MEMBERS.<service>.>``), and every
  service may watch the bucket.
- **Outside readers** do not live in the ``RESPAWN`` account at all. Each has an account of its
  own that holds *mirrors* of the public streams (:func:`mirror_stream_config`, created once by
  ``python -m respawn.natsauth mirrors``): the ``RESPAWN`` account exports to it only what a
  mirror needs (the legacy consumer-create request of each public stream, its flow-control
  replies, and a delivery subject private to that reader). A reader's JetStream requests are
  therefore answered by its own account; whatever they carry, they cannot address a consumer or a
  stream of Respawn's. (Within one account that is not possible: nats-server honours a consumer
  name carried in the body of ``$JS.API.CONSUMER.CREATE.<stream>``, so a user allowed even
  ephemeral consumers could rewrite a service's durable by naming it there.)

The rules and the rendering are pure functions. :func:`render_auth_config` builds the server's
``accounts`` block with passwords as ``$NATS_PASSWORD_<USER>`` references, which nats-server
resolves from its own environment, so the generated file can be committed and reviewed while
the passwords live only in a Kubernetes Secret (:func:`render_secret`). Only
:func:`generate_password`, :func:`ensure_mirrors` and :func:`main`
(``python -m respawn.natsauth config|secret|env|mirrors``) touch randomness, the network or output.

Known limits, which NATS permissions cannot express more tightly:
- consumer names are single tokens and cannot be matched by prefix, so health and autopilot, whose
  per-run consumer names are random, may each address the other's per-run consumers on the
  observation stream (never lifecycle's durables, which are denied by name);
- services share the ``_INBOX.>`` reply space with each other;
- the watch of the members bucket is an ordered consumer that nats-py creates with the legacy
  request (its name in the body), which permissions cannot pin to a name or a filter: a service
  could rewrite another's watch consumer on that bucket, so that its replicas miss their peers
  for a while (each then judges more than its share, and verdicts are de-duplicated), but never
  write another group's keys;
- a reader's flow-control replies for its own ordered consumers also reach the ``RESPAWN``
  account (the subjects are the same); a flow-control reply can only let a push consumer send on.

No user may subscribe to a stream's own subjects: reading goes through consumers, which deliver
to the reader's inbox. A plain subscription would give a push consumer the interest it needs to
deliver into that subject, which another stream may capture: a way to write without publishing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared import subjects
from shared.bus import StreamSpec, default_streams
from shared.bus.membership import MEMBERS_BUCKET, MEMBERS_STREAM
from shared.messages import QUARANTINE_RESOURCE
from shared.natsusers import PASSWORD_PATTERN as _PASSWORD
from shared.natsusers import SECRET_NAME, SERVICES, SUBSCRIBER, generate_password

__all__ = [
    "ACCOUNT",
    "MEMBERS_STREAM",
    "MIRROR_API_PREFIX",
    "PUBLIC_STREAMS",
    "SECRET_NAME",
    "SERVICES",
    "SERVICE_INBOX_PREFIX",
    "STREAM_OWNERS",
    "SUBSCRIBER",
    "MirrorError",
    "Permissions",
    "User",
    "default_users",
    "ensure_mirrors",
    "generate_password",
    "inbox_prefix",
    "lifecycle_durables",
    "main",
    "mirror_deliver_prefix",
    "mirror_stream_config",
    "password_variable",
    "reader_account",
    "render_auth_config",
    "render_env_file",
    "render_secret",
    "service_permissions",
    "service_user",
    "subject_matches",
    "subscriber_permissions",
    "subscriber_user",
    "validate_password",
]

ACCOUNT = "RESPAWN"
SERVICE_INBOX_PREFIX = "_INBOX"
PUBLIC_STREAMS = (subjects.VERDICTS_STREAM, subjects.LIFECYCLE_STREAM)
ALL_STREAMS = (
    subjects.OBSERVATIONS_STREAM,
    subjects.VERDICTS_STREAM,
    subjects.NODE_VERDICTS_STREAM,
    subjects.LIFECYCLE_STREAM,
    subjects.DEAD_LETTER_STREAM,
)
# The one user that may change each stream's configuration: the stream's owner in the bus's own
# specs (shared.bus.StreamSpec.owner), the service that produces into it.
STREAM_OWNERS: Mapping[str, str] = {s.name: s.owner.removeprefix("respawn-") for s in default_streams()}


def lifecycle_durables() -> list[tuple[str, str, str]]:
    """(stream, durable, filter) of lifecycle's durable consumers (services/lifecycle/shares.py):
    one per partition of the verdicts, bound by whichever replica owns the partition. There are
    ``scaling.partitions`` of them (``--partitions``; consumer names cannot be matched by prefix,
    so each is named)."""
    return [
        (
            subjects.VERDICTS_STREAM,
            subjects.lifecycle_verdict_durable(p),
            subjects.verdict_partition_filter(p),
        )
        for p in range(subjects.partitions())
    ]


# Where a reader account sees the RESPAWN account's consumer-create API (its import's prefix).
MIRROR_API_PREFIX = "$JS.RESPAWN.API"
# JetStream limits of a reader account: its two mirrors (64 messages per AppWrapper and subject,
# 30 days; about 0.3 GB each at 10,000 AppWrappers) and the state of its own consumers.
READER_JETSTREAM = {"max_file": "2G", "max_mem": "64M", "max_streams": 2, "max_consumers": 128}

_API = "$JS.API"
_USER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")


# ------------------------------------------------------------------ subjects


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS would let ``pattern`` (with ``*`` and ``>``) cover ``subject``.

    Tokens of ``subject`` are compared literally, as the server does for permissions, so a
    subject that itself contains ``*`` is only covered by a wildcard or that same token.
    """
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(want) == len(have)


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to; everything else is denied.

    ``publish_deny`` wins over ``publish`` (as in nats-server): it carves other users' consumers
    out of a wildcard.
    """

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()

    def may_publish(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.publish) and not any(
            subject_matches(p, subject) for p in self.publish_deny
        )

    def may_subscribe(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subscribe)


@dataclass(frozen=True)
class User:
    name: str
    permissions: Permissions
    account: str = ACCOUNT

    @property
    def password_variable(self) -> str:
        return password_variable(self.name)


@dataclass(frozen=True)
class _Reads:
    """A consumer a service keeps on ``stream``."""

    stream: str
    filter_subject: str
    # A fixed durable name, or None: a new name on every start (shared.bus.replay_consumer_name).
    durable: str | None = None
    # Whether the service deletes it itself on shutdown rather than leaving it to expire.
    deletes: bool = False


@dataclass(frozen=True)
class _ServiceBus:
    """What one service does on the bus (see each service's ``run``)."""

    publishes: tuple[str, ...]
    reads: tuple[_Reads, ...] = ()
    # Dead-letters objects it cannot publish (Bus.dead_letter) though it consumes nothing.
    dead_letters: bool = False


def _any_partition(partition_filter: Callable[[int], str]) -> str:
    """A per-partition filter subject (its partition is its last token) for whichever partition:
    a consumer-create request names the filter of one partition, which ``*`` covers."""
    return partition_filter(0).rsplit(".", 1)[0] + ".*"


_OBS = subjects.OBSERVATIONS_STREAM
_BUS: Mapping[str, _ServiceBus] = {
    # The watcher dead-letters an object it cannot publish (too large, too deep, untranslatable).
    "watcher": _ServiceBus(publishes=(f"{subjects.OBS_PREFIX}.>",), dead_letters=True),
    "health": _ServiceBus(
        publishes=(subjects.verdict_filter(),),
        reads=(
            # Per-run replay consumers (Bus.replay), one per partition a replica owns: each
            # replays its partitions' observations into memory, and removes its consumers when it
            # stops or lets go of a partition rather than leaving them to expire.
            _Reads(_OBS, _any_partition(subjects.appwrapper_obs_partition_filter), deletes=True),
            _Reads(subjects.NODE_VERDICTS_STREAM, subjects.node_verdict_filter(), deletes=True),
            # The last verdict per AppWrapper of a partition, read when the partition is taken so
            # none is published twice.
            _Reads(subjects.VERDICTS_STREAM, _any_partition(subjects.verdict_partition_filter), deletes=True),
        ),
    ),
    # lifecycle's reads depend on the partition count: see _bus().
    "lifecycle": _ServiceBus(publishes=(subjects.lifecycle_filter(),)),
    "autopilot": _ServiceBus(
        publishes=(subjects.node_verdict_filter(),),
        # Per-run replay consumers (Bus.replay), removed when it stops rather than left to expire.
        reads=(
            _Reads(_OBS, subjects.node_obs_filter(), deletes=True),
            # The stored node verdicts (the last per resource), replayed at start.
            _Reads(subjects.NODE_VERDICTS_STREAM, subjects.node_verdict_filter(), deletes=True),
            # Node quarantine counts the nodes the verdicts blame.
            _Reads(subjects.VERDICTS_STREAM, subjects.verdict_filter(), deletes=True),
        ),
    ),
}


def _stream_setup(service: str) -> list[str]:
    # Bus.ensure_streams: info first, create when missing, update when the config drifted; only
    # the owner may update, so a stream's configuration has one writer.
    subjects_ = []
    for stream in ALL_STREAMS:
        subjects_ += [f"{_API}.STREAM.INFO.{stream}", f"{_API}.STREAM.CREATE.{stream}"]
        if STREAM_OWNERS[stream] == service:
            subjects_.append(f"{_API}.STREAM.UPDATE.{stream}")
    return subjects_


def _membership(service: str) -> list[str]:
    """What :class:`shared.bus.membership.Membership` sends for the replicas of ``service``: each
    heartbeats under its own group's keys of the KV bucket and watches the bucket's keys."""
    return [
        # The bucket is a stream, looked up at start and created by whichever replica of whichever
        # service comes first; never updated.
        f"{_API}.STREAM.INFO.{MEMBERS_STREAM}",
        f"{_API}.STREAM.CREATE.{MEMBERS_STREAM}",
        # A heartbeat (put) and a clean stop (delete) are publishes to the key's subject: only
        # the service's own group, so no service can make another's replicas look alive or dead.
        f"$KV.{MEMBERS_BUCKET}.{service}.>",
        # The watch: a push consumer without a name, which nats-py creates in the legacy form
        # (no name in the subject), asks for its state and deletes; it delivers to an inbox.
        f"{_API}.CONSUMER.CREATE.{MEMBERS_STREAM}",
        f"{_API}.CONSUMER.INFO.{MEMBERS_STREAM}.*",
        f"{_API}.CONSUMER.DELETE.{MEMBERS_STREAM}.*",
    ]


def _consumer_ops(stream: str, name: str, *, deletes: bool) -> list[str]:
    ops = [
        f"{_API}.CONSUMER.INFO.{stream}.{name}",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.{name}",
        f"$JS.ACK.{stream}.{name}.>",
    ]
    if deletes:
        ops.append(f"{_API}.CONSUMER.DELETE.{stream}.{name}")
    return ops


def _pull_consumer(reads: _Reads) -> list[str]:
    name = reads.durable or "*"
    # nats-py names the consumer (and its single filter subject) in the create subject when the
    # config has a name, which Bus.consume always sets; the legacy forms are never needed.
    create = f"{_API}.CONSUMER.CREATE.{reads.stream}.{name}.{reads.filter_subject}"
    return [create, *_consumer_ops(reads.stream, name, deletes=reads.deletes)]


def _durable_denials(stream: str, durable: str) -> list[str]:
    """Every request that could address consumer ``durable`` of ``stream`` by its name."""
    return [
        f"{_API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{_API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"{_API}.CONSUMER.DELETE.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _fixed_durables(exclude: str) -> list[tuple[str, str]]:
    """(stream, durable) of every other service's fixed durables."""
    return [
        (reads.stream, reads.durable)
        for service, bus in ((s, _bus(s)) for s in _BUS)
        if service != exclude
        for reads in bus.reads
        if reads.durable is not None
    ]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _bus(service: str) -> _ServiceBus:
    bus = _BUS[service]
    if service != "lifecycle":
        return bus
    reads = (
        *(_Reads(stream, filter_, durable=durable) for stream, durable, filter_ in lifecycle_durables()),
        # The quarantined nodes, kept off by every pod it creates (a per-run replay consumer).
        _Reads(subjects.NODE_VERDICTS_STREAM, subjects.node_verdict(QUARANTINE_RESOURCE), deletes=True),
    )
    return _ServiceBus(publishes=bus.publishes, reads=reads, dead_letters=bus.dead_letters)


def service_permissions(service: str) -> Permissions:
    """What ``service`` may publish and subscribe to (``service`` is one of :data:`SERVICES`)."""
    try:
        bus = _bus(service)
    except KeyError:
        raise ValueError(f"unknown service {service!r}; expected one of {', '.join(SERVICES)}") from None
    publish = [*bus.publishes, *_stream_setup(service), *_membership(service)]
    for reads in bus.reads:
        publish += _pull_consumer(reads)
    if bus.reads or bus.dead_letters:
        # Bus.consume moves what can never be processed here, and Bus.dead_letter what could
        # never be published (the bus names itself respawn-<service>).
        publish.append(subjects.dead_letter(f"respawn-{service}"))
    # A "*" consumer name would also cover another service's durable on the same stream.
    wildcard = {r.stream for r in bus.reads if r.durable is None}
    deny = [
        subject
        for stream, durable in _fixed_durables(service)
        if stream in wildcard
        for subject in _durable_denials(stream, durable)
    ]
    # Consumers deliver to the reply inbox, so no subscription to a stream's subjects is needed,
    # and none is granted: with one, a user could create a push consumer that delivers into a
    # subject captured by another stream, and so write where it may not publish.
    return Permissions(
        publish=_unique(publish), subscribe=(f"{SERVICE_INBOX_PREFIX}.>",), publish_deny=_unique(deny)
    )


# ------------------------------------------------------------------ outside readers


def inbox_prefix(user: str) -> str:
    """A private reply prefix an outside reader's client may use (``_INBOX`` works as well)."""
    return f"_INBOX_{user}"


def reader_account(user: str) -> str:
    """The account of outside reader ``user``: its mirrors of the public streams live there."""
    return "READER_" + _check_name(user).upper().replace("-", "_")


def mirror_deliver_prefix(user: str) -> str:
    """The subject prefix under which the RESPAWN account delivers ``user``'s mirrored messages."""
    return f"respawn.mirror.{_check_name(user)}"


def subscriber_permissions(user: str = SUBSCRIBER, streams: Sequence[str] = PUBLIC_STREAMS) -> Permissions:
    """What outside reader ``user`` may do, all of it inside its own account.

    There it keeps its mirrors of ``streams`` (same names as in Respawn's account, so tools such
    as ``respawn tail`` work unchanged) and consumers of its own on them, of any kind. Nothing it
    publishes reaches the RESPAWN account except flow-control replies: the consumer-create
    requests of its mirrors are made by the server, not by the user. It cannot publish a
    message anywhere, purge its mirrors, or create any other stream.
    """
    unknown = [s for s in streams if s not in PUBLIC_STREAMS]
    if unknown:
        raise ValueError(f"only the public streams can be opened to subscribers, not {', '.join(unknown)}")
    publish = [
        f"{_API}.INFO",  # account limits and usage; clients such as the nats CLI ask for it
        f"{_API}.STREAM.NAMES",  # `respawn explain` looks up which streams the account has
        f"{_API}.STREAM.LIST",
    ]
    for stream in streams:
        publish += [
            # Its mirror: created (and fixed, or recreated) by `python -m respawn.natsauth mirrors`.
            f"{_API}.STREAM.INFO.{stream}",
            f"{_API}.STREAM.CREATE.{stream}",
            f"{_API}.STREAM.UPDATE.{stream}",
            f"{_API}.STREAM.DELETE.{stream}",
            f"{_API}.STREAM.MSG.GET.{stream}",
            f"{_API}.DIRECT.GET.{stream}",
            f"{_API}.DIRECT.GET.{stream}.>",
            # Its own consumers on the mirror, ephemeral or durable.
            f"{_API}.CONSUMER.CREATE.{stream}",
            f"{_API}.CONSUMER.CREATE.{stream}.>",
            f"{_API}.CONSUMER.DURABLE.CREATE.{stream}.*",
            f"{_API}.CONSUMER.INFO.{stream}.*",
            f"{_API}.CONSUMER.NAMES.{stream}",
            f"{_API}.CONSUMER.LIST.{stream}",
            f"{_API}.CONSUMER.DELETE.{stream}.*",
            f"{_API}.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.ACK.{stream}.>",
            f"$JS.FC.{stream}.>",
        ]
    # Only inboxes: a subscription to stream subjects is never needed (and in this account no
    # stream captures any, since mirrors take no subjects).
    return Permissions(
        publish=_unique(publish), subscribe=(f"{SERVICE_INBOX_PREFIX}.>", f"{inbox_prefix(user)}.>")
    )


def _check_name(name: str) -> str:
    if not _USER_NAME.match(name):
        raise ValueError(
            f"user name {name!r} must start with a lowercase letter and hold only a-z, 0-9 and '-'"
        )
    return name


def service_user(service: str) -> User:
    return User(name=service, permissions=service_permissions(service))


def subscriber_user(name: str = SUBSCRIBER) -> User:
    if name in SERVICES:
        raise ValueError(f"subscriber name {name!r} is taken by a service")
    return User(
        name=_check_name(name), permissions=subscriber_permissions(name), account=reader_account(name)
    )


def default_users(subscribers: Sequence[str] = (SUBSCRIBER,)) -> list[User]:
    """The four service users, then one read-only user (in its own account) per outside reader."""
    users = [service_user(s) for s in SERVICES] + [subscriber_user(n) for n in subscribers]
    names = [u.name for u in users]
    if len(set(names)) != len(names):
        raise ValueError(f"user names must be unique: {', '.join(names)}")
    return users


def _mirror_exports(readers: Sequence[str]) -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, subject, accounts) the RESPAWN account exports so that ``readers`` can mirror."""
    accounts = tuple(reader_account(r) for r in readers)
    exports: list[tuple[str, str, tuple[str, ...]]] = []
    for stream in PUBLIC_STREAMS:
        # The request a mirror sends to create its consumer (legacy form: the name, chosen by
        # the server as JS_MIRROR_<hash>, travels in the body), and the flow-control replies.
        exports.append(("service", f"{_API}.CONSUMER.CREATE.{stream}", accounts))
        exports.append(("service", f"$JS.FC.{stream}.>", accounts))
    for reader in readers:
        exports.append(("stream", f"{mirror_deliver_prefix(reader)}.>", (reader_account(reader),)))
    return exports


def _mirror_imports(reader: str) -> list[tuple[str, str, str | None]]:
    """(kind, subject in RESPAWN, local subject or None) that ``reader``'s account imports."""
    imports: list[tuple[str, str, str | None]] = []
    for stream in PUBLIC_STREAMS:
        create = f"{_API}.CONSUMER.CREATE.{stream}"
        # Under another prefix: the reader's own $JS.API requests must reach its own account.
        imports.append(("service", create, MIRROR_API_PREFIX + create.removeprefix(_API)))
        imports.append(("service", f"$JS.FC.{stream}.>", None))
    imports.append(("stream", f"{mirror_deliver_prefix(reader)}.>", None))
    return imports


# ------------------------------------------------------------------ rendering


def password_variable(user: str) -> str:
    """The environment variable of nats-server that holds ``user``'s password."""
    return "NATS_PASSWORD_" + _check_name(user).upper().replace("-", "_")


def _subject_list(key: str, subjects_: Iterable[str], indent: int) -> list[str]:
    # JSON strings are valid NATS configuration strings, and quoting keeps "$JS..." literal.
    pad = " " * indent
    return [f"{pad}{key}: [", *(f"{pad}  {json.dumps(s)}" for s in subjects_), f"{pad}]"]


def _permission_block(what: str, allow: Sequence[str], deny: Sequence[str]) -> list[str]:
    lines = [f"          {what}: {{", *_subject_list("allow", allow, 12)]
    if deny:
        lines += _subject_list("deny", deny, 12)
    return [*lines, "          }"]


def _user_block(user: User, passwords: Mapping[str, str] | None) -> list[str]:
    if passwords is not None:
        password = json.dumps(validate_password(user.name, passwords[user.name]))
    else:
        password = "$" + user.password_variable
    return [
        "      {",
        f"        user: {json.dumps(user.name)}",
        f"        password: {password}",
        "        permissions: {",
        *_permission_block("publish", user.permissions.publish, user.permissions.publish_deny),
        *_permission_block("subscribe", user.permissions.subscribe, ()),
        "        }",
        "      }",
    ]


def render_auth_config(
    users: Sequence[User],
    *,
    account: str = ACCOUNT,
    passwords: Mapping[str, str] | None = None,
) -> str:
    """The nats-server ``accounts`` block: Respawn's account with the service users, and one
    account per outside reader, with what each needs to mirror the public streams.

    Passwords are ``$NATS_PASSWORD_<USER>`` references unless ``passwords`` gives them
    literally (for a test server; never commit such a file).
    """
    services = [u for u in users if u.account == ACCOUNT]
    readers = [u for u in users if u.account != ACCOUNT]
    lines = [
        "# NATS accounts and users of Respawn and their subject permissions.",
        "# Generated by `python -m respawn.natsauth config`; edit respawn/natsauth.py, not this file.",
        "# Passwords come from the server's environment (the respawn-nats-users Secret).",
        "accounts {",
        f"  {account} {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for user in services:
        lines += _user_block(user, passwords)
    lines.append("    ]")
    if readers:
        lines += [
            "    # Only what the outside readers' mirrors of the public streams need, each reader's",
            "    # delivery subject to that reader alone.",
            "    exports: [",
        ]
        for kind, subject, allowed in _mirror_exports([u.name for u in readers]):
            lines.append(f"      {{{kind}: {json.dumps(subject)}, accounts: {json.dumps(list(allowed))}}}")
        lines.append("    ]")
    lines.append("  }")
    for user in readers:
        limits = ", ".join(f"{key}: {value}" for key, value in READER_JETSTREAM.items())
        lines += [
            f"  # Outside reader {user.name}: mirrors of {', '.join(PUBLIC_STREAMS)}, nothing else.",
            f"  {user.account} {{",
            f"    jetstream: {{{limits}}}",
            "    users: [",
            *_user_block(user, passwords),
            "    ]",
            "    imports: [",
        ]
        for kind, subject, local in _mirror_imports(user.name):
            source = f"{{account: {json.dumps(account)}, subject: {json.dumps(subject)}}}"
            mapped = f", to: {json.dumps(local)}" if local else ""
            lines.append(f"      {{{kind}: {source}{mapped}}}")
        lines += ["    ]", "  }"]
    lines += ["}", ""]
    return "\n".join(lines)


def validate_password(user: str, password: str) -> str:
    if not _PASSWORD.match(password):
        raise ValueError(
            f"the password of {user!r} must be at least 24 characters of A-Z, a-z, 0-9, '-' and '_', "
            "starting with a letter (nats-server would read other values as numbers or booleans)"
        )
    return password


def render_secret(passwords: Mapping[str, str], *, namespace: str, name: str = SECRET_NAME) -> str:
    """A Secret holding each user's password under the user's name (JSON, which is valid YAML)."""
    data = {
        user: base64.b64encode(validate_password(user, pw).encode()).decode()
        for user, pw in sorted(passwords.items())
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "respawn", "app.kubernetes.io/component": "nats"},
        },
        "type": "Opaque",
        "data": data,
    }
    return json.dumps(secret, indent=2) + "\n"


def render_env_file(passwords: Mapping[str, str]) -> str:
    """``user=password`` lines, for ``kubectl create secret generic --from-env-file``."""
    return "".join(f"{user}={validate_password(user, pw)}\n" for user, pw in sorted(passwords.items()))


# ------------------------------------------------------------------ a reader's mirrors


class MirrorError(RuntimeError):
    """The mirrors could not be set up; the message names the cause and the fix."""


def _public_specs() -> list[StreamSpec]:
    return [spec for spec in default_streams() if spec.name in PUBLIC_STREAMS]


def mirror_stream_config(spec: StreamSpec, reader: str, *, replicas: int = 1) -> Any:
    """The stream in ``reader``'s account that mirrors Respawn's stream ``spec`` (a nats-py
    ``StreamConfig``), under the same name and with the same limits: a mirror applies limits of
    its own, so without them it would keep what the source has long discarded."""
    from nats.js import api

    return api.StreamConfig(
        name=spec.name,
        description=f"Mirror of {spec.name} of account {ACCOUNT}",
        mirror=api.StreamSource(
            name=spec.name,
            external=api.ExternalStream(api=MIRROR_API_PREFIX, deliver=mirror_deliver_prefix(reader)),
        ),
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.OLD,
        num_replicas=replicas,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_age=spec.max_age,
        max_msgs=spec.max_msgs,
    )


def _is_our_mirror(config: Any, spec: StreamSpec, reader: str) -> bool:
    mirror = getattr(config, "mirror", None)
    external = getattr(mirror, "external", None)
    return (
        mirror is not None
        and mirror.name == spec.name
        and external is not None
        and external.api == MIRROR_API_PREFIX
        and external.deliver == mirror_deliver_prefix(reader)
    )


async def ensure_mirrors(nc: Any, reader: str, *, replicas: int = 1, settle: float = 10.0) -> list[str]:
    """Create ``reader``'s mirrors of the public streams where missing, on connection ``nc`` (as
    that reader). Returns one line per stream; raises :class:`MirrorError`.

    A new mirror is watched for up to ``settle`` seconds, so that a mirror the server cannot feed
    (a stale auth.conf without this reader's exports and imports) is reported here rather than
    found empty later.
    """
    import nats.errors
    import nats.js.errors

    js = nc.jetstream(timeout=5.0)
    try:
        reply = await nc.request(f"{_API}.STREAM.NAMES", b"{}", timeout=5.0)
    except (TimeoutError, nats.errors.NoRespondersError):
        # With NATS auth, a request the user may not make goes unanswered.
        raise MirrorError(
            f"no answer to a stream lookup as {reader!r}: is it an outside reader's user "
            "(python -m respawn.natsauth config --subscriber NAME) on a server running that auth.conf?"
        ) from None
    present = set(json.loads(reply.data).get("streams") or [])
    internal = sorted(present.intersection(ALL_STREAMS).difference(PUBLIC_STREAMS))
    if internal:
        raise MirrorError(
            f"{reader!r} is a user of Respawn's own account (it holds {', '.join(internal)}); "
            "mirrors belong in an outside reader's account"
        )
    report = []
    for spec in _public_specs():
        info = await js.stream_info(spec.name) if spec.name in present else None
        if info is not None:
            if not _is_our_mirror(info.config, spec, reader):
                raise MirrorError(
                    f"stream {spec.name} in account {reader_account(reader)} is not a mirror of "
                    f"{ACCOUNT}'s {spec.name}; delete it (nats stream rm {spec.name}) and run this again"
                )
            report.append(f"{spec.name}: mirror in place ({info.state.messages} messages)")
            continue
        try:
            await js.add_stream(mirror_stream_config(spec, reader, replicas=replicas))
        except nats.js.errors.APIError as exc:
            raise MirrorError(f"cannot create the mirror {spec.name}: {exc.description or exc}") from exc
        report.append(f"{spec.name}: {await _settled(js, spec.name, reader, settle)}")
    return report


async def _settled(js: Any, stream: str, reader: str, within: float) -> str:
    """How the new mirror ``stream`` is doing once the server has fed it (or given up on it).

    ``active`` is the time since the mirror last heard from its source (-1: never). It starts
    counting with the answer to the consumer-create request, and then falls back every time a
    message or an idle heartbeat (about one a second) arrives. A mirror whose deliveries cannot
    reach it sees it only grow.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last = -1
    while True:
        info = await js.stream_info(stream)
        state = info.mirror
        active = state.active if state is not None and state.active is not None else -1
        if info.state.messages > 0 or 0 <= active < last:
            behind = f", {state.lag} behind" if state is not None and state.lag else ""
            return f"mirror created ({info.state.messages} messages{behind})"
        last = active
        error = getattr(state, "error", None) or {}
        description = str(error.get("description", "") if isinstance(error, Mapping) else error)
        if loop.time() >= deadline:
            if "not found" in description:
                # A fresh install whose services have not started yet: the mirror keeps trying.
                return f"mirror created; {ACCOUNT}'s {stream} does not exist yet, it is copied once it does"
            raise MirrorError(
                f"the mirror {stream} was created but received nothing from {ACCOUNT} within {within:g}s "
                f"({description or 'no delivery, not even a heartbeat'}); check that the NATS servers run "
                f"the auth.conf generated for reader {reader!r}"
            )
        await asyncio.sleep(0.2)


# ------------------------------------------------------------------ command line


async def _mirrors(url: str, user: str, password: str, replicas: int) -> list[str]:
    import nats

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc) or type(exc).__name__)

    try:
        async with asyncio.timeout(15):
            nc = await nats.connect(
                url,
                user=user,
                password=password,
                allow_reconnect=False,
                # One attempt (nats-py counts from 1; 0 would mean "forever").
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                connect_timeout=5,
                error_cb=on_error,
            )
    except Exception as exc:  # a timeout, OSError, NoServersError, an authorization error...
        detail = errors[-1] if errors else str(exc) or type(exc).__name__
        raise MirrorError(f"cannot connect to NATS at {url} as {user}: {detail}") from None
    try:
        return await ensure_mirrors(nc, user, replicas=replicas)
    finally:
        await nc.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m respawn.natsauth config|secret|env|mirrors`` (see docs/deploy.md)."""
    parser = argparse.ArgumentParser(prog="python -m respawn.natsauth", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    config = commands.add_parser("config", help="print the nats-server accounts block (auth.conf)")
    secret = commands.add_parser("secret", help="print a Secret with freshly generated passwords")
    env = commands.add_parser("env", help="print user=password lines with freshly generated passwords")
    mirrors = commands.add_parser(
        "mirrors",
        help="as an outside reader (password in NATS_PASSWORD), create its mirrors of the public streams",
    )
    for sub in (config, secret, env):
        sub.add_argument(
            "--subscriber",
            action="append",
            dest="subscribers",
            metavar="NAME",
            help=f"an outside subscriber's user name (repeatable; default: {SUBSCRIBER})",
        )
    config.add_argument(
        "--partitions",
        type=int,
        default=subjects.DEFAULT_PARTITIONS,
        metavar="N",
        help=f"the installation's scaling.partitions (default {subjects.DEFAULT_PARTITIONS}): lifecycle "
        "gets one durable consumer per partition",
    )
    secret.add_argument("--namespace", default="respawn-system")
    secret.add_argument("--name", default=SECRET_NAME)
    mirrors.add_argument("--url", default=os.environ.get("NATS_URL"), help="NATS server (default $NATS_URL)")
    mirrors.add_argument("--user", default=SUBSCRIBER, help=f"the reader's user (default {SUBSCRIBER})")
    mirrors.add_argument(
        "--replicas", type=int, default=1, choices=range(1, 6), metavar="1-5", help="replicas of each mirror"
    )
    args = parser.parse_args(argv)
    if args.command == "mirrors":
        # Not a flag: a password on the command line is visible to every process on the host.
        password = os.environ.get("NATS_PASSWORD", "")
        if not args.url or not password:
            print(
                "error: set NATS_PASSWORD (and NATS_URL or --url) to the reader's credentials",
                file=sys.stderr,
            )
            return 2
        try:
            for line in asyncio.run(_mirrors(args.url, args.user, password, args.replicas)):
                print(line)
        except MirrorError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        if args.command == "config":
            subjects.set_partitions(args.partitions)
        users = default_users(tuple(args.subscribers or (SUBSCRIBER,)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        sys.stdout.write(render_auth_config(users))
        return 0
    passwords = {u.name: generate_password() for u in users}
    if args.command == "secret":
        sys.stdout.write(render_secret(passwords, namespace=args.namespace, name=args.name))
    else:
        sys.stdout.write(render_env_file(passwords))
    return 0


if __name__ == "__main__":
    sys.exit(main())
