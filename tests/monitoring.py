"""What the monitoring pack (deploy/monitoring/) queries: the PromQL expressions of its rules and
dashboard, and the metric names they select."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import yaml

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"

# Grafana's own variables, as a query sent to Prometheus would have them replaced.
_GRAFANA_RANGES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "1h"}

# Metrics of other exporters that the rules query: Prometheus's own scrape health and
# kube-state-metrics (docs/metrics.md, "Alerts").
EXTERNAL = frozenset({"up", "kube_pod_container_status_ready"})


def rules() -> dict[str, Any]:
    doc = yaml.safe_load((MONITORING / "rules.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def dashboard() -> dict[str, Any]:
    doc = json.loads((MONITORING / "dashboard.json").read_text())
    assert isinstance(doc, dict)
    return doc


def rule_expressions() -> dict[str, str]:
    """Rule name (the alert or the recorded series) -> its expression."""
    out = {}
    for group in rules()["spec"]["groups"]:
        for rule in group["rules"]:
            out[rule.get("alert") or rule["record"]] = rule["expr"]
    return out


def recorded() -> set[str]:
    return {r["record"] for g in rules()["spec"]["groups"] for r in g["rules"] if "record" in r}


def dashboard_expressions() -> dict[str, str]:
    """ "<panel title> <refId>" -> the expression, Grafana's range variables replaced."""
    out = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for variable, value in _GRAFANA_RANGES.items():
                expr = expr.replace(variable, value)
            out[f"{panel['title']} {target['refId']}"] = expr
    return out


def selected(expr: str) -> set[str]:
    """The metric names an expression selects (raises ValueError if it does not parse)."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return names


def queried() -> set[str]:
    """Every Respawn metric (as exposed: counters with _total, histograms' _bucket) the rules and
    the dashboard select, other than the series the rules record themselves."""
    names: set[str] = set()
    for expr in [*rule_expressions().values(), *dashboard_expressions().values()]:
        names |= selected(expr)
    return {n for n in names - recorded() - EXTERNAL if re.match(r"respawn_", n)}
