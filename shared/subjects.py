"""NATS subject names: the one place they are built.

Subjects are part of Respawn's public, versioned interface (see docs/messages.md).
Kubernetes names may contain dots, which NATS uses as the token separator, so every
name is escaped with :func:`token` before it becomes part of a subject.
"""

from __future__ import annotations

from shared.partitions import partition_of

SUBJECT_VERSION = "v1"

# How many partitions the AppWrappers are split into (``scaling.partitions``). Every process of
# one installation must use the same count: the publishers put the partition in the subject and
# the partition consumers filter on it. Readers that want one AppWrapper use a wildcard for it.
DEFAULT_PARTITIONS = 16
_partitions = DEFAULT_PARTITIONS


def set_partitions(count: int) -> None:
    """Use ``count`` partitions in this process (the services call it with their configuration)."""
    global _partitions
    if count < 1:
        raise ValueError(f"partition count must be at least 1, got {count}")
    _partitions = count


def partitions() -> int:
    return _partitions


def partition(namespace: str, appwrapper: str) -> int:
    """The partition the AppWrapper ``namespace/appwrapper`` belongs to (:mod:`shared.partitions`)."""
    return partition_of(namespace, appwrapper, _partitions)


# Streams (JetStream) and the subjects they capture.
OBSERVATIONS_STREAM = "RESPAWN_OBSERVATIONS"
VERDICTS_STREAM = "RESPAWN_VERDICTS"
NODE_VERDICTS_STREAM = "RESPAWN_NODE_VERDICTS"
LIFECYCLE_STREAM = "RESPAWN_LIFECYCLE"
DEAD_LETTER_STREAM = "RESPAWN_DEAD_LETTER"

OBS_PREFIX = f"respawn.obs.{SUBJECT_VERSION}"
VERDICT_PREFIX = "respawn.verdict"
NODE_VERDICT_PREFIX = f"respawn.nodeverdict.{SUBJECT_VERSION}"
LIFECYCLE_PREFIX = "respawn.lifecycle"
DEAD_LETTER_PREFIX = "respawn.deadletter"


def token(name: str) -> str:
    """Escape a Kubernetes name so it is exactly one NATS subject token.

    '%' is escaped first so the mapping is reversible; '.', '*', '>' and whitespace
    are not allowed inside a token.
    """
    out = name.replace("%", "%25").replace(".", "%2E").replace("*", "%2A").replace(">", "%3E")
    return out.replace(" ", "%20") or "%00"


def untoken(tok: str) -> str:
    if tok == "%00":
        return ""
    for escaped, char in (("%20", " "), ("%3E", ">"), ("%2A", "*"), ("%2E", "."), ("%25", "%")):
        tok = tok.replace(escaped, char)
    return tok


def appwrapper_obs(namespace: str, appwrapper: str, kind: str, name: str) -> str:
    """Subject for the latest state of one object that belongs to an AppWrapper:
    ``respawn.obs.v1.aw.<ns>.<aw>.<kind>.<name>.<partition>``.

    Everything about one AppWrapper shares the prefix
    ``respawn.obs.v1.aw.<ns>.<aw>.`` so a consumer can filter on it and see it in order; the last
    token is the AppWrapper's partition, so a consumer can filter on one partition.
    ``kind`` is ``appwrapper``, ``pod`` or ``component``.
    """
    return (
        f"{OBS_PREFIX}.aw.{token(namespace)}.{token(appwrapper)}.{kind}.{token(name)}"
        f".{partition(namespace, appwrapper)}"
    )


def appwrapper_obs_filter(namespace: str = "*", appwrapper: str = "*") -> str:
    ns = namespace if namespace == "*" else token(namespace)
    aw = appwrapper if appwrapper == "*" else token(appwrapper)
    return f"{OBS_PREFIX}.aw.{ns}.{aw}.>"


def appwrapper_obs_partition_filter(part: int) -> str:
    """Every observation of the AppWrappers in partition ``part``."""
    return f"{OBS_PREFIX}.aw.*.*.*.*.{part}"


def node_obs(node: str) -> str:
    return f"{OBS_PREFIX}.node.{token(node)}"


def node_obs_filter() -> str:
    return f"{OBS_PREFIX}.node.*"


def verdict(namespace: str, appwrapper: str) -> str:
    """``respawn.verdict.<ns>.<aw>.<partition>``."""
    return f"{VERDICT_PREFIX}.{token(namespace)}.{token(appwrapper)}.{partition(namespace, appwrapper)}"


def verdict_filter(namespace: str | None = None, appwrapper: str | None = None) -> str:
    """Every verdict, a namespace's, or one AppWrapper's (whatever the partition count)."""
    if namespace is None:
        return f"{VERDICT_PREFIX}.>"
    if appwrapper is None:
        return f"{VERDICT_PREFIX}.{token(namespace)}.*.*"
    return f"{VERDICT_PREFIX}.{token(namespace)}.{token(appwrapper)}.*"


def verdict_partition_filter(part: int) -> str:
    """Every verdict about the AppWrappers in partition ``part``."""
    return f"{VERDICT_PREFIX}.*.*.{part}"


def node_verdict(resource: str) -> str:
    return f"{NODE_VERDICT_PREFIX}.{token(resource)}"


def node_verdict_filter() -> str:
    return f"{NODE_VERDICT_PREFIX}.>"


def lifecycle_verdict_durable(part: int) -> str:
    """The durable consumer of partition ``part``'s verdicts, bound by the lifecycle replica that
    owns the partition (docs/scaling.md)."""
    return f"lifecycle-verdicts-{part}"


def lifecycle_event(namespace: str, appwrapper: str) -> str:
    return f"{LIFECYCLE_PREFIX}.{token(namespace)}.{token(appwrapper)}"


def lifecycle_filter(namespace: str | None = None) -> str:
    """Every lifecycle event, or a namespace's."""
    if namespace is None:
        return f"{LIFECYCLE_PREFIX}.>"
    return f"{LIFECYCLE_PREFIX}.{token(namespace)}.*"


def dead_letter(service: str) -> str:
    return f"{DEAD_LETTER_PREFIX}.{token(service)}"
