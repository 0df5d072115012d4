"""docs/schemas/ holds the JSON Schema of every public message, as the models and the docs make it,
and what Respawn publishes is valid by it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from respawn import schemas
from shared.messages import LifecycleEvent, Message, ObjectRef, Verdict

AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
REF = ObjectRef(namespace="team-a", name="llama", uid="u-1")
SAMPLES: list[Message] = [
    Verdict(ref=REF, state="Unhealthy", reason="FoundFailedPods", nodes=("n1",), decided_at=AT, deadline=AT),
    LifecycleEvent(ref=REF, event="ResetStarted", phase="Resetting", at=AT, failure_class="Transient"),
]


def test_the_checked_in_schemas_are_what_the_models_and_docs_give() -> None:
    differ = schemas.stale()
    assert differ == [], (
        f"docs/schemas/ is out of date ({', '.join(differ)}): "
        f"refresh it with `{schemas.REFRESH}` and commit it"
    )


def test_there_is_one_schema_per_public_message() -> None:
    public = {m for m in Message.__subclasses__() if m.PUBLIC}
    assert set(schemas.PUBLIC) == public
    assert sorted(p.name for p in schemas.SCHEMA_DIR.glob("*.json")) == sorted(
        schemas.file_name(m) for m in public
    )


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: m.KIND)
def test_what_respawn_publishes_is_valid_by_its_schema(message: Message) -> None:
    schema = json.loads((schemas.SCHEMA_DIR / schemas.file_name(type(message))).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    body = json.loads(message.encode("json"))
    validator.validate(body)
    # A producer of an earlier revision leaves later fields out; a later one adds fields.
    validator.validate({k: v for k, v in body.items() if k not in ("failure_class", "failure_code")})
    validator.validate({**body, "added_in_a_later_revision": 1})
    # Not valid: another kind, another version, a required field missing, a wrong type.
    for bad in (
        {**body, "schema_kind": "verdict.node"},
        {**body, "schema_version": 2},
        {k: v for k, v in body.items() if k != "ref"},
        {**body, "resetting_count": "one"},
    ):
        assert not validator.is_valid(bad), bad


def test_each_field_is_described_by_its_meaning_in_the_docs() -> None:
    verdict = json.loads(schemas.render()[schemas.file_name(Verdict)])
    assert verdict["properties"]["seq"]["description"].startswith("increases with every verdict")
    assert verdict["$defs"]["ObjectRef"]["properties"]["uid"]["description"].startswith("`metadata.uid`")
    assert verdict["properties"]["state"]["enum"] == ["Healthy", "Unhealthy", "Succeeded", "Deleted"]
    assert verdict["$id"] == "https://respawn.dev/schemas/verdict.v1.json"


def test_the_check_names_the_command_that_refreshes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "schemas"
    assert schemas.main(["--out", str(out)]) == 0
    assert schemas.main(["--out", str(out), "--check"]) == 0
    (out / "verdict.v1.json").write_text("{}\n")
    (out / "old.v0.json").write_text("{}\n")
    assert schemas.main(["--out", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert "verdict.v1.json: out of date; refresh with: python -m respawn.schemas" in err
    assert "old.v0.json: out of date" in err
    assert schemas.main(["--out", str(out)]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == ["lifecycle.event.v1.json", "verdict.v1.json"]
