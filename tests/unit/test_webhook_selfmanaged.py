"""Self-managed mode's options and local side (services/webhook/server.py, selfmanaged.py): the
flags and variables that turn it on, the Secret data it reads, the files it writes and that the
server then serves; and the NATS users it creates the Secret for (shared/natsusers.py). What it
does against an API server is in tests/integration/test_webhook_selfmanaged.py."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from respawn import natsauth
from services.webhook import certs
from services.webhook.selfmanaged import SelfManaged, SelfManagedOptions, decoded
from services.webhook.server import ServingCert, parse_options
from shared import natsusers

REPO = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_self_managed_mode_is_off_unless_asked_for() -> None:
    assert parse_options([], {}).self_managed is None
    assert parse_options([], {"RESPAWN_WEBHOOK_SELF_MANAGED_CERT": "false"}).self_managed is None


def test_self_managed_options_from_flags() -> None:
    options = parse_options(
        [
            "--self-managed-cert",
            "--namespace=ns",
            "--cert-file=/w/tls.crt",
            "--key-file=/w/tls.key",
            "--cert-host=127.0.0.1",
            "--cert-host=webhook.example",
            "--nats-users-secret=respawn-nats-users",
        ],
        {},
    )
    assert options.self_managed == SelfManagedOptions(
        namespace="ns",
        cert_secret="respawn-webhook-cert",
        service="respawn-webhook",
        configuration="respawn-appwrapper",
        extra_hosts=("127.0.0.1", "webhook.example"),
        nats_users_secret="respawn-nats-users",
        cert_file=Path("/w/tls.crt"),
        key_file=Path("/w/tls.key"),
    )
    assert options.self_managed.hosts == (
        "respawn-webhook.ns.svc",
        "respawn-webhook.ns.svc.cluster.local",
        "127.0.0.1",
        "webhook.example",
    )


def test_self_managed_options_from_the_environment() -> None:
    env = {
        "RESPAWN_WEBHOOK_SELF_MANAGED_CERT": "true",
        "RESPAWN_WEBHOOK_NAMESPACE": "ns",
        "RESPAWN_WEBHOOK_CERT_SECRET": "cert",
        "RESPAWN_WEBHOOK_SERVICE_NAME": "svc",
        "RESPAWN_WEBHOOK_CONFIGURATION": "conf",
        "RESPAWN_WEBHOOK_CERT_HOSTS": "127.0.0.1, ::1,",
        "RESPAWN_WEBHOOK_NATS_USERS_SECRET": "users",
    }
    managed = parse_options([], env).self_managed
    assert managed is not None
    assert (managed.namespace, managed.cert_secret, managed.service, managed.configuration) == (
        "ns",
        "cert",
        "svc",
        "conf",
    )
    assert managed.extra_hosts == ("127.0.0.1", "::1")
    assert managed.nats_users_secret == "users"
    # A flag wins over its variable.
    assert parse_options(["--cert-host=h"], env).self_managed.extra_hosts == ("h",)  # type: ignore[union-attr]
    without_users = {k: v for k, v in env.items() if k != "RESPAWN_WEBHOOK_NATS_USERS_SECRET"}
    assert parse_options(["--self-managed-cert=false"], without_users).self_managed is None


def test_self_managed_mode_needs_a_namespace_and_nats_users_need_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_options(["--self-managed-cert"], {})
    assert "--self-managed-cert needs --namespace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options(["--nats-users-secret=respawn-nats-users"], {})
    assert "--nats-users-secret is part of the self-managed mode" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_options([], {"RESPAWN_WEBHOOK_SELF_MANAGED_CERT": "maybe"})


def test_secret_data_is_decoded_and_what_does_not_decode_is_left_out() -> None:
    assert decoded(None) is None
    assert decoded({"metadata": {}}) == {}
    secret = {"data": {"a": base64.b64encode(b"x").decode(), "b": "%%%"}}
    assert decoded(secret) == {"a": b"x"}


def options(tmp_path: Path) -> SelfManagedOptions:
    return SelfManagedOptions(
        namespace="ns",
        cert_secret="respawn-webhook-cert",
        service="respawn-webhook",
        configuration="respawn-appwrapper",
        extra_hosts=(),
        nats_users_secret="",
        cert_file=tmp_path / "certs" / "tls.crt",
        key_file=tmp_path / "certs" / "tls.key",
    )


def test_the_files_are_written_only_when_they_change_and_the_server_serves_them(tmp_path: Path) -> None:
    opts = options(tmp_path)
    managed = SelfManaged(kube=None, options=opts)  # type: ignore[arg-type]  # files only, no API
    first = certs.issue(None, certs.Need.CA, opts.hosts, NOW)
    assert managed.write_files(first)
    assert opts.cert_file.read_bytes() == first[certs.CERT]
    assert opts.key_file.read_bytes() == first[certs.KEY]
    assert opts.key_file.stat().st_mode & 0o077 == 0  # the key is the owner's only
    served = ServingCert(opts.cert_file, opts.key_file)
    assert not managed.write_files(first)
    assert not served.reload_if_changed()
    renewed = certs.issue(first, certs.Need.SERVING, opts.hosts, NOW)
    assert managed.write_files(renewed)
    assert served.reload_if_changed()
    assert not list(opts.cert_file.parent.glob(".*.tmp"))


def test_the_release_runs_the_webhook_in_self_managed_mode_with_the_names_of_its_rbac() -> None:
    component = REPO / "deploy" / "webhook" / "self-managed"
    patch = yaml.safe_load((component / "deployment.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    managed = parse_options(container["args"], {"RESPAWN_WEBHOOK_NAMESPACE": "respawn-system"}).self_managed
    assert managed is not None
    rbac = list(yaml.safe_load_all((component / "rbac.yaml").read_text()))
    role = next(d for d in rbac if d["kind"] == "Role")
    named = {name: set(rule["verbs"]) for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert named == {managed.cert_secret: {"get", "update"}, managed.nats_users_secret: {"get"}}
    unnamed = [rule for rule in role["rules"] if "resourceNames" not in rule]
    assert unnamed == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    configurations = next(d for d in rbac if d["kind"] == "ClusterRole")
    (rule,) = configurations["rules"]
    assert rule["resourceNames"] == [managed.configuration]
    assert set(rule["verbs"]) == {"get", "patch"}
    # The certificate names the Service the configurations call.
    service = yaml.safe_load((REPO / "deploy" / "webhook" / "service.yaml").read_text())
    assert managed.service == service["metadata"]["name"]
    assert (container["args"][1], container["args"][2]) == (
        f"--cert-file={managed.cert_file}",
        f"--key-file={managed.key_file}",
    )


def test_nats_users_are_those_the_generator_and_the_manifests_know() -> None:
    assert tuple(u.name for u in natsauth.default_users()) == natsusers.DEFAULT_USERS
    assert natsusers.SECRET_NAME == natsauth.SECRET_NAME
    statefulset = yaml.safe_load((REPO / "deploy" / "nats" / "statefulset.yaml").read_text())
    (nats,) = statefulset["spec"]["template"]["spec"]["containers"]
    keys: set[Any] = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for e in nats["env"]
        if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == natsusers.SECRET_NAME
    }
    assert keys == set(natsusers.DEFAULT_USERS)


def test_generated_nats_passwords_are_ones_nats_server_reads_back_as_strings() -> None:
    passwords = {natsusers.generate_password() for _ in range(200)}
    assert len(passwords) == 200
    for password in passwords:
        assert natsauth.validate_password("u", password) == password
        assert len(password) == 44


def test_a_served_certificate_is_verified_by_the_bundle_alone(tmp_path: Path) -> None:
    # What the API server does with caBundle: trust the bundle, check the name.
    opts = options(tmp_path)
    data = certs.issue(None, certs.Need.CA, (*opts.hosts, "127.0.0.1"), NOW - dt.timedelta(days=1))
    context = ssl.create_default_context(cadata=data[certs.CA_CERT].decode())
    assert context.get_ca_certs()[0]["subject"] == ((("commonName", certs.CA_NAME),),)
