"""The pure parts of `respawn status`, `tail` and `explain`: rows, lines, timelines, incidents."""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from respawn.cli import explain, status, tail
from respawn.cli.main import CLI_OUTPUT_VERSION, app
from respawn.testbed import manifests
from respawn.testbed.manifests import condition
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION
from shared.faulttolerance import FaultTolerance
from shared.messages import (
    ComponentObservation,
    ContainerState,
    LifecycleEvent,
    ObjectRef,
    PodObservation,
    QuarantinedNode,
    Verdict,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
REF = ObjectRef(namespace="team-a", name="llama", uid="u1")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def appwrapper(
    name: str,
    *,
    namespace: str = "team-a",
    phase: str = "Running",
    resetting: int | None = 1,
    annotations: dict[str, str] | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    body = manifests.appwrapper(name, namespace=namespace, annotations=annotations or {})
    body["status"] = {"phase": phase, "conditions": conditions or []}
    if resetting is not None:
        body["status"]["resettingCount"] = resetting
    return body


# ------------------------------------------------------------------------------------ status


def test_status_row_reads_phase_attempts_reason_and_newest_transition() -> None:
    aw = appwrapper(
        "llama",
        phase="Resetting",
        resetting=2,
        conditions=[
            condition("QuotaReserved", "True", reason="Resuming", at=at(0)),
            condition("Unhealthy", "True", reason="FoundFailedPods", at=at(30)),
            condition("ResourcesDeployed", "True", reason="Resetting", at=at(10)),
        ],
    )
    row = status.status_row(aw, FaultTolerance(retry_limit=3))
    assert row == status.StatusRow("team-a", "llama", "Resetting", 2, 3, "FoundFailedPods", at(30))


def test_status_row_shows_no_unhealthy_reason_once_the_condition_is_false() -> None:
    aw = appwrapper(
        "llama", conditions=[condition("Unhealthy", "False", reason="FoundNoFailedPods", at=at(0))]
    )
    assert status.status_row(aw, FaultTolerance()).unhealthy_reason == ""


def test_status_row_retry_limit_comes_from_the_annotation_over_the_operator_default() -> None:
    defaults = FaultTolerance(retry_limit=3)
    assert (
        status.status_row(appwrapper("a", annotations={RETRY_LIMIT_ANNOTATION: "7"}), defaults).retry_limit
        == 7
    )
    # A malformed value falls back to the operator default, as upstream does.
    assert (
        status.status_row(appwrapper("b", annotations={RETRY_LIMIT_ANNOTATION: "x"}), defaults).retry_limit
        == 3
    )
    assert status.status_row(appwrapper("c"), FaultTolerance(retry_limit=5)).retry_limit == 5


def test_status_row_of_a_fresh_appwrapper_has_no_phase_count_or_transition() -> None:
    row = status.status_row({"metadata": {"name": "new", "namespace": "ns"}}, FaultTolerance())
    assert (row.phase, row.resetting_count, row.unhealthy_reason, row.last_transition) == ("", 0, "", None)


def test_status_rows_are_ordered_by_namespace_then_name() -> None:
    rows = status.status_rows(
        [appwrapper("b", namespace="y"), appwrapper("z", namespace="x"), appwrapper("a", namespace="y")],
        FaultTolerance(),
    )
    assert [(r.namespace, r.name) for r in rows] == [("x", "z"), ("y", "a"), ("y", "b")]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-5, "0s"),
        (0, "0s"),
        (45, "45s"),
        (60, "1m"),
        (192, "3m12s"),
        (7200, "2h"),
        (7500, "2h5m"),
        (86_400 * 3 + 3600 * 4 + 59, "3d4h"),
        (86_400, "1d"),
    ],
)
def test_format_age(seconds: int, text: str) -> None:
    assert status.format_age(timedelta(seconds=seconds)) == text


def render(table: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    return out.getvalue()


def test_status_table_has_one_line_per_appwrapper_with_attempts_over_limit_and_age() -> None:
    rows = [
        status.StatusRow("team-a", "llama", "Resetting", 1, 3, "FoundFailedPods", at(0)),
        status.StatusRow("team-b", "fresh", "", 0, 3, "", None),
    ]
    lines = render(status.status_table(rows, at(192))).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "ATTEMPTS", "UNHEALTHY", "LAST", "TRANSITION"]
    assert lines[1].split() == ["team-a", "llama", "Resetting", "1/3", "FoundFailedPods", "3m12s"]
    assert lines[2].split() == ["team-b", "fresh", "-", "0/3", "-", "-"]


