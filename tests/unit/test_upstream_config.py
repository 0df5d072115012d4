"""The upstream operator's configuration converted into Respawn's (respawn/upstreamconfig.py and
``respawn config convert-upstream``): every upstream key is either mapped or reported as left
out, with why."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from bench.upstream import operator_config
from respawn.cli.main import app
from respawn.upstreamconfig import UpstreamConfigError, convert, convert_text, operator_config_of
from shared.config import OperatorConfig, ResourceTaint, load_config

SECOND = 1_000_000_000  # nanoseconds, as Go marshals a time.Duration


def left_out(doc: dict[str, Any]) -> dict[str, str]:
    return {item.key: item.why for item in convert(doc).ignored}


# Upstream's default OperatorConfig, as its manager writes it into a ConfigMap it creates
# (yaml.Marshal of pkg/config's defaults: durations in nanoseconds).
UPSTREAM_DEFAULTS: dict[str, Any] = {
    "appwrapper": {
        "autopilot": {
            "injectAntiAffinities": True,
            "monitorNodes": True,
            "resourceTaints": {
                "nvidia.com/gpu": [
                    {"key": "autopilot.ibm.com/gpuhealth", "value": "WARN", "effect": "PreferNoSchedule"},
                    {"key": "autopilot.ibm.com/gpuhealth", "value": "TESTING", "effect": "NoSchedule"},
                    {"key": "autopilot.ibm.com/gpuhealth", "value": "EVICT", "effect": "NoExecute"},
                ]
            },
            "preferNoScheduleWeight": 50,
        },
        "userRBACAdmissionCheck": True,
        "faultTolerance": {
            "admissionGracePeriod": 60 * SECOND,
            "warmupGracePeriod": 300 * SECOND,
            "failureGracePeriod": 60 * SECOND,
            "resetPause": 90 * SECOND,
            "retryLimit": 3,
            "deletionGracePeriod": 600 * SECOND,
            "gracePeriodCeiling": 86_400 * SECOND,
            "successTTLCeiling": 604_800 * SECOND,
        },
    },
    "certManagement": {
        "namespace": "appwrapper-system",
        "certificateDir": "/tmp/k8s-webhook-server/serving-certs",
    },
    "controllerManager": {
        "metrics": {"bindAddress": ":8443"},
        "health": {"bindAddress": ":8081"},
        "leaderElection": False,
        "enableHTTP2": False,
    },
    "webhooksEnabled": True,
}


def test_upstream_defaults_convert_to_respawn_defaults() -> None:
    conversion = convert(UPSTREAM_DEFAULTS)
    default = OperatorConfig()
    assert conversion.validated.fault_tolerance == default.fault_tolerance
    assert conversion.validated.autopilot == default.autopilot
    assert conversion.validated.default_queue_name == ""


@pytest.mark.parametrize(
    ("key", "nanoseconds", "respawn"),
    [
        ("admissionGracePeriod", 30 * SECOND, "30s"),
        ("warmupGracePeriod", 600 * SECOND, "10m0s"),
        ("failureGracePeriod", 1_500_000_000, "1.5s"),
        ("resetPause", 0, "0s"),
        ("deletionGracePeriod", 300 * SECOND, "5m0s"),
        ("gracePeriodCeiling", 48 * 3600 * SECOND, "48h0m0s"),
        ("successTTLCeiling", 3600 * SECOND, "1h0m0s"),
    ],
)
def test_every_fault_tolerance_duration_is_mapped_from_nanoseconds(
    key: str, nanoseconds: int, respawn: str
) -> None:
    doc = {"appwrapper": {"faultTolerance": {key: nanoseconds}}}
    conversion = convert(doc)
    assert conversion.config == {"faultTolerance": {key: respawn}}
    assert not conversion.ignored


def test_the_converted_durations_are_what_the_services_load(tmp_path: Path) -> None:
    doc = {"appwrapper": {"faultTolerance": {"resetPause": 45 * SECOND, "retryLimit": 7}}}
    path = tmp_path / "config.yaml"
    path.write_text(convert(doc).yaml())
    loaded = load_config(path, {})
    assert loaded.fault_tolerance.retry_pause_period == timedelta(seconds=45)
    assert loaded.fault_tolerance.retry_limit == 7


def test_retry_limit_queue_and_autopilot_switches_are_mapped() -> None:
    doc = {
        "appwrapper": {
            "faultTolerance": {"retryLimit": 0},
            "defaultQueueName": "user-queue",
            "autopilot": {"injectAntiAffinities": False, "monitorNodes": False, "preferNoScheduleWeight": 20},
        }
    }
    config = convert(doc).config
    assert config == {
        "faultTolerance": {"retryLimit": 0},
        "autopilot": {"injectAntiAffinities": False, "monitorNodes": False, "preferNoScheduleWeight": 20},
        "defaultQueueName": "user-queue",
    }


def test_resource_taints_merge_into_upstreams_default_map() -> None:
    amd = [{"key": "autopilot.ibm.com/gpuhealth", "value": "ERR", "effect": "NoExecute"}]
    validated = convert({"appwrapper": {"autopilot": {"resourceTaints": {"amd.com/gpu": amd}}}}).validated
    taints = validated.autopilot.resource_taints
    # Go decodes a map into the default one: the nvidia.com/gpu entry stays, as upstream ran it.
    assert taints["nvidia.com/gpu"] == OperatorConfig().autopilot.resource_taints["nvidia.com/gpu"]
    assert taints["amd.com/gpu"] == [
        ResourceTaint(key="autopilot.ibm.com/gpuhealth", value="ERR", effect="NoExecute")
    ]


def test_a_resource_named_replaces_its_default_taints_and_time_added_is_left_out() -> None:
    evict = {"key": "autopilot.ibm.com/gpuhealth", "value": "EVICT", "effect": "NoExecute", "timeAdded": None}
    doc = {"appwrapper": {"autopilot": {"resourceTaints": {"nvidia.com/gpu": [evict]}}}}
    conversion = convert(doc)
    assert conversion.validated.autopilot.resource_taints == {
        "nvidia.com/gpu": [
            ResourceTaint(key="autopilot.ibm.com/gpuhealth", value="EVICT", effect="NoExecute")
        ]
    }
    assert [i.key for i in conversion.ignored] == [
        'appwrapper.autopilot.resourceTaints["nvidia.com/gpu"][0].timeAdded'
    ]


def test_theupstream_default_taints_are_respawns() -> None:
    from respawn.upstreamconfig import upstream_default_taints

    assert (
        OperatorConfig.model_validate({"autopilot": {"resourceTaints": upstream_default_taints()}}).autopilot
        == OperatorConfig().autopilot
    )


def test_every_key_without_a_respawn_setting_is_reported_with_why() -> None:
    ignored = left_out(
        UPSTREAM_DEFAULTS | {"appwrapper": {**UPSTREAM_DEFAULTS["appwrapper"], "schedulerName": "x"}}
    )
    assert set(ignored) == {
        "appwrapper.userRBACAdmissionCheck",
        "appwrapper.schedulerName",
        "certManagement",
        "controllerManager",
        "webhooksEnabled",
    }
    assert "always checks the creator's rights" in ignored["appwrapper.userRBACAdmissionCheck"]
    assert "spec.schedulerName" in ignored["appwrapper.schedulerName"]
    assert all(ignored.values())


def test_an_empty_scheduler_name_is_upstreams_default_and_not_reported() -> None:
    assert left_out({"appwrapper": {"schedulerName": ""}}) == {}


def test_the_codeflare_operators_form_is_read() -> None:
    # The CodeFlare operator: its own keys at the top, the AppWrapper settings beside `enabled`,
    # one level down under the Go field name.
    doc = {
        "clientConnection": {"qps": 50, "burst": 100},
        "metrics": {"bindAddress": ":8080"},
        "health": {"bindAddress": ":8081"},
        "leaderElection": {"leaderElect": True},
        "kuberay": {"rayDashboardOAuthEnabled": True},
        "appwrapper": {
            "enabled": True,
            "Config": {"faultTolerance": {"retryLimit": 9}, "defaultQueueName": "q"},
        },
    }
    conversion = convert(doc)
    assert conversion.config == {"faultTolerance": {"retryLimit": 9}, "defaultQueueName": "q"}
    assert {i.key for i in conversion.ignored} == {
        "appwrapper.enabled",
        "clientConnection",
        "metrics",
        "health",
        "leaderElection",
        "kuberay",
    }


def test_keys_match_case_insensitively_as_go_decodes_them() -> None:
    doc = {"AppWrapper": {"FaultTolerance": {"RetryLimit": 4, "resetpause": 10 * SECOND}}}
    assert convert(doc).config == {"faultTolerance": {"resetPause": "10s", "retryLimit": 4}}


def test_unknown_keys_are_reported_as_upstream_ignores_them() -> None:
    ignored = left_out({"appwrapper": {"faultTolerance": {"retryLimt": 4}}, "extra": 1})
    assert set(ignored) == {"appwrapper.faultTolerance.retryLimt", "extra"}
    assert all("upstream ignores it too" in why for why in ignored.values())


def test_duration_strings_are_taken_too() -> None:
    assert convert({"appwrapper": {"faultTolerance": {"warmupGracePeriod": "7m"}}}).config == {
        "faultTolerance": {"warmupGracePeriod": "7m0s"}
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, "expected integer nanoseconds"),
        (True, "expected integer nanoseconds"),
        (1500, "finer than the microsecond"),
        ("ninety", "appwrapper.faultTolerance.resetPause"),
    ],
)
def test_a_duration_that_cannot_be_read_names_its_key(value: object, message: str) -> None:
    with pytest.raises(UpstreamConfigError, match=message):
        convert({"appwrapper": {"faultTolerance": {"resetPause": value}}})


def test_a_converted_configuration_that_respawn_refuses_says_why() -> None:
    doc = {"appwrapper": {"faultTolerance": {"admissionGracePeriod": 600 * SECOND}}}
    with pytest.raises(
        UpstreamConfigError, match=r"admissionGracePeriod \(10m0s\) exceeds faultTolerance\.warmupGracePeriod"
    ):
        convert(doc)


def test_a_configmap_is_read_through_its_one_data_key() -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "appwrapper-operator-config"},
        "data": {"config.yaml": yaml.safe_dump({"appwrapper": {"defaultQueueName": "q"}})},
    }
    assert convert_text(yaml.safe_dump(configmap)).config == {"defaultQueueName": "q"}
    configmap["data"]["other.yaml"] = ""
    with pytest.raises(UpstreamConfigError, match="exactly one data key"):
        operator_config_of(yaml.safe_dump(configmap))


def test_the_benchmarks_upstream_configuration_converts_back_to_respawns() -> None:
    # bench/upstream.py writes upstream's configuration from Respawn's; converting it back gives
    # the same settings.
    respawn = load_config(
        None,
        {
            "RESPAWN_FAULT_TOLERANCE_RESET_PAUSE": "3s",
            "RESPAWN_FAULT_TOLERANCE_RETRY_LIMIT": "6",
            "RESPAWN_AUTOPILOT_MONITOR_NODES": "false",
            "RESPAWN_DEFAULT_QUEUE_NAME": "team",
        },
    )
    back = convert(operator_config(respawn, 8081)).validated
    assert back.fault_tolerance.model_dump(include=_UPSTREAM_FT) == respawn.fault_tolerance.model_dump(
        include=_UPSTREAM_FT
    )
    assert back.autopilot == respawn.autopilot
    assert back.default_queue_name == "team"


_UPSTREAM_FT = {
    "admission_grace_period",
    "warmup_grace_period",
    "failure_grace_period",
    "retry_pause_period",
    "retry_limit",
    "forceful_deletion_grace_period",
    "grace_period_ceiling",
    "success_ttl",
}


def test_the_command_prints_the_file_and_names_what_it_left_out(tmp_path: Path) -> None:
    source = tmp_path / "upstream.yaml"
    source.write_text(yaml.safe_dump(UPSTREAM_DEFAULTS))
    result = CliRunner().invoke(app, ["config", "convert-upstream", str(source)])
    assert result.exit_code == 0, result.output
    assert "respawn: left out webhooksEnabled:" in result.stderr
    assert yaml.safe_load(result.stdout)["faultTolerance"]["resetPause"] == "1m30s"
    assert result.stdout.startswith("# Converted from the upstream AppWrapper operator configuration.")


def test_the_command_reads_stdin_and_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "config.yaml"
    result = CliRunner().invoke(
        app,
        ["config", "convert-upstream", "-", "--output-file", str(out)],
        input=yaml.safe_dump({"appwrapper": {"faultTolerance": {"retryLimit": 2}}}),
    )
    assert result.exit_code == 0, result.output
    assert load_config(out, {}).fault_tolerance.retry_limit == 2


def test_the_command_fails_with_one_line_naming_the_key(tmp_path: Path) -> None:
    source = tmp_path / "upstream.yaml"
    source.write_text("appwrapper:\n  faultTolerance:\n    retryLimit: many\n")
    result = CliRunner().invoke(app, ["config", "convert-upstream", str(source)])
    assert result.exit_code == 1
    assert (
        result.stderr.strip()
        == "error: appwrapper.faultTolerance.retryLimit: expected an integer, got 'many'"
    )


def test_onto_keeps_the_respawn_files_other_keys(tmp_path: Path) -> None:
    source = tmp_path / "upstream.yaml"
    source.write_text(yaml.safe_dump({"appwrapper": {"faultTolerance": {"retryLimit": 8}}}))
    base = tmp_path / "respawn.yaml"
    base.write_text(
        "nats:\n  url: nats://respawn-nats:4222\nfaultTolerance:\n  resetPause: 2m\n  retryLimit: 3\n"
    )
    out = tmp_path / "config.yaml"
    result = CliRunner().invoke(
        app, ["config", "convert-upstream", str(source), "--onto", str(base), "--output-file", str(out)]
    )
    assert result.exit_code == 0, result.output
    loaded = load_config(out, {})
    assert loaded.nats.url == "nats://respawn-nats:4222"
    assert loaded.fault_tolerance.retry_pause_period == timedelta(minutes=2)
    assert loaded.fault_tolerance.retry_limit == 8


def test_the_repositorys_configuration_takes_upstreams_defaults_unchanged() -> None:
    base = (Path(__file__).resolve().parents[2] / "deploy" / "base" / "config" / "config.yaml").read_text()
    merged = convert_text(yaml.safe_dump(UPSTREAM_DEFAULTS), base).validated
    assert merged.fault_tolerance == OperatorConfig().fault_tolerance
    assert merged.nats.url == "nats://respawn-nats:4222"
