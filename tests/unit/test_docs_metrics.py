"""docs/metrics.md lists every metric the services declare, with its type and labels."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram

from shared import metrics

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "metrics.md").read_text()
_DECLARERS = {"counter", "gauge", "histogram"}
_TYPES = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}


def declaring_modules() -> dict[str, set[str]]:
    """Every module of shared/ and services/ that declares a metric, with the names it declares,
    found in the source: a module no test happens to import is found too."""
    found: dict[str, set[str]] = {}
    for root in ("shared", "services"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                first = node.args[0]
                if (
                    name in _DECLARERS
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and first.value.startswith("respawn_")
                ):
                    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                    found.setdefault(module, set()).add(first.value)
    return found


def declared() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Exposed name (counters with ``_total``) -> (type, labels) of every metric in the code."""
    modules = declaring_modules()
    for module in modules:
        importlib.import_module(module)
    names = set().union(*modules.values())
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for (_, name), metric in metrics._declared.items():
        if name not in names:
            continue  # declared by a test on a registry of its own
        kind = _TYPES[type(metric)]
        exposed = f"{name}_total" if kind == "counter" else name
        out[exposed] = (kind, tuple(metric._labelnames))
    assert set(names) <= {n.removesuffix("_total") for n in out} | set(out)
    return out


_ROW = re.compile(r"^\| `(respawn_[a-z0-9_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The rows of the "Every metric" section: name -> (type, labels)."""
    section = DOC.split("## Every metric", 1)[1].split("\n## ", 1)[0]
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name, kind, labels in _ROW.findall(section):
        assert name not in out, f"{name} is listed twice in docs/metrics.md"
        out[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)))
    return out


def test_the_source_scan_finds_the_metrics() -> None:
    modules = declaring_modules()
    assert "respawn_bus_messages_published" in modules["shared.metrics"]
    assert "respawn_health_detection_seconds" in modules["services.health.service"]
    assert len(declared()) >= 60


def test_every_metric_in_the_code_is_documented_with_its_type_and_labels() -> None:
    code, doc = declared(), documented()
    missing = sorted(set(code) - set(doc))
    assert not missing, f"metrics missing from docs/metrics.md: {missing}"
    wrong = {name: (code[name], doc[name]) for name in code if doc[name] != code[name]}
    assert not wrong, f"type or labels differ (code, docs/metrics.md): {wrong}"


def test_docs_list_no_metric_the_code_does_not_declare() -> None:
    extra = sorted(set(documented()) - set(declared()))
    assert not extra, f"docs/metrics.md lists metrics no code declares: {extra}"