def test_status_json_is_versioned_and_carries_every_column() -> None:
    rows = [status.StatusRow("team-a", "llama", "Running", 1, 3, "", at(0))]
    doc = status.status_json(rows, at(61.5), CLI_OUTPUT_VERSION)
    assert doc == {
        "version": "respawn.cli/v1",
        "appwrappers": [
            {
                "namespace": "team-a",
                "name": "llama",
                "phase": "Running",
                "resettingCount": 1,
                "retryLimit": 3,
                "retryLimitSource": "builtin",
                "unhealthyReason": "",
                "lastTransitionTime": "2025-01-02T03:04:05Z",
                "lastTransitionAgeSeconds": 61,
            }
        ],
        # Not read (no NATS_URL): null, not an empty list, which would claim no node is quarantined.
        "nodeQuarantine": None,
        # Not given: where the default retry limit was read is unknown.
        "retryLimitDefault": None,
    }
    json.dumps(doc)  # serialisable as it is


def test_status_shows_quarantined_held_and_dry_run_nodes_but_not_released_ones() -> None:
    entries = [
        QuarantinedNode(node="n2", state="Held", failures=3, workloads=("t/c", "t/d", "t/e"), since=at(30)),
        QuarantinedNode(node="n9", state="Released", failures=3, since=at(0), until=at(10)),
        QuarantinedNode(
            node="n1", state="Quarantined", failures=4, workloads=("t/a", "t/b"), since=at(0), until=at(3600)
        ),
    ]
    rows = status.quarantine_rows(entries)
    assert [(e.node, e.state) for e in rows] == [("n1", "Quarantined"), ("n2", "Held")]
    doc = status.status_json([], at(60), CLI_OUTPUT_VERSION, rows)
    assert doc["nodeQuarantine"] == [
        {
            "node": "n1",
            "state": "Quarantined",
            "failures": 4,
            "workloads": ["t/a", "t/b"],
            "since": "2025-01-02T03:04:05Z",
            "until": "2025-01-02T04:04:05Z",
        },
        {
            "node": "n2",
            "state": "Held",
            "failures": 3,
            "workloads": ["t/c", "t/d", "t/e"],
            "since": "2025-01-02T03:04:35Z",
            "until": None,
        },
    ]
    out = io.StringIO()
    Console(file=out, width=200).print(status.quarantine_table(rows, at(60)))
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["NODE", "STATE", "FAILURES", "WORKLOADS", "SINCE", "UNTIL"]
    assert lines[1].split() == ["n1", "Quarantined", "4", "t/a,", "t/b", "1m", "ago", "in", "59m"]
    assert lines[2].split() == ["n2", "Held", "3", "t/c,", "t/d,", "t/e", "30s", "ago", "-"]


def test_context_namespace_is_the_current_contexts_or_default(tmp_path: Any) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "current-context: b\ncontexts:\n"
        "- name: a\n  context: {namespace: x}\n- name: b\n  context: {namespace: y}\n"
    )
    assert status.context_namespace(str(kc)) == "y"
    kc.write_text("current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\n")
    assert status.context_namespace(str(kc)) == "default"


# ------------------------------------------------------------------------------------ tail


def test_parse_since_takes_a_duration_back_from_now_or_an_rfc3339_time() -> None:
    assert tail.parse_since("10m", at(600)) == at(0)
    assert tail.parse_since("1h30m", at(5400)) == at(0)
    assert tail.parse_since("2025-01-02T03:04:05Z", at(999)) == at(0)
    assert tail.parse_since("2025-01-02T04:04:05+01:00", at(999)) == at(0)
    with pytest.raises(ValueError, match="neither a duration"):
        tail.parse_since("yesterday", at(0))
    with pytest.raises(ValueError, match="too far in the future"):
        tail.parse_since("2999-01-01T00:00:00Z", at(0))


