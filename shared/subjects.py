"""NATS subject names: the one place they are built.

Subjects are part of Respawn's public, versioned interface (see docs/messages.md).
Kubernetes names may contain dots, which NATS uses as the token separator, so every
name is escaped with :func:`token` before it becomes part of a subject.
"""

from __future__ import annotations

SUBJECT_VERSION = "v1"

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
    """Subject for the latest state of one object that belongs to an AppWrapper.

    Everything about one AppWrapper shares the prefix
    ``respawn.obs.v1.aw.<ns>.<aw>.`` so a consumer can filter on it and see it in order.
    ``kind`` is ``appwrapper``, ``pod`` or ``component``.
    """
    return f"{OBS_PREFIX}.aw.{token(namespace)}.{token(appwrapper)}.{kind}.{token(name)}"


def appwrapper_obs_filter(namespace: str = "*", appwrapper: str = "*") -> str:
    ns = namespace if namespace == "*" else token(namespace)
    aw = appwrapper if appwrapper == "*" else token(appwrapper)
    return f"{OBS_PREFIX}.aw.{ns}.{aw}.>"


def node_obs(node: str) -> str:
    return f"{OBS_PREFIX}.node.{token(node)}"


def node_obs_filter() -> str:
    return f"{OBS_PREFIX}.node.*"


def verdict(namespace: str, appwrapper: str) -> str:
    return f"{VERDICT_PREFIX}.{token(namespace)}.{token(appwrapper)}"


def verdict_filter() -> str:
    return f"{VERDICT_PREFIX}.>"


def node_verdict(resource: str) -> str:
    return f"{NODE_VERDICT_PREFIX}.{token(resource)}"


def node_verdict_filter() -> str:
    return f"{NODE_VERDICT_PREFIX}.>"


def lifecycle_event(namespace: str, appwrapper: str) -> str:
    return f"{LIFECYCLE_PREFIX}.{token(namespace)}.{token(appwrapper)}"


def lifecycle_filter() -> str:
    return f"{LIFECYCLE_PREFIX}.>"


def dead_letter(service: str) -> str:
    return f"{DEAD_LETTER_PREFIX}.{token(service)}"
