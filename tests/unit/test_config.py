from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from shared.config import (
    CONFIG_ENV,
    ConfigError,
    OperatorConfig,
    ResourceTaint,
    env_var_names,
    load_config,
)
from shared.faulttolerance import FaultTolerance


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str = "", **env: str) -> str:
    path = write(tmp_path, text) if text else None
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env)
    return str(info.value)


def test_defaults_match_the_documented_fault_tolerance_parameters() -> None:
    config = load_config(env={})
    assert config.to_fault_tolerance() == FaultTolerance(
        admission_grace=timedelta(minutes=1),
        warmup_grace=timedelta(minutes=5),
        failure_grace=timedelta(minutes=1),
        retry_pause=timedelta(seconds=90),
        retry_limit=3,
        deletion_on_failure_grace=timedelta(0),
        forceful_deletion_grace=timedelta(minutes=10),
        success_ttl=timedelta(days=7),
        grace_period_maximum=timedelta(hours=24),
    )


def test_other_defaults() -> None:
    config = load_config(env={})
    assert config.autopilot.inject_anti_affinities is True
    assert config.autopilot.monitor_nodes is True
    assert config.autopilot.preferred_weight == 50
    # Upstream's built-in map (not the older ERR/EVICT example on its website).
    assert config.autopilot.resource_taints == {
        "nvidia.com/gpu": [
            ResourceTaint(key="autopilot.ibm.com/gpuhealth", value="WARN", effect="PreferNoSchedule"),
            ResourceTaint(key="autopilot.ibm.com/gpuhealth", value="TESTING", effect="NoSchedule"),
            ResourceTaint(key="autopilot.ibm.com/gpuhealth", value="EVICT", effect="NoExecute"),
        ]
    }
    assert (config.node_exclusion.enabled, config.node_exclusion.max_nodes) == (True, 8)
    assert config.default_queue_name == ""
    assert (config.nats.url, config.nats.stream_replicas) == ("nats://localhost:4222", 1)
    assert config.kubeconfig is None
    assert config.metrics_port is None  # /metrics on the probe port
    assert (config.lifecycle.workers, config.lifecycle.verdict_concurrency) == (8, 32)
    assert config.lifecycle.resync_period == timedelta(seconds=30)
    assert config.lifecycle.record_delay == timedelta(seconds=5)
    assert config.watcher.discard_check_period == timedelta(seconds=10)


def test_lifecycle_settings_from_the_environment() -> None:
    config = load_config(
        env={
            "RESPAWN_LIFECYCLE_VERDICT_CONCURRENCY": "4",
            "RESPAWN_LIFECYCLE_WORKERS": "2",
            "RESPAWN_LIFECYCLE_RESYNC_PERIOD": "300ms",
            "RESPAWN_LIFECYCLE_RECORD_DELAY": "0s",
        }
    )
    assert config.lifecycle.record_delay == timedelta(0)
    assert config.lifecycle.verdict_concurrency == 4
    assert config.lifecycle.workers == 2
    assert config.lifecycle.resync_period == timedelta(milliseconds=300)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RESPAWN_LIFECYCLE_RESYNC_PERIOD", "0s", "lifecycle.resyncPeriod: must be positive"),
        ("RESPAWN_LIFECYCLE_VERDICT_CONCURRENCY", "0", "lifecycle.verdictConcurrency"),
        # Beyond the lifecycle stream's duplicate window, a re-sent announcement would be a copy.
        ("RESPAWN_LIFECYCLE_RECORD_DELAY", "90s", r"lifecycle.recordDelay: must be between 0s and 60s"),
        ("RESPAWN_LIFECYCLE_RECORD_DELAY", "-1s", "lifecycle.recordDelay"),
        ("RESPAWN_LIFECYCLE_WORKERS", "many", "lifecycle.workers"),
    ],
)
def test_bad_lifecycle_settings_are_rejected(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={variable: value})


def test_the_watcher_check_period_comes_from_the_environment_and_must_be_positive() -> None:
    config = load_config(env={"RESPAWN_WATCHER_DISCARD_CHECK_PERIOD": "500ms"})
    assert config.watcher.discard_check_period == timedelta(milliseconds=500)
    with pytest.raises(ConfigError, match=r"watcher\.discardCheckPeriod: must be positive"):
        load_config(env={"RESPAWN_WATCHER_DISCARD_CHECK_PERIOD": "0s"})