def test_subject_filters_escape_names_and_narrow_to_a_namespace_or_one_appwrapper() -> None:
    assert tail.subject_filter("verdicts") == "respawn.verdict.>"
    assert tail.subject_filter("lifecycle", "team-a") == "respawn.lifecycle.team-a.*"
    assert tail.subject_filter("verdicts", "team-a", "llama.ft") == "respawn.verdict.team-a.llama%2Eft.*"


def test_trace_id_comes_from_the_traceparent_header() -> None:
    assert tail.trace_id({"traceparent": TRACEPARENT}) == TRACE
    assert tail.trace_id({}) == ""
    assert tail.trace_id({"traceparent": "garbage"}) == ""


def unhealthy(seconds: float, **kw: Any) -> Verdict:
    fields: dict[str, Any] = {
        "ref": REF,
        "state": "Unhealthy",
        "reason": "FoundFailedPods",
        "message": "pod llama-0 failed",
        "nodes": ("kwok-node-1",),
        "first_unhealthy_at": at(seconds - 1),
        "decided_at": at(seconds),
    }
    fields.update(kw)
    return Verdict(**fields)


def event(seconds: float, name: str, **kw: Any) -> LifecycleEvent:
    return LifecycleEvent(ref=REF, event=name, at=at(seconds), **kw)


def test_verdict_line_shows_time_subject_state_reason_message_nodes_and_sequence() -> None:
    line = tail.verdict_line(unhealthy(2, terminal=True), seq=12)
    assert line == (
        '2025-01-02T03:04:07.000Z  team-a/llama  Unhealthy(terminal)  FoundFailedPods  "pod llama-0 failed"  '
        "nodes=kwok-node-1  attempt=0  #12"
    )


def test_event_line_shows_the_phase_change_and_keeps_a_multiline_message_on_one_line() -> None:
    e = event(
        1.5,
        "PhaseChanged",
        phase="Resetting",
        previous_phase="Running",
        reason="FoundFailedPods",
        message="first\nsecond",
        resetting_count=1,
    )
    line = tail.event_line(e, seq=3)
    assert "\n" not in line
    assert line == (
        "2025-01-02T03:04:06.500Z  team-a/llama  PhaseChanged Running->Resetting  FoundFailedPods  "
        '"first\\nsecond"  attempt=1  #3'
    )


def what(e: LifecycleEvent) -> str:
    return tail.event_line(e).split("  ")[2]


def test_event_line_shows_the_phase_other_events_happened_in() -> None:
    assert what(event(0, "ResetStarted", phase="Resetting")) == "ResetStarted (Resetting)"
    assert what(event(0, "DeletionForceful", phase="Resetting")) == "DeletionForceful (Resetting)"
    assert what(event(0, "PhaseChanged", phase="Suspended")) == "PhaseChanged (none)->Suspended"


def test_json_record_is_versioned_and_carries_position_trace_and_payload() -> None:
    v = unhealthy(2)
    stored = tail.StoredMessage(
        "RESPAWN_VERDICTS", 7, "respawn.verdict.team-a.llama", {"traceparent": TRACEPARENT}, b""
    )
    record = tail.json_record(v, stored, CLI_OUTPUT_VERSION)
    assert record["version"] == "respawn.cli/v1"
    assert (record["stream"], record["seq"], record["subject"]) == ("RESPAWN_VERDICTS", 7, stored.subject)
    assert (record["traceId"], record["kind"]) == (TRACE, "verdict")
    assert record["payload"]["state"] == "Unhealthy" and record["payload"]["nodes"] == ["kwok-node-1"]
    assert Verdict.model_validate(record["payload"]) == v  # the payload is the message, losslessly


# ------------------------------------------------------------------------------------ explain


def failed_pod(name: str, *, finished: float, observed: float, deleted: bool = True) -> PodObservation:
    return PodObservation(
        ref=ObjectRef(namespace="team-a", name=name),
        appwrapper="llama",
        deleted=deleted,
        observed_at=at(observed),
        phase="Failed",
        node_name="kwok-node-1",
        scheduled=True,
        containers=(
            ContainerState(
                name="main", state="terminated", exit_code=137, reason="OOMKilled", finished_at=at(finished)
            ),
        ),
    )


def test_a_failed_pod_is_placed_at_its_failure_and_says_how_it_ended() -> None:
    entry = explain.observation_entry(failed_pod("llama-0", finished=1, observed=5))
    assert entry is not None
    assert entry.at == at(1)  # when it failed, not when the reset deleted it
    assert entry.summary == "pod llama-0 on kwok-node-1: deleted after Failed; main exited 137 (OOMKilled)"


