"""deploy/monitoring/: the PrometheusRule's schema, and every PromQL expression of the rules and
the dashboard parses and selects only metrics the services declare."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from respawn.testbed import binaries
from tests import monitoring
from tests.unit.test_docs_metrics import declared

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_ALERT_NAME = re.compile(r"^Respawn[A-Za-z]+$")


def test_the_rule_file_is_a_prometheus_rule_with_well_formed_groups() -> None:
    doc = monitoring.rules()
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    groups = doc["spec"]["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)), "group names must be unique"
    seen: set[str] = set()
    for group in groups:
        assert set(group) <= {"name", "interval", "rules"}, group["name"]
        if "interval" in group:
            assert _DURATION.match(group["interval"])
        assert group["rules"], f"group {group['name']} has no rules"
        for rule in group["rules"]:
            assert ("alert" in rule) != ("record" in rule), rule
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            if "record" in rule:
                assert set(rule) <= {"record", "expr", "labels"}, rule
                assert _METRIC_NAME.match(rule["record"]) and ":" in rule["record"]
                continue
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            assert _ALERT_NAME.match(rule["alert"]) and rule["alert"] not in seen
            seen.add(rule["alert"])
            assert _DURATION.match(rule.get("for", "0s"))
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert {"summary", "description"} <= set(rule["annotations"])


def test_the_alerts_cover_what_operators_watch() -> None:
    alerts = set(monitoring.rule_expressions()) - monitoring.recorded()
    assert {
        "RespawnDetectionSlow",
        "RespawnConsumerLag",
        "RespawnDeadLetters",
        "RespawnResetRateHigh",
        "RespawnServiceNotReady",
    } <= alerts


@pytest.mark.parametrize("name", sorted(monitoring.rule_expressions()))
def test_every_rule_expression_parses(name: str) -> None:
    assert monitoring.selected(monitoring.rule_expressions()[name])


@pytest.mark.parametrize("name", sorted(monitoring.dashboard_expressions()))
def test_every_dashboard_expression_parses(name: str) -> None:
    assert monitoring.selected(monitoring.dashboard_expressions()[name])


def test_a_broken_expression_does_not_parse() -> None:
    with pytest.raises(ValueError):
        monitoring.selected("sum(rate(respawn_lifecycle_resets_total[5m])")


def test_the_rules_and_the_dashboard_select_only_metrics_the_services_declare() -> None:
    exposed = set()
    for name, (kind, _) in declared().items():
        exposed |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    queried = monitoring.queried()
    assert "respawn_health_detection_delay_seconds_bucket" in queried
    unknown = sorted(queried - exposed)
    assert not unknown, f"deploy/monitoring queries metrics no service declares: {unknown}"


def test_the_dashboard_is_one_grafana_dashboard_with_unique_panel_ids() -> None:
    dash = monitoring.dashboard()
    assert dash["uid"] == "respawn" and dash["title"] == "Respawn"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "namespace"}
    for panel in dash["panels"]:
        for target in panel.get("targets", ()):
            assert target["datasource"]["uid"] == "${datasource}"


def promtool() -> Path | None:
    """promtool from the binary cache (tools/k8sbins/build.sh, run by `make test`), else PATH."""
    cached = binaries.bin_dir() / binaries.PROMTOOL
    if os.access(cached, os.X_OK):
        return cached
    found = shutil.which("promtool")
    return Path(found) if found else None


@pytest.mark.skipif(promtool() is None, reason="no promtool: run tools/k8sbins/build.sh (make binaries)")
def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    tool = promtool()
    assert tool is not None
    rule_file = tmp_path / "respawn.rules.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": monitoring.rules()["spec"]["groups"]}))
    done = subprocess.run([str(tool), "check", "rules", str(rule_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(monitoring.rule_expressions())} rules found" in done.stdout


@pytest.mark.skipif(promtool() is None, reason="no promtool: run tools/k8sbins/build.sh (make binaries)")
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    tool = promtool()
    assert tool is not None
    rule_file = tmp_path / "broken.rules.yaml"
    broken = {"alert": "RespawnBroken", "expr": "sum(rate(respawn_lifecycle_resets_total[5m])"}
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [broken]}]}))
    done = subprocess.run([str(tool), "check", "rules", str(rule_file)], capture_output=True, text=True)
    assert done.returncode != 0
