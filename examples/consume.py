"""Follow Respawn's public streams from outside: verdicts and lifecycle events, one line each.

Needs only nats-py (pip install nats-py) and the JSON Schemas in docs/schemas/; validates each
message with jsonschema when it is installed, else checks the required fields by itself. The
services must publish the public streams as JSON (``nats.publicEncoding`` json or cloudevents,
the default is json); a msgpack message is reported and skipped.

    NATS_URL=nats://127.0.0.1:4222 python examples/consume.py --namespace team-a

With NATS auth, as the read-only outside reader (docs/deploy.md, "Outside readers"):
NATS_USER=subscriber NATS_PASSWORD=... NATS_INBOX_PREFIX=_INBOX_subscriber.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import nats
from nats.js import api

# Subjects name the namespace and the AppWrapper, each one token (a name with a dot in it is
# escaped: docs/messages.md, "Subjects"); verdict subjects end in a partition number.
STREAMS = {
    "verdicts": ("RESPAWN_VERDICTS", "respawn.verdict.{ns}.{name}.*"),
    "lifecycle": ("RESPAWN_LIFECYCLE", "respawn.lifecycle.{ns}.{name}"),
}
SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"

try:
    import jsonschema
except ImportError:  # validation falls back to the required fields
    jsonschema = None


def load_schemas(directory: Path) -> dict[tuple[str, int], Any]:
    """(schema_kind, schema_version) → a function that returns what is wrong with a message."""
    checks: dict[tuple[str, int], Any] = {}
    for path in sorted(directory.glob("*.json")):
        schema = json.loads(path.read_text())
        kind = schema["properties"]["schema_kind"]["const"]
        version = schema["properties"]["schema_version"]["const"]
        if jsonschema is not None:
            validator = jsonschema.Draft202012Validator(schema)
            checks[(kind, version)] = lambda body, v=validator: [e.message for e in v.iter_errors(body)]
        else:
            checks[(kind, version)] = lambda body, s=schema: [
                f"{field!r} is a required property" for field in s["required"] if field not in body
            ]
    return checks


def line(body: dict[str, Any]) -> str:
    """One line for a verdict or a lifecycle event."""
    ref = body["ref"]
    who = f"{ref['namespace']}/{ref['name']}"
    failure = " ".join(x for x in (body.get("failure_class", ""), body.get("failure_code", "")) if x)
    failure = f" [{failure}]" if failure else ""
    if body["schema_kind"] == "verdict":
        return f"verdict {who} {body['state']} {body.get('reason') or '-'} seq={body.get('seq', 0)}{failure}"
    phases = f"{body.get('previous_phase') or '-'} -> {body.get('phase') or '-'}"
    return f"lifecycle {who} {body['event']} {phases} attempt={body.get('resetting_count', 0)}{failure}"


def describe(msg: Any, checks: dict[tuple[str, int], Any]) -> str:
    """What to print for one stored message."""
    headers = {k.lower(): v for k, v in (msg.headers or {}).items()}
    if headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return f"skipped {msg.subject}: not JSON (set nats.publicEncoding to json or cloudevents)"
    try:
        body = json.loads(msg.data)
    except ValueError as exc:
        return f"invalid {msg.subject}: not JSON: {exc}"
    if not isinstance(body, dict):
        return f"invalid {msg.subject}: not a JSON object"
    key = (body.get("schema_kind"), body.get("schema_version"))
    check = checks.get(key)
    if check is None:
        return f"skipped {msg.subject}: no schema for {key[0]}/v{key[1]} (newer than these schemas?)"
    problems = check(body)
    if problems:
        return f"invalid {msg.subject}: {problems[0]}"
    ce_id = headers.get("ce-id")
    return line(body) + (f" ce-id={ce_id}" if ce_id else "")


async def follow(
    js: Any, stream: str, subject: str, checks: dict[tuple[str, int], Any], out: asyncio.Queue[str]
) -> None:
    # An ephemeral pull consumer of our own, from the first stored message; never one of Respawn's.
    psub = await js.pull_subscribe(
        subject, stream=stream, config=api.ConsumerConfig(ack_policy=api.AckPolicy.NONE)
    )
    while True:
        try:
            msgs = await psub.fetch(64, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            await out.put(describe(msg, checks))


async def main() -> int:
    parser = argparse.ArgumentParser(description="Follow Respawn's verdicts and lifecycle events.")
    parser.add_argument("--url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--namespace", default="*", help="only this namespace (default: all)")
    parser.add_argument("--appwrapper", default="*", help="only this AppWrapper (default: all)")
    parser.add_argument("--streams", default="verdicts,lifecycle", help="verdicts, lifecycle or both")
    parser.add_argument("--schemas", type=Path, default=SCHEMAS, help="the JSON Schema directory")
    parser.add_argument("--count", type=int, default=0, help="stop after this many lines (default: follow)")
    args = parser.parse_args()
    checks = load_schemas(args.schemas)
    nc = await nats.connect(
        args.url,
        user=os.environ.get("NATS_USER") or None,
        password=os.environ.get("NATS_PASSWORD") or None,
        inbox_prefix=os.environ.get("NATS_INBOX_PREFIX") or "_INBOX",
    )
    out: asyncio.Queue[str] = asyncio.Queue()
    tasks = [
        asyncio.create_task(
            follow(
                nc.jetstream(), stream, subject.format(ns=args.namespace, name=args.appwrapper), checks, out
            )
        )
        for stream, subject in (STREAMS[s.strip()] for s in args.streams.split(","))
    ]
    printed = 0
    try:
        while not args.count or printed < args.count:
            getter = asyncio.ensure_future(out.get())
            done, _ = await asyncio.wait([getter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:  # a follower failed: say why
                getter.cancel()
                for task in done:
                    task.result()
            print(getter.result(), flush=True)
            printed += 1
    finally:
        for task in tasks:
            task.cancel()
        await nc.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(130)
