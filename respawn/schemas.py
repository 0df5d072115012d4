"""JSON Schema of every public message, from its pydantic model and docs/messages.md.

``python -m respawn.schemas`` writes ``docs/schemas/<schema_kind>.v<version>.json`` for each
public message (:data:`PUBLIC`); ``--check`` writes nothing and exits 1 naming each file that
differs from what would be written. ``tests/unit/test_schemas.py`` runs the check, so the
checked-in files always match the models.

A schema is what a reader may accept as a message of that kind and version (JSON Schema draft
2020-12): the model's fields with their types, a field with a default optional (a producer of
an earlier revision leaves it out), unknown fields allowed (a later revision adds some), and
``schema_kind`` and ``schema_version`` required and fixed. Each field's description is its
"meaning" in the schema's table in docs/messages.md, so the meaning is written in one place.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from shared.messages import LifecycleEvent, Message, Verdict

__all__ = ["PUBLIC", "SCHEMA_DIR", "file_name", "main", "render", "schema"]

REPO: Final = Path(__file__).resolve().parents[1]
SCHEMA_DIR: Final = REPO / "docs" / "schemas"
MESSAGES_DOC: Final = REPO / "docs" / "messages.md"
PUBLIC: Final[tuple[type[Message], ...]] = (Verdict, LifecycleEvent)
ID_BASE: Final = "https://respawn.dev/schemas/"
REFRESH: Final = "python -m respawn.schemas"

_CELL = re.compile(r"(?<!\\)\|")


def file_name(model: type[Message]) -> str:
    return f"{model.KIND}.v{model.VERSION}.json"


def _section(doc: str, name: str) -> str:
    """The text under the ``###`` heading of docs/messages.md that names ``name``."""
    match = re.search(rf"^###[^\n]*`{re.escape(name)}`[^\n]*\n(.*?)(?=^##)", doc, re.S | re.M)
    if match is None:
        raise ValueError(f"docs/messages.md has no section for {name}")
    return match.group(1)


def _meanings(section: str) -> dict[str, str]:
    """Field name → its "meaning" cell, from the section's ``| field | type | ... | meaning |`` table."""
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip())[1:-1]]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            out[cells[0].strip("`")] = cells[-1]
    return out


def _intro(section: str) -> str:
    """The section's first paragraph, when it is prose (not the table)."""
    first = section.strip().split("\n\n", 1)[0]
    return "" if first.startswith("|") else " ".join(first.split())


def _describe(node: dict[str, Any], model: type[BaseModel], doc: str) -> None:
    section = _section(doc, model.__name__)
    meanings = _meanings(section)
    node.pop("description", None)
    intro = _intro(section)
    if intro:
        node["description"] = intro
    for name, prop in node.get("properties", {}).items():
        prop.pop("title", None)
        if name in meanings:
            prop["description"] = meanings[name]


def schema(model: type[Message], doc: str) -> dict[str, Any]:
    """The JSON Schema of ``model`` (see the module's docstring)."""
    raw = model.model_json_schema(mode="validation")
    _describe(raw, model, doc)
    for name, definition in raw.get("$defs", {}).items():
        _describe(definition, _embedded(model, name), doc)
    props = raw["properties"]
    props["schema_kind"] = {"const": model.KIND, "description": "which schema this is"}
    props["schema_version"] = {"const": model.VERSION, "description": "the version of that schema"}
    props["schema_revision"] = {
        "type": "integer",
        "minimum": 0,
        "default": 0,
        "description": (
            f"additive changes within that version: {model.REVISION} for this schema; a missing field means 0"
        ),
    }
    description = raw.pop("description", "")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": ID_BASE + file_name(model),
        "title": f"{model.KIND}/v{model.VERSION} ({model.__name__}), revision {model.REVISION}",
        "description": (
            f"{description} Generated from shared/messages.py and docs/messages.md by {REFRESH}; do not edit."
        ).strip(),
        "type": "object",
        "required": [
            "schema_kind",
            "schema_version",
            *(r for r in raw.get("required", []) if not r.startswith("schema_")),
        ],
        "properties": props,
        **({"$defs": raw["$defs"]} if "$defs" in raw else {}),
    }


def _embedded(model: type[BaseModel], name: str) -> type[BaseModel]:
    """The model class named ``name`` among the types ``model``'s fields refer to."""
    seen: list[type[BaseModel]] = []

    def walk(cls: type[BaseModel]) -> type[BaseModel] | None:
        for info in cls.model_fields.values():
            for candidate in _models_in(info.annotation):
                if candidate.__name__ == name:
                    return candidate
                if candidate not in seen:
                    seen.append(candidate)
                    found = walk(candidate)
                    if found is not None:
                        return found
        return None

    found = walk(model)
    if found is None:
        raise ValueError(f"{model.__name__} refers to no model named {name}")
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


def render(doc: str | None = None) -> dict[str, str]:
    """File name → the text of each public message's schema file."""
    text = MESSAGES_DOC.read_text() if doc is None else doc
    return {file_name(m): json.dumps(schema(m, text), indent=2, ensure_ascii=False) + "\n" for m in PUBLIC}


def stale(directory: Path = SCHEMA_DIR) -> list[str]:
    """The schema files in ``directory`` that differ from what :func:`render` gives, or are missing
    or left over."""
    wanted = render()
    present = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    differ = [n for n, text in wanted.items() if n not in present or (directory / n).read_text() != text]
    return sorted(differ + [n for n in present if n not in wanted])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m respawn.schemas", description="Write the JSON Schema of every public message."
    )
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR, help=f"directory (default {SCHEMA_DIR})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(args.out)
        for name in differ:
            print(f"{args.out / name}: out of date; refresh with: {REFRESH}", file=sys.stderr)
        return 1 if differ else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name in stale(args.out):
        if name not in render():
            (args.out / name).unlink()
    for name, text in render().items():
        (args.out / name).write_text(text)
        print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