def test_a_component_is_shown_only_when_its_state_says_something() -> None:
    base = {
        "ref": ObjectRef(namespace="team-a", name="llama-job"),
        "appwrapper": "llama",
        "api_version": "batch/v1",
        "kind": "Job",
        "observed_at": at(0),
    }
    assert explain.observation_entry(ComponentObservation(**base)) is None
    failed = explain.observation_entry(
        ComponentObservation(**base, failed=True, status_message="BackoffLimit")
    )
    assert failed is not None and failed.summary == "Job llama-job: failed: BackoffLimit"


def in_stream_order(entries: list[explain.Entry | None]) -> list[explain.Entry]:
    """Give the entries distinct stream sequences, in list order (as JetStream would)."""
    return [dataclasses.replace(e, seq=i) for i, e in enumerate(entries, 1) if e is not None]


def recovery_timeline() -> list[explain.Entry]:
    """A pod fails, health judges, lifecycle resets, the workload runs again."""
    return explain.build_timeline(
        in_stream_order(
            [
                explain.event_entry(event(0, "PhaseChanged", phase="Running", previous_phase="Resuming")),
                explain.observation_entry(failed_pod("llama-0", finished=11, observed=14)),
                explain.verdict_entry(unhealthy(12)),
                explain.event_entry(
                    event(
                        12,
                        "PhaseChanged",
                        phase="Resetting",
                        previous_phase="Running",
                        reason="FoundFailedPods",
                        resetting_count=1,
                    )
                ),
                explain.event_entry(
                    event(
                        12,
                        "ResetStarted",
                        reason="FoundFailedPods",
                        resetting_count=1,
                        nodes=("kwok-node-1",),
                    )
                ),
                explain.event_entry(event(25, "ResetFinished", resetting_count=1)),
                explain.event_entry(
                    event(30, "PhaseChanged", phase="Running", previous_phase="Resuming", resetting_count=1)
                ),
            ]
        )
    )


def test_timeline_is_ordered_by_time_then_cause_before_effect_then_stream_order() -> None:
    # Read in an order unlike the outcome: lifecycle first, verdict last, at one instant.
    entries = in_stream_order(
        [
            explain.event_entry(event(12, "ResetStarted", resetting_count=1)),
            explain.event_entry(event(12, "PhaseChanged", phase="Resetting", previous_phase="Running")),
            explain.observation_entry(failed_pod("llama-0", finished=12, observed=14)),
            explain.event_entry(event(3, "PhaseChanged", phase="Running", previous_phase="Resuming")),
            explain.verdict_entry(unhealthy(12)),
        ]
    )
    timeline = explain.build_timeline(entries)
    assert [(e.at, e.source, e.seq) for e in timeline] == [
        (at(3), "lifecycle", 4),
        (at(12), "observation", 3),
        (at(12), "verdict", 5),
        (at(12), "lifecycle", 1),
        (at(12), "lifecycle", 2),
    ]


@given(st.permutations(range(7)))
def test_timeline_does_not_depend_on_the_order_messages_were_read(order: list[int]) -> None:
    entries = recovery_timeline()
    assert explain.build_timeline([entries[i] for i in order]) == entries


def test_a_reset_that_runs_again_is_one_recovered_incident_with_its_durations() -> None:
    [inc] = explain.find_incidents(recovery_timeline())
    assert (inc.reason, inc.nodes, inc.outcome, inc.attempt, inc.judged_attempt) == (
        "FoundFailedPods",
        ("kwok-node-1",),
        "recovered",
        1,
        0,
    )
    assert inc.first_unhealthy_at == at(11)
    assert inc.since_start(inc.detected_at) == timedelta(seconds=1)
    assert inc.since_start(inc.reset_started_at) == timedelta(seconds=1)
    assert inc.since_start(inc.reset_finished_at) == timedelta(seconds=14)
    assert inc.since_start(inc.running_again_at) == timedelta(seconds=19)