def test_admission_limits_default_and_come_from_file_or_environment(tmp_path: Path) -> None:
    config = load_config(env={})
    assert (config.admission.max_template_depth, config.admission.max_template_bytes) == (64, 524288)
    path = write(tmp_path, "admission:\n  maxTemplateDepth: 100\n  maxTemplateBytes: 1048576\n")
    config = load_config(path, env={"RESPAWN_ADMISSION_MAX_TEMPLATE_DEPTH": "32"})
    assert (config.admission.max_template_depth, config.admission.max_template_bytes) == (32, 1048576)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        # Past a few hundred levels the webhook's own checks would meet the decoders' limits.
        ("RESPAWN_ADMISSION_MAX_TEMPLATE_DEPTH", "513", "admission.maxTemplateDepth"),
        ("RESPAWN_ADMISSION_MAX_TEMPLATE_DEPTH", "2", "admission.maxTemplateDepth"),
        ("RESPAWN_ADMISSION_MAX_TEMPLATE_BYTES", "512Ki", "admission.maxTemplateBytes"),
        ("RESPAWN_ADMISSION_MAX_TEMPLATE_BYTES", str(9 * 1024 * 1024), "admission.maxTemplateBytes"),
        ("RESPAWN_ADMISSION_MAX_TEMPLATE_SIZE", "1", "unknown environment variable"),
    ],
)
def test_bad_admission_limits_are_rejected(variable: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={variable: value})


