"""The codec of shared/messages.py: every encoding reads back, and the header decides how to read."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgpack
import pytest

from shared.messages import (
    ENCODINGS,
    AnyObservation,
    Encoding,
    InvalidMessage,
    LifecycleEvent,
    Message,
    NodeObservation,
    NodeVerdict,
    ObjectRef,
    PodObservation,
    UnsupportedSchemaVersion,
    Verdict,
    content_type,
    decode,
    encode,
)

AT = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
REF = ObjectRef(namespace="team-a", name="llama.ft", uid="u-1")
VERDICT = Verdict(
    ref=REF,
    state="Unhealthy",
    reason="FoundFailedPods",
    nodes=("node-1",),
    decided_at=AT,
    seq=3,
    failure_class="Transient",
    failure_code="Signal:SIGKILL",
    fault_kind="Infrastructure",
)
EVENT = LifecycleEvent(ref=REF, event="ResetStarted", phase="Resetting", previous_phase="Running", at=AT)
NODE_VERDICT = NodeVerdict(resource="nvidia.com/gpu", no_execute=("node-2",), decided_at=AT)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("message", [VERDICT, EVENT, NODE_VERDICT], ids=lambda m: m.KIND)
def test_every_encoding_reads_back_as_the_same_message(encoding: Encoding, message: Message) -> None:
    payload, headers = encode(message, encoding, msg_id="id-1", source="respawn-health")
    assert decode(type(message), payload, headers) == message


def test_json_is_the_message_as_a_json_object_and_says_so() -> None:
    payload, headers = encode(VERDICT, "json", msg_id="id-1", source="respawn-health")
    assert headers == {"content-type": "application/json"}
    body = json.loads(payload)
    assert body["schema_kind"] == "verdict" and body["schema_version"] == 1
    assert body["ref"] == {"namespace": "team-a", "name": "llama.ft", "uid": "u-1"}
    assert body["decided_at"] == "2025-01-02T03:04:05.678000Z"
    assert body["nodes"] == ["node-1"]


def test_cloudevents_binary_mode_carries_the_attributes_in_headers_and_the_same_json() -> None:
    payload, headers = encode(VERDICT, "cloudevents", msg_id="id-1", source="respawn-health")
    assert headers == {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "id-1",
        "ce-type": "dev.respawn.verdict.v1",
        "ce-source": "respawn-health",
        "ce-subject": "team-a/llama.ft",
        "ce-time": "2025-01-02T03:04:05.678000Z",
    }
    assert payload == encode(VERDICT, "json", msg_id="other", source="other")[0]
    _, event_headers = encode(EVENT, "cloudevents", msg_id="id-2", source="respawn-lifecycle")
    assert event_headers["ce-type"] == "dev.respawn.lifecycle.event.v1"
    assert event_headers["ce-time"] == "2025-01-02T03:04:05.678000Z"


def test_msgpack_has_no_content_type_as_before() -> None:
    payload, headers = encode(VERDICT, "msgpack", msg_id="id-1", source="respawn-health")
    assert headers == {}
    assert msgpack.unpackb(payload)["schema_kind"] == "verdict"
    assert payload == VERDICT.encode()


def test_a_stream_holding_both_encodings_reads_whole() -> None:
    stored = [encode(VERDICT, e, msg_id=f"id-{e}", source="respawn-health") for e in ENCODINGS]
    stored.append((VERDICT.encode(), {}))  # a message of a producer from before the header existed
    assert [decode(Verdict, payload, headers) for payload, headers in stored] == [VERDICT] * 4


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/json"},
        {"CONTENT-TYPE": "Application/JSON; charset=utf-8"},
    ],
)
def test_the_content_type_is_read_in_any_case_and_without_parameters(headers: dict[str, str]) -> None:
    assert content_type(headers) == "application/json"
    assert decode(Verdict, VERDICT.encode("json"), headers) == VERDICT


def test_msgpack_content_types_are_read_as_msgpack() -> None:
    assert decode(Verdict, VERDICT.encode(), {"content-type": "application/msgpack"}) == VERDICT


def test_the_header_decides_not_the_bytes() -> None:
    with pytest.raises(InvalidMessage, match="not msgpack"):
        decode(Verdict, VERDICT.encode("json"))  # JSON without its header
    with pytest.raises(InvalidMessage, match="not JSON"):
        decode(Verdict, VERDICT.encode(), {"content-type": "application/json"})
    with pytest.raises(InvalidMessage, match="unsupported content-type 'text/plain'"):
        decode(Verdict, b"hello", {"content-type": "text/plain"})


def test_json_messages_are_checked_as_msgpack_ones_are() -> None:
    headers = {"content-type": "application/json"}
    newer = {**json.loads(VERDICT.encode("json")), "schema_version": 2}
    with pytest.raises(UnsupportedSchemaVersion):
        decode(Verdict, json.dumps(newer).encode(), headers)
    with pytest.raises(InvalidMessage, match=r"expected schema_kind 'verdict', got 'lifecycle\.event'"):
        decode(Verdict, EVENT.encode("json"), headers)
    with pytest.raises(InvalidMessage, match="expected a map, got list"):
        decode(Verdict, b"[1, 2]", headers)
    with pytest.raises(InvalidMessage, match="invalid verdict"):
        decode(Verdict, json.dumps({"schema_kind": "verdict", "schema_version": 1}).encode(), headers)


def test_a_union_dispatches_on_the_kind_in_either_encoding() -> None:
    node = NodeObservation(name="n1", observed_at=AT)
    pod = PodObservation(ref=ObjectRef(namespace="ns", name="p"), appwrapper="aw", observed_at=AT)
    assert decode(AnyObservation, node.encode()) == node
    assert decode(AnyObservation, pod.encode("json"), {"content-type": "application/json"}) == pod


def test_only_verdicts_and_lifecycle_events_are_public() -> None:
    public = {m.KIND for m in Message.__subclasses__() if m.PUBLIC}
    assert public == {"verdict", "lifecycle.event"}


def test_ce_time_is_utc_whatever_zone_the_time_was_given_in() -> None:
    from datetime import timedelta, timezone

    elsewhere = AT.astimezone(timezone(timedelta(hours=2)))
    _, headers = encode(
        VERDICT.model_copy(update={"decided_at": elsewhere}), "cloudevents", msg_id="i", source="s"
    )
    assert headers["ce-time"] == "2025-01-02T03:04:05.678000Z"
    naive = AT.replace(tzinfo=None)
    _, headers = encode(EVENT.model_copy(update={"at": naive}), "cloudevents", msg_id="i", source="s")
    assert headers["ce-time"] == "2025-01-02T03:04:05.678000Z"