def test_repeated_unhealthy_verdicts_before_the_reset_are_the_same_incident() -> None:
    timeline = explain.build_timeline(
        [
            explain.verdict_entry(unhealthy(5)),
            explain.verdict_entry(unhealthy(6, nodes=("kwok-node-2",))),
            explain.event_entry(event(7, "ResetStarted", resetting_count=1)),
        ]
    )
    [inc] = explain.find_incidents(timeline)
    assert inc.nodes == ("kwok-node-1", "kwok-node-2")
    assert inc.detected_at == at(5) and inc.outcome == "resetting"


def test_two_failures_are_two_incidents_and_a_terminal_one_ends_failed() -> None:
    timeline = explain.build_timeline(
        [
            *recovery_timeline(),
            explain.verdict_entry(unhealthy(40, reason="FailedComponent", terminal=True, resetting_count=1)),
            explain.event_entry(event(41, "PhaseChanged", phase="Failed", previous_phase="Running")),
        ]
    )
    first, second = explain.find_incidents(timeline)
    assert first.outcome == "recovered"
    assert (second.reason, second.terminal, second.outcome, second.failed_at) == (
        "FailedComponent",
        True,
        "failed",
        at(41),
    )


def test_a_reset_without_a_retained_verdict_still_makes_an_incident_from_the_event() -> None:
    timeline = explain.build_timeline(
        [
            explain.event_entry(
                event(
                    7, "ResetStarted", reason="AutopilotNoExecute", resetting_count=0, nodes=("kwok-node-3",)
                )
            ),
            explain.event_entry(event(9, "PhaseChanged", phase="Running", previous_phase="Resuming")),
        ]
    )
    [inc] = explain.find_incidents(timeline)
    assert (inc.reason, inc.nodes, inc.outcome, inc.started_at) == (
        "AutopilotNoExecute",
        ("kwok-node-3",),
        "recovered",
        at(7),
    )
    assert inc.since_start(inc.running_again_at) == timedelta(seconds=2)


def traced(entry: explain.Entry, trace: str) -> explain.Entry:
    return explain.Entry(entry.at, entry.source, entry.summary, entry.seq, trace, entry.message)


def test_render_explain_shows_state_timeline_incident_durations_and_ends_with_the_trace_ids() -> None:
    timeline = [
        traced(e, TRACE) if e.source != "observation" and e.at >= at(12) else e for e in recovery_timeline()
    ]
    incidents = explain.find_incidents(timeline)
    current = explain.Current(phase="Running", resetting_count=1, deleted=False, uid="u1")
    text = explain.render_explain("team-a", "llama", timeline, incidents, current)
    lines = text.splitlines()
    assert lines[0] == "AppWrapper team-a/llama: Running, 1 reset"
    assert (
        "  2025-01-02T03:04:16.000Z  observation  pod llama-0 on kwok-node-1: deleted after Failed; "
        "main exited 137 (OOMKilled)" in lines
    )
    assert "  1. FoundFailedPods on kwok-node-1: pod llama-0 failed" in lines
    assert (
        "     first unhealthy 2025-01-02T03:04:16.000Z -> detected +1.0s -> reset started +1.0s -> "
        "reset finished +14.0s -> running again +19.0s"
    ) in lines
    assert "     outcome: recovered (reset to attempt 1)" in lines
    assert lines[-2:] == ["Traces", f"  {TRACE}  (5 messages)"]


def test_explain_json_carries_durations_in_seconds_and_the_trace_ids() -> None:
    timeline = [traced(e, TRACE) if e.source == "verdict" else e for e in recovery_timeline()]
    doc = explain.explain_json(
        "team-a", "llama", timeline, explain.find_incidents(timeline), None, CLI_OUTPUT_VERSION
    )
    assert doc["version"] == "respawn.cli/v1" and doc["current"] is None
    [inc] = doc["incidents"]
    assert (inc["detectionSeconds"], inc["timeToResetSeconds"], inc["recoverySeconds"]) == (1.0, 1.0, 19.0)
    assert inc["traceIds"] == [TRACE] and doc["traceIds"] == [TRACE]
    assert [e["source"] for e in doc["timeline"]][:2] == ["lifecycle", "observation"]
    json.dumps(doc)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0s"), (1.25, "1.2s"), (59.9, "59.9s"), (61, "1m1s"), (3725, "1h2m"), (-2, "-2.0s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert explain.format_duration(timedelta(seconds=seconds)) == text


