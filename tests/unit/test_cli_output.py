"""What every `respawn` command shares: -o, --json, -n/-A, --version, completion, exit codes;
and the retry-limit default read from Respawn's Deployment as deploy/ installs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from respawn.cli import clusterconfig, output, status, tail
from respawn.cli import main as cli_main
from respawn.cli.main import app
from respawn.testbed import manifests
from shared.appwrapper.params import RETRY_LIMIT_ANNOTATION
from shared.config import ConfigError, OperatorConfig

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env)


# ------------------------------------------------------------------------------------ -o / --json


@pytest.mark.parametrize(
    ("flag", "as_json", "expected"),
    [
        (None, False, output.Format.TABLE),
        (None, True, output.Format.JSON),
        ("table", False, output.Format.TABLE),
        ("wide", False, output.Format.WIDE),
        ("json", False, output.Format.JSON),
        ("JSON", False, output.Format.JSON),
        ("yaml", False, output.Format.YAML),
        ("json", True, output.Format.JSON),
    ],
)
def test_output_format_from_o_and_the_deprecated_json_flag(
    flag: str | None, as_json: bool, expected: output.Format
) -> None:
    assert output.resolve_output(flag, as_json) is expected


def test_an_unknown_format_or_json_with_another_format_is_a_usage_error() -> None:
    with pytest.raises(output.UsageError, match="unknown output format 'xml'; use one of table, wide, json"):
        output.resolve_output("xml")
    with pytest.raises(output.UsageError, match=r"--json .* cannot go with -o yaml"):
        output.resolve_output("yaml", as_json=True)
    assert output.UsageError("x").exit_code == 2


def test_yaml_document_keeps_the_json_keys_in_order_and_reads_back_the_same() -> None:
    doc = {"version": output.CLI_OUTPUT_VERSION, "b": [1, {"x": None}], "a": "ü"}
    text = output.document(doc, output.Format.YAML)
    assert text.splitlines()[0] == "version: respawn.cli/v1"
    assert [line.split(":")[0] for line in text.splitlines() if not line.startswith((" ", "-"))] == [
        "version",
        "b",
        "a",
    ]
    assert yaml.safe_load(text) == doc
    assert json.loads(output.document(doc, output.Format.JSON)) == doc
    assert "\n" not in output.document(doc, output.Format.JSON)


# ------------------------------------------------------------------------------------ -n / -A


def test_namespace_follows_kubectl_n_then_a_then_the_context() -> None:
    assert output.resolve_namespace("x", False, "ctx").namespace == "x"
    assert output.resolve_namespace(None, True, "ctx").all
    assert output.resolve_namespace(None, False, "ctx").namespace == "ctx"
    with pytest.raises(output.UsageError, match="cannot be combined"):
        output.resolve_namespace("x", True, "ctx")
    with pytest.raises(output.UsageError, match="use -n, not --all-namespaces"):
        output.resolve_namespace(None, True, "ctx", name="one")


def test_default_namespace_is_the_first_existing_kubeconfigs_context_else_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kc = tmp_path / "kc"
    kc.write_text("current-context: a\ncontexts:\n- name: a\n  context: {namespace: team-a}\n")
    assert output.default_namespace(f"{tmp_path / 'missing'}:{kc}") == "team-a"
    assert output.default_namespace(None) == "default"
    home = tmp_path / ".kube" / "config"
    home.parent.mkdir()
    home.write_text("current-context: b\ncontexts:\n- name: b\n  context: {namespace: team-b}\n")
    assert output.default_namespace(None) == "team-b"


def test_explain_takes_ns_slash_name_or_a_name_in_the_namespace_of_n_or_the_context() -> None:
    from respawn.cli.explain import resolve_target

    assert resolve_target("a/b", None, "ctx") == ("a", "b")
    assert resolve_target("a/b", "a", "ctx") == ("a", "b")
    assert resolve_target("b", "x", "ctx") == ("x", "b")
    assert resolve_target("b", None, "ctx") == ("ctx", "b")
    with pytest.raises(output.UsageError, match="in namespace a, not c"):
        resolve_target("a/b", "c", "ctx")


def test_tail_without_n_reads_the_contexts_namespace_and_with_a_every_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    async def fake_tail(kind: str, url: str | None, namespace: str | None, *rest: Any) -> None:
        seen.append(namespace)

    monkeypatch.setattr(tail, "_tail", fake_tail)
    kc = tmp_path / "kc"
    kc.write_text("current-context: a\ncontexts:\n- name: a\n  context: {namespace: team-a}\n")
    env = {"KUBECONFIG": str(kc), "NATS_URL": "nats://127.0.0.1:1", "HOME": str(tmp_path)}
    for args in (["tail", "verdicts"], ["tail", "verdicts", "-A"], ["tail", "verdicts", "-n", "x"]):
        result = invoke(*args, env=env)
        assert result.exit_code == 0, result.output
    assert seen == ["team-a", None, "x"]


# ------------------------------------------------------------------------------------ status -o


def kubeconfig(tmp_path: Path, namespace: str = "team-a") -> Path:
    kc = tmp_path / "kubeconfig"
    kc.write_text(f"current-context: a\ncontexts:\n- name: a\n  context: {{namespace: {namespace}}}\n")
    return kc


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, str | None]]:
    """`status` with the cluster replaced by two AppWrappers and a deployed retry limit of 6;
    records which namespace and name it was asked for."""
    asked: list[tuple[str | None, str | None]] = []
    deployed = clusterconfig.ConfigSource(
        OperatorConfig.model_validate({"faultTolerance": {"retryLimit": 6}}),
        "cluster",
        "ConfigMap respawn-system/respawn-config-abc",
    )

    async def fake_load(path: Any, namespace: Any, name: Any, config: Any, respawn_ns: Any) -> Any:
        asked.append((namespace, name))
        items = [
            manifests.appwrapper("a", namespace="team-a", annotations={RETRY_LIMIT_ANNOTATION: "2"}),
            manifests.appwrapper("b", namespace="team-a"),
        ]
        return status.Loaded(items, deployed)

    monkeypatch.setattr(status, "_load", fake_load)
    return asked


def test_status_yaml_and_json_are_the_same_versioned_document(tmp_path: Path, loaded: list[Any]) -> None:
    env = {"KUBECONFIG": str(kubeconfig(tmp_path)), "NATS_URL": ""}
    as_json = json.loads(invoke("status", "-o", "json", env=env).stdout)
    as_yaml = yaml.safe_load(invoke("status", "-o", "yaml", env=env).stdout)
    for doc in (as_json, as_yaml):
        doc["appwrappers"] = [{**r, "lastTransitionAgeSeconds": None} for r in doc["appwrappers"]]
    assert as_json == as_yaml
    assert as_json["version"] == "respawn.cli/v1"
    assert [(r["name"], r["retryLimit"], r["retryLimitSource"]) for r in as_json["appwrappers"]] == [
        ("a", 2, "annotation"),
        ("b", 6, "cluster"),
    ]
    assert as_json["retryLimitDefault"] == {
        "retryLimit": 6,
        "source": "cluster",
        "from": "ConfigMap respawn-system/respawn-config-abc",
        "clusterError": None,
    }


def test_status_wide_adds_where_each_limit_comes_from(tmp_path: Path, loaded: list[Any]) -> None:
    env = {"KUBECONFIG": str(kubeconfig(tmp_path)), "NATS_URL": "", "COLUMNS": "200"}
    plain = invoke("status", env=env).stdout.splitlines()
    wide = invoke("status", "-o", "wide", env=env).stdout.splitlines()
    assert plain[0].split() == ["NAMESPACE", "NAME", "PHASE", "ATTEMPTS", "UNHEALTHY", "LAST", "TRANSITION"]
    assert wide[0].split()[-4:] == ["LIMIT", "FROM", "TRANSITION", "TIME"]
    assert plain[1].split()[:4] == ["team-a", "a", "-", "0/2"]
    assert wide[1].split()[:4] == ["team-a", "a", "-", "0/2"] and wide[1].split()[-2] == "annotation"
    assert plain[2].split()[:4] == ["team-a", "b", "-", "0/6"] and wide[2].split()[-2] == "cluster"


def test_status_reads_the_contexts_namespace_unless_told_otherwise(tmp_path: Path, loaded: list[Any]) -> None:
    env = {"KUBECONFIG": str(kubeconfig(tmp_path, "team-a")), "NATS_URL": ""}
    for args in ([], ["-A"], ["-n", "x"], ["one"], ["one", "-n", "x"]):
        assert invoke("status", *args, "-o", "json", env=env).exit_code == 0
    assert loaded == [("team-a", None), (None, None), ("x", None), ("team-a", "one"), ("x", "one")]


def test_a_rows_limit_is_the_annotations_when_it_is_used_else_the_defaults_source() -> None:
    from shared.faulttolerance import FaultTolerance

    def row(value: str | None) -> tuple[int, str]:
        annotations = {RETRY_LIMIT_ANNOTATION: value} if value is not None else {}
        r = status.status_row(manifests.appwrapper("a", annotations=annotations), FaultTolerance(), "cluster")
        return r.retry_limit, r.retry_limit_source

    assert row("5") == (5, "annotation")
    assert row("3") == (3, "annotation")  # the same as the default, and still the annotation's
    assert row("x") == (3, "cluster")  # malformed: ignored
    assert row(None) == (3, "cluster")


# ------------------------------------------------------------------------------------ the rest


def test_version_prints_the_packages_version() -> None:
    import tomllib

    result = invoke("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (result.exit_code, result.stdout) == (0, f"respawn {version}\n")


# A line only that shell's script has.
SHELL_MARKS = {
    "bash": "complete -o default -F _respawn_completion respawn",
    "zsh": "#compdef respawn",
    "fish": "complete --command respawn",
    "powershell": "Register-ArgumentCompleter",
}


@pytest.mark.parametrize("shell", sorted(SHELL_MARKS))
def test_show_completion_emits_the_script_of_the_shell_it_names(
    shell: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Whatever shell this runs under (or none, under a service manager): the named one counts.
    monkeypatch.setattr(sys, "argv", ["respawn", "--show-completion", shell])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert SHELL_MARKS[shell] in out
    assert all(mark not in out for other, mark in SHELL_MARKS.items() if other != shell)
    # The script calls the program back with its completion variable set.
    assert "_RESPAWN_COMPLETE" in out


def test_only_a_named_shell_is_taken_by_respawn_itself() -> None:
    assert cli_main.completion_script(["--show-completion", "tcsh"]) is None
    assert cli_main.completion_script(["--show-completion"]) is None
    assert cli_main.completion_script(["status", "--show-completion", "bash"]) is None


def test_ctrl_c_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tail, "_tail", interrupted)
    monkeypatch.setattr(status, "_load", interrupted)
    env = {"KUBECONFIG": str(kubeconfig(tmp_path)), "NATS_URL": "nats://127.0.0.1:1"}
    assert invoke("tail", "verdicts", "-A", env=env).exit_code == 130
    assert invoke("status", env=env).exit_code == 130


def test_every_documented_exit_code_is_distinct() -> None:
    codes = [
        output.EXIT_OK,
        output.EXIT_FAILURE,
        output.EXIT_USAGE,
        output.EXIT_NOT_FOUND,
        output.EXIT_UNAVAILABLE,
        output.EXIT_INTERRUPTED,
    ]
    assert codes == [0, 1, 2, 3, 4, 130]
    docs = (REPO / "docs" / "cli.md").read_text()
    for code in codes:
        assert f"| `{code}` |" in docs, code


# ------------------------------------------------------------------------------------ cluster config


def deployed(overrides: dict[str, str] | None = None, config_text: str | None = None) -> tuple[Any, Any]:
    """lifecycle's Deployment of deploy/base and the ConfigMaps kustomize would generate for it,
    under hashed names as kustomize gives them."""
    docs = list(yaml.safe_load_all((REPO / "deploy/base/services/lifecycle.yaml").read_text()))
    [deployment] = [d for d in docs if d and d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    for volume in spec["volumes"]:
        if volume.get("configMap", {}).get("name") == "respawn-config":
            volume["configMap"]["name"] = "respawn-config-5f7h2"
    [container] = spec["containers"]
    for source in container["envFrom"]:
        source["configMapRef"]["name"] = "respawn-env-9k2b4"
    text = config_text or (REPO / "deploy/base/config/config.yaml").read_text()
    configmaps = {
        "respawn-config-5f7h2": {"data": {"config.yaml": text}},
        "respawn-env-9k2b4": {"data": {"RESPAWN_NATS_STREAM_REPLICAS": "3", **(overrides or {})}},
    }
    return deployment, configmaps


def test_the_deployed_config_is_the_configmap_file_lifecycle_mounts() -> None:
    deployment, configmaps = deployed(config_text="faultTolerance: {retryLimit: 7}\n")
    assert clusterconfig.configmaps_of(deployment) == ["respawn-config-5f7h2", "respawn-env-9k2b4"]
    source = clusterconfig.deployed_config(deployment, configmaps, "respawn-system")
    assert source.config.fault_tolerance.retry_limit == 7
    assert (source.kind, source.origin) == ("cluster", "ConfigMap respawn-system/respawn-config-5f7h2")
    # deploy/base's own file: upstream's default, 3.
    deployment, configmaps = deployed()
    assert clusterconfig.deployed_config(deployment, configmaps, "ns").config.fault_tolerance.retry_limit == 3


def test_the_deployments_environment_overrides_the_file_as_in_the_container() -> None:
    deployment, configmaps = deployed(
        {"RESPAWN_FAULT_TOLERANCE_RETRY_LIMIT": "9"}, "faultTolerance: {retryLimit: 7}"
    )
    source = clusterconfig.deployed_config(deployment, configmaps, "respawn-system")
    assert source.config.fault_tolerance.retry_limit == 9


def test_an_unreadable_deployed_config_says_why() -> None:
    deployment, configmaps = deployed()
    del configmaps["respawn-config-5f7h2"]
    with pytest.raises(ConfigError, match="ConfigMap ns/respawn-config-5f7h2 does not exist"):
        clusterconfig.deployed_config(deployment, configmaps, "ns")
    deployment, configmaps = deployed(config_text="faultTolerance: {retryLimit: -1}\n")
    with pytest.raises(ConfigError, match=r"ConfigMap ns/respawn-config-5f7h2.*retryLimit"):
        clusterconfig.deployed_config(deployment, configmaps, "ns")


def test_the_fallback_note_names_the_local_value_and_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESPAWN_CONFIG", raising=False)
    source = clusterconfig.local_config(None)
    assert source.kind == "builtin"
    note = status.fallback_note(
        clusterconfig.ConfigSource(source.config, "builtin", "", "deployments is forbidden"), "respawn-system"
    )
    assert note == (
        "respawn: the default retry limit (3, from the built-in default) is not the cluster's: "
        "cannot read Respawn's configuration in namespace respawn-system: deployments is forbidden"
    )
