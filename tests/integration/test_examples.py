"""examples/consume.py, run as an outside system runs it, reads what Respawn publishes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared import subjects
from shared.bus import Bus
from shared.messages import Encoding, LifecycleEvent, ObjectRef, Verdict

pytestmark = pytest.mark.nats

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "consume.py"
AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def verdict(ns: str, name: str, seq: int) -> Verdict:
    return Verdict(
        ref=ObjectRef(namespace=ns, name=name, uid=f"uid-{name}"),
        state="Unhealthy",
        reason="FoundFailedPods",
        decided_at=AT,
        seq=seq,
        failure_class="Transient",
        failure_code="Signal:SIGKILL",
    )


def event(ns: str, name: str) -> LifecycleEvent:
    return LifecycleEvent(
        ref=ObjectRef(namespace=ns, name=name, uid=f"uid-{name}"),
        event="ResetStarted",
        phase="Resetting",
        previous_phase="Running",
        resetting_count=1,
        at=AT,
    )


async def run_example(url: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--url",
        url,
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"consume.py did not finish: {out.decode()} {err.decode()}") from None
    assert proc.returncode == 0, err.decode()
    return out.decode().splitlines()


@pytest.fixture
async def published(nats_url: str, bus: Bus) -> AsyncIterator[str]:
    """A namespace of its own holding verdicts in every encoding, a lifecycle event, and two
    messages no schema here accepts."""
    ns = f"ex{uuid.uuid4().hex[:8]}"
    others: tuple[Encoding, ...] = ("cloudevents", "msgpack")
    buses: dict[Encoding, Bus] = {"json": bus}
    for encoding in others:
        buses[encoding] = await Bus.connect(
            nats_url, name=f"respawn-health-{encoding}", public_encoding=encoding
        )
    try:
        await buses["json"].publish(subjects.verdict(ns, "plain"), verdict(ns, "plain", 1), msg_id=f"{ns}-1")
        await buses["cloudevents"].publish(subjects.verdict(ns, "ce"), verdict(ns, "ce", 2), msg_id=f"{ns}-2")
        await buses["msgpack"].publish(
            subjects.verdict(ns, "packed"), verdict(ns, "packed", 3), msg_id=f"{ns}-3"
        )
        await buses["json"].publish(
            subjects.lifecycle_event(ns, "plain"), event(ns, "plain"), msg_id=f"{ns}-4"
        )
        headers = {"content-type": "application/json"}
        body = json.loads(verdict(ns, "broken", 4).encode("json"))
        del body["ref"]
        await bus.js.publish(subjects.verdict(ns, "broken"), json.dumps(body).encode(), headers=headers)
        newer = {**json.loads(verdict(ns, "newer", 5).encode("json")), "schema_version": 2}
        await bus.js.publish(subjects.verdict(ns, "newer"), json.dumps(newer).encode(), headers=headers)
    finally:
        for encoding in others:
            await buses[encoding].close()
    yield ns


def expected(ns: str) -> set[str]:
    return {
        f"verdict {ns}/plain Unhealthy FoundFailedPods seq=1 [Transient Signal:SIGKILL]",
        f"verdict {ns}/ce Unhealthy FoundFailedPods seq=2 [Transient Signal:SIGKILL] ce-id={ns}-2",
        f"skipped {subjects.verdict(ns, 'packed')}: "
        "not JSON (set nats.publicEncoding to json or cloudevents)",
        f"lifecycle {ns}/plain ResetStarted Running -> Resetting attempt=1",
        f"invalid {subjects.verdict(ns, 'broken')}: 'ref' is a required property",
        f"skipped {subjects.verdict(ns, 'newer')}: no schema for verdict/v2 (newer than these schemas?)",
    }


async def test_the_example_prints_each_verdict_and_event_and_says_what_it_skips(
    published: str, nats_url: str
) -> None:
    lines = await run_example(nats_url, "--namespace", published, "--count", "6")
    assert sorted(lines) == sorted(expected(published))


async def test_without_jsonschema_the_example_checks_the_required_fields(
    published: str, nats_url: str, tmp_path: Path
) -> None:
    (tmp_path / "jsonschema.py").write_text("raise ImportError('not installed here')\n")
    lines = await run_example(
        nats_url, "--namespace", published, "--count", "6", env={"PYTHONPATH": str(tmp_path)}
    )
    assert sorted(lines) == sorted(expected(published))


async def test_the_example_reads_one_stream_when_asked(published: str, nats_url: str) -> None:
    lines = await run_example(nats_url, "--namespace", published, "--streams", "lifecycle", "--count", "1")
    assert lines == [f"lifecycle {published}/plain ResetStarted Running -> Resetting attempt=1"]