def test_parse_target_needs_namespace_and_name() -> None:
    assert explain.parse_target("team-a/llama") == ("team-a", "llama")
    for bad in ("llama", "/llama", "team-a/", "a/b/c"):
        with pytest.raises(ValueError, match="NS/NAME"):
            explain.parse_target(bad)


# ------------------------------------------------------------------------------------ command line


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


def test_usage_errors_are_one_line_and_exit_2() -> None:
    usage_errors = [
        ["tail", "bogus"],
        ["explain", "a/b/c"],
        ["explain", "a/b", "-n", "c"],
        ["status", "-n", "a", "-A"],
        ["status", "one", "-A"],
        ["tail", "verdicts", "-o", "yaml", "--json"],
        ["status", "-o", "xml"],
        ["tail", "verdicts", "--since", "soon"],
        ["tail", "verdicts", "--since", "1m", "--seq", "3"],
    ]
    for args in usage_errors:
        result = invoke(*args, env={"NATS_URL": "nats://127.0.0.1:1"})
        assert result.exit_code == 2, args
        assert result.output.count("\n") == 1 and result.output.startswith("error: "), result.output


def test_missing_connection_settings_are_one_error_line_and_exit_4(tmp_path: Any) -> None:
    env = {"NATS_URL": "", "KUBECONFIG": "", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    result = invoke("tail", "verdicts", "--no-follow", env=env)
    assert (result.exit_code, result.output) == (
        4,
        "error: NATS_URL is not set; pass --nats-url or set NATS_URL\n",
    )
    result = invoke("explain", "a/b", env=env)
    assert (result.exit_code, result.output) == (
        4,
        "error: NATS_URL is not set; pass --nats-url or set NATS_URL\n",
    )
    result = invoke("status", env=env)
    assert (result.exit_code, result.output) == (
        4,
        "error: no cluster configured: set KUBECONFIG or pass --kubeconfig\n",
    )
    result = invoke("status", env={**env, "KUBECONFIG": str(tmp_path / "missing")})
    assert (
        result.exit_code == 4
        and result.output.startswith("error: kubeconfig ")
        and result.output.count("\n") == 1
    )


def test_lines_show_the_failure_class_and_code_when_there_is_one() -> None:
    v = unhealthy(2, failure_class="Transient", failure_code="Evicted", fault_kind="Infrastructure")
    assert "  class=Transient code=Evicted fault=Infrastructure  attempt=0" in tail.verdict_line(v)
    e = event(3, "ResetStarted", failure_class="Transient", failure_code="Evicted")
    assert "  class=Transient code=Evicted  attempt=0" in tail.event_line(e)
    assert "class=" not in tail.verdict_line(unhealthy(2))


def test_explain_shows_each_incidents_failure_class_and_code() -> None:
    timeline = explain.build_timeline(
        [
            explain.verdict_entry(
                unhealthy(
                    5, failure_class="Permanent", failure_code="BadInput", fault_kind="Application", nodes=()
                )
            ),
            explain.event_entry(
                event(6, "PhaseChanged", phase="Failed", failure_class="Permanent", failure_code="BadInput")
            ),
            # No verdict retained: the class comes from the reset's event.
            explain.event_entry(
                event(
                    20, "ResetStarted", resetting_count=0, failure_class="Transient", failure_code="Evicted"
                )
            ),
        ]
    )
    first, second = explain.find_incidents(timeline)
    assert (first.failure_class, first.failure_code, first.fault_kind) == (
        "Permanent",
        "BadInput",
        "Application",
    )
    assert (second.failure_class, second.failure_code, second.fault_kind) == ("Transient", "Evicted", "")
    text = explain.render_explain("team-a", "llama", timeline, [first, second], None)
    assert (
        "  1. FoundFailedPods [Permanent BadInput, application fault]: pod llama-0 failed"
        in text.splitlines()
    )
    assert "  2. unknown cause [Transient Evicted]" in text.splitlines()
    doc = explain.explain_json("team-a", "llama", timeline, [first, second], None, CLI_OUTPUT_VERSION)
    assert [(i["failureClass"], i["failureCode"], i["faultKind"]) for i in doc["incidents"]] == [
        ("Permanent", "BadInput", "Application"),
        ("Transient", "Evicted", ""),
    ]