def test_yaml_file_uses_upstream_key_names(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
faultTolerance:
  admissionGracePeriod: 30s
  warmupGracePeriod: 10m
  failureGracePeriod: 0s
  resetPause: 1h30m
  retryLimit: 0
  deletionOnFailureGracePeriod: 2h
  deletionGracePeriod: 1m
  gracePeriodCeiling: 48h
  successTTLCeiling: 1h
autopilot:
  injectAntiAffinities: false
  monitorNodes: false
  preferNoScheduleWeight: 7
  resourceTaints:
    example.com/nic:
      - {key: nic.health, value: BAD, effect: NoExecute}
nodeExclusion: {enabled: false, maxNodes: 2}
defaultQueueName: default-queue
nats: {url: "nats://nats:4222", streamReplicas: 3}
kubeconfig: /etc/kube/config
metricsPort: 9000
""",
    )
    config = load_config(path, env={})
    ft = config.to_fault_tolerance()
    assert ft == FaultTolerance(
        admission_grace=timedelta(seconds=30),
        warmup_grace=timedelta(minutes=10),
        failure_grace=timedelta(0),
        retry_pause=timedelta(hours=1, minutes=30),
        retry_limit=0,
        deletion_on_failure_grace=timedelta(hours=2),
        forceful_deletion_grace=timedelta(minutes=1),
        success_ttl=timedelta(hours=1),
        grace_period_maximum=timedelta(hours=48),
    )
    assert config.autopilot.inject_anti_affinities is False
    assert config.autopilot.monitor_nodes is False
    assert config.autopilot.preferred_weight == 7
    assert config.autopilot.resource_taints == {
        "example.com/nic": [ResourceTaint(key="nic.health", value="BAD", effect="NoExecute")]
    }
    assert (config.node_exclusion.enabled, config.node_exclusion.max_nodes) == (False, 2)
    assert config.default_queue_name == "default-queue"
    assert (config.nats.url, config.nats.stream_replicas) == ("nats://nats:4222", 3)
    assert config.kubeconfig == Path("/etc/kube/config")
    assert config.metrics_port == 9000


def test_partial_file_keeps_defaults_for_the_rest(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "faultTolerance:\n  retryLimit: 5\n"), env={})
    assert config.fault_tolerance.retry_limit == 5
    assert config.fault_tolerance.warmup_grace_period == timedelta(minutes=5)
    assert config.nats.stream_replicas == 1


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "# nothing set\n"), env={}) == OperatorConfig()


def test_path_comes_from_respawn_config(tmp_path: Path) -> None:
    path = write(tmp_path, "defaultQueueName: from-file\n")
    assert load_config(env={CONFIG_ENV: str(path)}).default_queue_name == "from-file"


def test_explicit_path_wins_over_respawn_config(tmp_path: Path) -> None:
    path = write(tmp_path, "defaultQueueName: explicit\n")
    other = tmp_path / "other.yaml"
    other.write_text("defaultQueueName: from-env\n")
    assert load_config(path, env={CONFIG_ENV: str(other)}).default_queue_name == "explicit"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, "faultTolerance:\n  retryLimit: 5\n  resetPause: 1m\nnats:\n  url: nats://file:4222\n"
    )
    config = load_config(
        path,
        env={
            "RESPAWN_FAULT_TOLERANCE_RETRY_LIMIT": "7",
            "RESPAWN_FAULT_TOLERANCE_SUCCESS_TTL_CEILING": "2h",
            "RESPAWN_AUTOPILOT_MONITOR_NODES": "false",
            "RESPAWN_AUTOPILOT_RESOURCE_TAINTS": '{"x.io/r": [{key: k, value: v, effect: NoSchedule}]}',
            "RESPAWN_NODE_EXCLUSION_MAX_NODES": "3",
            "RESPAWN_DEFAULT_QUEUE_NAME": "q",
            "RESPAWN_NATS_STREAM_REPLICAS": "5",
            "RESPAWN_KUBECONFIG": "/k",
            "RESPAWN_METRICS_PORT": "0",
            # Belongs to another part of Respawn: ignored here.
            "RESPAWN_LOG_LEVEL": "debug",
        },
    )
    assert config.fault_tolerance.retry_limit == 7
    assert config.fault_tolerance.retry_pause_period == timedelta(minutes=1)  # file value kept
    assert config.fault_tolerance.success_ttl == timedelta(hours=2)
    assert config.autopilot.monitor_nodes is False
    assert config.autopilot.resource_taints == {
        "x.io/r": [ResourceTaint(key="k", value="v", effect="NoSchedule")]
    }
    assert config.node_exclusion.max_nodes == 3
    assert config.default_queue_name == "q"
    assert config.nats.url == "nats://file:4222"
    assert config.nats.stream_replicas == 5
    assert config.kubeconfig == Path("/k")
    assert config.metrics_port == 0


def test_every_leaf_key_has_an_environment_variable() -> None:
    names = env_var_names()
    assert names["RESPAWN_FAULT_TOLERANCE_RESET_PAUSE"] == "faultTolerance.resetPause"
    assert names["RESPAWN_FAULT_TOLERANCE_SUCCESS_TTL_CEILING"] == "faultTolerance.successTTLCeiling"
    assert names["RESPAWN_AUTOPILOT_PREFER_NO_SCHEDULE_WEIGHT"] == "autopilot.preferNoScheduleWeight"
    assert names["RESPAWN_NATS_URL"] == "nats.url"
    assert names["RESPAWN_LIFECYCLE_VERDICT_CONCURRENCY"] == "lifecycle.verdictConcurrency"
    assert names["RESPAWN_FAULT_TOLERANCE_RECREATE_DELAY"] == "faultTolerance.recreateDelay"
    assert names["RESPAWN_ADMISSION_MAX_TEMPLATE_DEPTH"] == "admission.maxTemplateDepth"
    assert names["RESPAWN_ADMISSION_MAX_TEMPLATE_BYTES"] == "admission.maxTemplateBytes"
    assert names["RESPAWN_WATCHER_DISCARD_CHECK_PERIOD"] == "watcher.discardCheckPeriod"
    assert names["RESPAWN_SCALING_MEMBER_TTL"] == "scaling.memberTtl"
    assert names["RESPAWN_FAILURES_PATTERNS"] == "failures.patterns"
    assert names["RESPAWN_FAILURES_TRANSIENT_RETRY_LIMIT"] == "failures.transientRetryLimit"
    assert names["RESPAWN_HEALTH_RESTART_STORM_WINDOW"] == "health.restartStormWindow"
    assert names["RESPAWN_HEALTH_CRASH_LOOP_BACK_OFF"] == "health.crashLoopBackOff"
    assert names["RESPAWN_NODE_QUARANTINE_MAX_SHARE"] == "nodeQuarantine.maxShare"
    assert len([n for n in names if not n.startswith("RESPAWN_NATS_")]) == 50
    assert names["RESPAWN_NATS_PUBLIC_ENCODING"] == "nats.publicEncoding"
    assert len([n for n in names if n.startswith("RESPAWN_NATS_")]) == 28
    assert len(set(names.values())) == len(names)


def test_member_ttl_must_outlast_two_heartbeats() -> None:
    config = load_config(env={"RESPAWN_SCALING_PARTITIONS": "8", "RESPAWN_SCALING_MEMBER_TTL": "3s"})
    assert config.scaling.partitions == 8
    with pytest.raises(ConfigError, match="at least two heartbeats"):
        load_config(env={"RESPAWN_SCALING_HEARTBEAT": "2s", "RESPAWN_SCALING_MEMBER_TTL": "3s"})
    with pytest.raises(ConfigError, match=r"scaling\.partitions"):
        load_config(env={"RESPAWN_SCALING_PARTITIONS": "0"})


def test_documentation_lists_every_key_and_variable() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for env, key in env_var_names().items():
        assert f"`{env}`" in doc
        assert f"`{key}`" in doc


# --- validation errors: one message that names the key ---------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "admissionGracePeriod",
        "warmupGracePeriod",
        "failureGracePeriod",
        "resetPause",
        "deletionOnFailureGracePeriod",
        "deletionGracePeriod",
    ],
)
def test_grace_period_above_the_ceiling_is_rejected(tmp_path: Path, key: str) -> None:
    # admission <= warmup must still hold, so raise warmup alongside admission.
    extra = "  warmupGracePeriod: 25h\n" if key == "admissionGracePeriod" else ""
    message = error_of(tmp_path, f"faultTolerance:\n  {key}: 25h\n{extra}")
    assert f"faultTolerance.{key} (25h0m0s) exceeds faultTolerance.gracePeriodCeiling (24h0m0s)" in message


def test_success_ttl_may_exceed_the_grace_ceiling(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "faultTolerance:\n  successTTLCeiling: 720h\n"), env={})
    assert config.fault_tolerance.success_ttl == timedelta(days=30)


def test_admission_grace_above_warmup_grace_is_rejected(tmp_path: Path) -> None:
    message = error_of(tmp_path, "faultTolerance:\n  admissionGracePeriod: 6m\n")
    assert message == (
        "invalid configuration (file "
        f"{tmp_path / 'config.yaml'}): faultTolerance.admissionGracePeriod (6m0s) exceeds "
        "faultTolerance.warmupGracePeriod (5m0s)"
    )


@pytest.mark.parametrize("ttl", ["0s", "-1h"])
def test_non_positive_success_ttl_is_rejected(tmp_path: Path, ttl: str) -> None:
    assert "faultTolerance.successTTLCeiling must be positive" in error_of(
        tmp_path, RESPAWN_FAULT_TOLERANCE_SUCCESS_TTL_CEILING=ttl
    )


def test_negative_retry_limit_is_rejected(tmp_path: Path) -> None:
    assert "faultTolerance.retryLimit must not be negative, got -1" in error_of(
        tmp_path, "faultTolerance:\n  retryLimit: -1\n"
    )


def test_negative_grace_period_is_rejected(tmp_path: Path) -> None:
    assert "faultTolerance.failureGracePeriod must not be negative, got -5m0s" in error_of(
        tmp_path, "faultTolerance:\n  failureGracePeriod: -5m\n"
    )


def test_unknown_taint_effect_is_rejected(tmp_path: Path) -> None:
    message = error_of(
        tmp_path,
        "autopilot:\n  resourceTaints:\n    nvidia.com/gpu:\n      - {key: k, value: v, effect: NoRun}\n",
    )
    assert 'autopilot.resourceTaints["nvidia.com/gpu"][0].effect' in message
    assert "'NoSchedule', 'PreferNoSchedule' or 'NoExecute'" in message


def test_misspelt_key_is_rejected_with_a_suggestion(tmp_path: Path) -> None:
    message = error_of(tmp_path, "faultTolerance:\n  retryPause: 1m\n")
    assert message.endswith("unknown key 'faultTolerance.retryPause' (did you mean 'resetPause'?)")


def test_unknown_top_level_key_is_rejected(tmp_path: Path) -> None:
    assert "unknown key 'natss' (did you mean 'nats'?)" in error_of(tmp_path, "natss:\n  url: x\n")


def test_misspelt_environment_variable_in_a_section_is_rejected(tmp_path: Path) -> None:
    message = error_of(tmp_path, RESPAWN_NATS_STREAM_REPLICA="3")
    assert message == (
        "unknown environment variable RESPAWN_NATS_STREAM_REPLICA "
        "(did you mean 'RESPAWN_NATS_STREAM_REPLICAS'?)"
    )


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    message = error_of(tmp_path, RESPAWN_NATS_STREAM_REPLICAS="9")
    assert message == (
        "invalid configuration: nats.streamReplicas: Input should be less than or equal to 5 "
        "(set by RESPAWN_NATS_STREAM_REPLICAS)"
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("7d", "no day unit"),
        ("90", "missing unit"),
        ("soon", "invalid Go duration"),
    ],
)
def test_malformed_duration_is_rejected(tmp_path: Path, value: str, why: str) -> None:
    message = error_of(tmp_path, f"faultTolerance:\n  resetPause: '{value}'\n")
    assert message.startswith(
        f"invalid configuration (file {tmp_path / 'config.yaml'}): faultTolerance.resetPause: "
    )
    assert why in message


def test_bare_number_duration_is_refused(tmp_path: Path) -> None:
    # Upstream writes nanoseconds, people mean seconds: neither guess is safe.
    message = error_of(tmp_path, "faultTolerance:\n  resetPause: 90\n")
    assert (
        "faultTolerance.resetPause: expected a Go duration string such as '90s' or '1h30m', got 90" in message
    )


def test_bare_zero_duration_is_accepted(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "faultTolerance:\n  failureGracePeriod: 0\n"), env={})
    assert config.fault_tolerance.failure_grace_period == timedelta(0)


@pytest.mark.parametrize(("key", "value"), [("preferNoScheduleWeight", 0), ("preferNoScheduleWeight", 101)])
def test_preferred_weight_must_be_a_valid_affinity_weight(tmp_path: Path, key: str, value: int) -> None:
    assert f"autopilot.{key}: Input should be" in error_of(tmp_path, f"autopilot:\n  {key}: {value}\n")


def test_missing_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml", env={})


def test_file_that_is_not_a_mapping_is_reported(tmp_path: Path) -> None:
    assert "must hold a mapping of keys, not list" in error_of(tmp_path, "- a\n- b\n")


def test_invalid_yaml_is_reported(tmp_path: Path) -> None:
    assert "is not valid YAML" in error_of(tmp_path, "faultTolerance: [unclosed\n")


def test_all_problems_are_reported_in_one_message(tmp_path: Path) -> None:
    message = error_of(tmp_path, "nats:\n  streamReplicas: 0\nmetricsPort: 70000\n")
    assert "nats.streamReplicas" in message
    assert "metricsPort" in message
    assert "\n" not in message


@given(
    admission=st.integers(0, 3600),
    extra_warmup=st.integers(0, 3600),
    retry_limit=st.integers(0, 100),
)
def test_any_consistent_setting_round_trips_into_fault_tolerance(
    admission: int, extra_warmup: int, retry_limit: int
) -> None:
    env = {
        "RESPAWN_FAULT_TOLERANCE_ADMISSION_GRACE_PERIOD": f"{admission}s",
        "RESPAWN_FAULT_TOLERANCE_WARMUP_GRACE_PERIOD": f"{admission + extra_warmup}s",
        "RESPAWN_FAULT_TOLERANCE_RETRY_LIMIT": str(retry_limit),
    }
    ft = load_config(env=env).to_fault_tolerance()
    assert ft.admission_grace == timedelta(seconds=admission)
    assert ft.warmup_grace == timedelta(seconds=admission + extra_warmup)
    assert ft.retry_limit == retry_limit


# --- nats: the bus ------------------------------------------------------------------------------


def test_nats_stream_limit_defaults_are_the_bus_defaults() -> None:
    from shared.bus import DEFAULT_LIMITS

    assert load_config(env={}).nats.streams.by_stream() == dict(DEFAULT_LIMITS)


def test_the_documented_complete_file_holds_the_nats_defaults() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = OperatorConfig.model_validate(yaml.safe_load(block))
    assert documented.nats == OperatorConfig().nats


def test_nats_defaults_have_no_tls_and_no_credential_files() -> None:
    nats = load_config(env={}).nats
    assert nats.tls.to_files() is None
    assert (nats.creds_file, nats.nkey_seed_file) == (None, None)
    assert nats.tombstone_ttl == timedelta(hours=24)
    # JSON, so that `nats consumer next` on a public stream prints what it reads.
    assert nats.public_encoding == "json"


def test_nats_tls_credentials_and_limits_from_file_and_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
nats:
  credsFile: /etc/nats/respawn.creds
  tls: {caFile: /etc/nats/ca.crt, certFile: /etc/nats/tls.crt, keyFile: /etc/nats/tls.key}
  tombstoneTTL: 2h
  publicEncoding: cloudevents
  streams:
    observations: {maxBytes: 4GiB}
    verdicts: {maxMsgsPerSubject: 16, maxAge: 168h}
""",
    )
    config = load_config(
        path,
        env={
            "RESPAWN_NATS_TLS_SERVER_NAME": "nats.example",
            "RESPAWN_NATS_STREAMS_DEAD_LETTER_MAX_MSGS": "500",
        },
    ).nats
    files = config.tls.to_files()
    assert files is not None
    assert (files.ca_file, files.cert_file, files.key_file, files.server_name) == (
        Path("/etc/nats/ca.crt"),
        Path("/etc/nats/tls.crt"),
        Path("/etc/nats/tls.key"),
        "nats.example",
    )
    assert config.creds_file == Path("/etc/nats/respawn.creds")
    assert config.tombstone_ttl == timedelta(hours=2)
    assert config.public_encoding == "cloudevents"
    limits = config.streams.by_stream()
    assert limits["RESPAWN_OBSERVATIONS"].max_bytes == 4 * 1024**3
    assert limits["RESPAWN_OBSERVATIONS"].max_msgs == 1_000_000  # the rest keep the stream's defaults
    assert limits["RESPAWN_VERDICTS"].max_msgs_per_subject == 16
    assert limits["RESPAWN_VERDICTS"].max_age == 7 * 24 * 3600
    assert limits["RESPAWN_DEAD_LETTER"].max_msgs == 500


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RESPAWN_NATS_TLS_CERT_FILE": "/c"}, "nats.tls: certFile and keyFile go together"),
        (
            {"RESPAWN_NATS_CREDS_FILE": "/a", "RESPAWN_NATS_NKEY_SEED_FILE": "/b"},
            "nats: set credsFile or nkeySeedFile, not both",
        ),
        ({"RESPAWN_NATS_TOMBSTONE_TTL": "500ms"}, "nats.tombstoneTTL: must be at least 1s"),
        (
            {"RESPAWN_NATS_PUBLIC_ENCODING": "xml"},
            "nats.publicEncoding: Input should be 'json', 'cloudevents' or 'msgpack'",
        ),
        (
            {"RESPAWN_NATS_STREAMS_LIFECYCLE_MAX_AGE": "-1h"},
            "nats.streams.lifecycle.maxAge: must not be negative",
        ),
        (
            {"RESPAWN_NATS_STREAMS_VERDICTS_MAX_MSGS_PER_SUBJECT": "0"},
            "nats.streams.verdicts.maxMsgsPerSubject",
        ),
        ({"RESPAWN_NATS_STREAMS_OBSERVATIONS_MAX_MSGS": "-1"}, "nats.streams.observations.maxMsgs"),
        ({"RESPAWN_NATS_STREAMS_OBSERVATIONS_MAX_BYTES": "lots"}, "nats.streams.observations.maxBytes"),
    ],
)
def test_bad_nats_settings_are_rejected(tmp_path: Path, env: dict[str, str], message: str) -> None:
    assert message in error_of(tmp_path, **env)


def test_per_subject_history_is_no_setting_of_the_latest_state_streams(tmp_path: Path) -> None:
    message = error_of(tmp_path, "nats:\n  streams:\n    observations: {maxMsgsPerSubject: 5}\n")
    assert "unknown key 'nats.streams.observations.maxMsgsPerSubject'" in message


def test_empty_nats_file_settings_mean_unset(tmp_path: Path) -> None:
    config = load_config(env={"RESPAWN_NATS_CREDS_FILE": "", "RESPAWN_NATS_TLS_CA_FILE": ""})
    assert config.nats.creds_file is None
    assert config.nats.tls.to_files() is None
