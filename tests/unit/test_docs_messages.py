"""docs/messages.md is the public description of the bus: every schema field must be in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared import messages

DOC = (Path(__file__).resolve().parents[2] / "docs" / "messages.md").read_text()

MODELS = [
    messages.AppWrapperObservation,
    messages.PodObservation,
    messages.ComponentObservation,
    messages.NodeObservation,
    messages.Verdict,
    messages.NodeVerdict,
    messages.LifecycleEvent,
    messages.ContainerState,
    messages.ObjectRef,
    messages.PodConditionState,
    messages.QuarantinedNode,
    messages.LostNode,
]


def section(kind_or_name: str) -> str:
    """The text of the doc section whose heading names the schema."""
    match = re.search(rf"^###[^\n]*{re.escape(kind_or_name)}[^\n]*\n(.*?)(?=^##)", DOC, re.S | re.M)
    return match.group(1) if match else ""


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_documented(model: type) -> None:
    text = section(model.__name__)
    assert text, f"docs/messages.md has no section for {model.__name__}"
    # schema_kind / schema_version / schema_revision are documented once for all schemas.
    common = {"schema_kind", "schema_version", "schema_revision"}
    missing = [
        name
        for name in model.model_fields  # type: ignore[attr-defined]
        if f"`{name}`" not in (DOC if name in common else text)
    ]
    assert missing == [], f"{model.__name__} fields not in docs/messages.md: {missing}"


def test_every_encoding_and_cloudevents_header_is_documented() -> None:
    from shared.messages import ENCODINGS, ObjectRef, Verdict, encode

    table = DOC.split("## Encodings", 1)[1].split("\n\n", 3)[2]
    assert [e for e in ENCODINGS if f"| `{e}` |" not in table] == []
    verdict = Verdict(
        ref=ObjectRef(namespace="n", name="a"), state="Healthy", decided_at="2025-01-01T00:00:00Z"
    )
    _, headers = encode(verdict, "cloudevents", msg_id="i", source="s")
    assert [h for h in headers if f"| `{h}` |" not in DOC] == []
