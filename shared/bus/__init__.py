"""The one adapter between Respawn's services and NATS JetStream: nothing else imports ``nats``.

Everything a service does on the bus goes through :class:`Bus`:

- set-up at start, idempotent and safe to race with other replicas: the streams of
  docs/messages.md (:meth:`Bus.ensure_streams`) and durable pull consumers
  (:meth:`Bus.ensure_consumer`);
- :meth:`Bus.publish` of a :class:`shared.messages.Message` with a ``Nats-Msg-Id`` for
  de-duplication, the schema header, the W3C trace context (and a ``Nats-TTL`` for
  tombstones), encoded by :mod:`shared.messages` (a public message in the deployment's
  ``public_encoding``, with the ``content-type`` and CloudEvents headers that go with it); a
  message that can never be published (too large, invalid subject, no permission) fails at
  once with :class:`PermanentPublishError`, and :meth:`Bus.dead_letter` records it instead;
- :meth:`Bus.consume`, a supervised pull loop that acks a message only after its handler
  returned, naks it (with a delay) when the handler asks to be retried, and moves what can
  never be processed to ``respawn.deadletter.<service>`` instead of crashing or looping;
- :meth:`Bus.replay`, the same loop over a consumer of the service's own run, which loads a
  stream into memory, says when that is done, and then follows the stream.

The connection reconnects forever with exponential backoff, over TLS when configured;
consumers re-bind after every reconnect, and a stream or durable lost with the server's store
is created again from its spec. Every stream is bounded, and a limit an operator made stricter
is never loosened.

Modules, each for one thing: ``connection`` (connect, reconnect), ``streams`` (what the streams
are, creating them), ``publish``, ``consume`` (the pull loop), ``replay`` (load, then follow),
``delivery`` (what a handler gets), ``deadletter`` and ``headers`` (what goes on the wire),
``backoff`` (every delay), ``errors``, and ``bus`` (the :class:`Bus` that ties them together).
"""

from shared.bus.backoff import error_delay, until_done
from shared.bus.bus import Bus
from shared.bus.connection import TlsFiles, redact, redact_url
from shared.bus.consume import Consumer, DeliverPolicy
from shared.bus.deadletter import (
    DL_CONSUMER_HEADER,
    DL_DELIVERIES_HEADER,
    DL_ERROR_HEADER,
    DL_INVALID,
    DL_INVALID_SUBJECT,
    DL_MAX_DELIVERIES,
    DL_MAX_ERRORS,
    DL_OBJECT_KIND_HEADER,
    DL_OBJECT_NAME_HEADER,
    DL_OBJECT_NAMESPACE_HEADER,
    DL_OBJECT_RESOURCE_VERSION_HEADER,
    DL_OBJECT_UID_HEADER,
    DL_PERMISSION,
    DL_REASON_HEADER,
    DL_REJECTED,
    DL_SEQUENCE_HEADER,
    DL_SERVICE_HEADER,
    DL_STREAM_HEADER,
    DL_SUBJECT_HEADER,
    DL_TOO_LARGE,
    DL_TRUNCATED_HEADER,
    DL_UNSUPPORTED_VERSION,
)
from shared.bus.delivery import Delivery, Handler
from shared.bus.errors import BusError, PermanentPublishError, TransientError
from shared.bus.headers import MSG_ID_HEADER, TRACEPARENT_HEADER, TTL_HEADER
from shared.bus.publish import Published
from shared.bus.replay import Replay, replay_consumer_name
from shared.bus.streams import (
    DEFAULT_LIMITS,
    LIFECYCLE_HISTORY,
    VERDICT_HISTORY,
    StreamLimits,
    StreamSpec,
    default_streams,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DL_CONSUMER_HEADER",
    "DL_DELIVERIES_HEADER",
    "DL_ERROR_HEADER",
    "DL_INVALID",
    "DL_INVALID_SUBJECT",
    "DL_MAX_DELIVERIES",
    "DL_MAX_ERRORS",
    "DL_OBJECT_KIND_HEADER",
    "DL_OBJECT_NAMESPACE_HEADER",
    "DL_OBJECT_NAME_HEADER",
    "DL_OBJECT_RESOURCE_VERSION_HEADER",
    "DL_OBJECT_UID_HEADER",
    "DL_PERMISSION",
    "DL_REASON_HEADER",
    "DL_REJECTED",
    "DL_SEQUENCE_HEADER",
    "DL_SERVICE_HEADER",
    "DL_STREAM_HEADER",
    "DL_SUBJECT_HEADER",
    "DL_TOO_LARGE",
    "DL_TRUNCATED_HEADER",
    "DL_UNSUPPORTED_VERSION",
    "LIFECYCLE_HISTORY",
    "MSG_ID_HEADER",
    "TRACEPARENT_HEADER",
    "TTL_HEADER",
    "VERDICT_HISTORY",
    "Bus",
    "BusError",
    "Consumer",
    "DeliverPolicy",
    "Delivery",
    "Handler",
    "PermanentPublishError",
    "Published",
    "Replay",
    "StreamLimits",
    "StreamSpec",
    "TlsFiles",
    "TransientError",
    "default_streams",
    "error_delay",
    "redact",
    "redact_url",
    "replay_consumer_name",
    "until_done",
]
