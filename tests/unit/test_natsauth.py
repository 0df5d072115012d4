"""The NATS users and permissions generator (respawn/natsauth.py) and the files built from it.

What the permissions allow on a real server is proven in tests/integration/test_nats_permissions.py;
these tests pin the rules themselves: who may publish which message subjects, that each stream has
one owner, that lifecycle's durables are its alone, that every consumer in the services' code is
permitted, that nobody may subscribe to a stream's subjects, and that the committed files match the
generator.
"""

from __future__ import annotations

import ast
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from respawn import natsauth
from shared import subjects
from shared.bus import default_streams
from shared.bus.membership import MEMBERS_BUCKET
from shared.messages import QUARANTINE_RESOURCE

REPO = Path(__file__).resolve().parents[2]
AUTH_CONF = REPO / "deploy" / "nats" / "auth.conf"

# Kubernetes-ish names, including the characters subjects.token escapes.
names = st.text(alphabet="abz09-.*>% ", min_size=0, max_size=10)

# Every kind of message subject, by the service that alone may publish it.
PRODUCERS: dict[str, list[Callable[[str, str], str]]] = {
    "watcher": [
        lambda a, b: subjects.appwrapper_obs(a, b, "pod", b),
        lambda a, b: subjects.appwrapper_obs(a, b, "appwrapper", b),
        lambda a, b: subjects.appwrapper_obs(a, b, "component", a),
        lambda a, _: subjects.node_obs(a),
    ],
    "health": [subjects.verdict],
    "lifecycle": [subjects.lifecycle_event],
    "autopilot": [lambda a, _: subjects.node_verdict(a)],
}


def message_subjects(a: str, b: str) -> list[tuple[str, str]]:
    """(producer, subject) for every message subject built from the names ``a`` and ``b``."""
    return [(producer, build(a, b)) for producer, builders in PRODUCERS.items() for build in builders]


# ------------------------------------------------------------------ subject matching


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),  # '>' needs at least one more token
        ("a.*.c", "a.x.c", True),
        ("a.*.c", "a.x.d", False),
        ("$JS.API.CONSUMER.CREATE.S.>", "$JS.API.CONSUMER.CREATE.S.name.respawn.obs.v1.aw.*.*.>", True),
        ("$JS.API.CONSUMER.CREATE.S", "$JS.API.CONSUMER.CREATE.S.name", False),
        ("a.b", "a.*", False),  # a wildcard in the subject is only a literal token here
    ],
)
def test_subject_matches_follows_nats_wildcards(pattern: str, subject: str, expected: bool) -> None:
    assert natsauth.subject_matches(pattern, subject) is expected


# ------------------------------------------------------------------ who may publish what


@given(a=names, b=names)
def test_each_service_publishes_only_its_own_messages(a: str, b: str) -> None:
    for service in natsauth.SERVICES:
        perms = natsauth.service_permissions(service)
        for producer, subject in message_subjects(a, b):
            assert perms.may_publish(subject) is (producer == service), (service, subject)


@given(a=names, b=names)
def test_subscriber_publishes_no_message(a: str, b: str) -> None:
    perms = natsauth.subscriber_permissions()
    for _, subject in message_subjects(a, b):
        assert not perms.may_publish(subject), subject
    for service in (*natsauth.SERVICES, a):
        assert not perms.may_publish(subjects.dead_letter(service))


def test_every_service_may_dead_letter_only_under_its_own_bus_name() -> None:
    # Bus.connect(name=f"respawn-{service}") names the dead-letter subject (shared/runtime.py);
    # the consumers dead-letter what they cannot process, the watcher what it cannot publish.
    for service in natsauth.SERVICES:
        perms = natsauth.service_permissions(service)
        for other in natsauth.SERVICES:
            allowed = perms.may_publish(subjects.dead_letter(f"respawn-{other}"))
            assert allowed is (other == service), (service, other)


@pytest.mark.parametrize("stream", [s.name for s in default_streams()])
def test_subscriber_reaches_only_its_mirrors_of_the_public_streams(stream: str) -> None:
    # Everything the reader is allowed happens in its own account, on the copies of the public
    # streams kept there; the internal streams have no copy, so nothing names them.
    perms = natsauth.subscriber_permissions()
    public = stream in natsauth.PUBLIC_STREAMS
    for op in ("INFO", "CREATE", "UPDATE", "DELETE", "MSG.GET"):
        assert perms.may_publish(f"$JS.API.STREAM.{op}.{stream}") is public, op
    for op in ("PURGE", "MSG.DELETE"):
        assert not perms.may_publish(f"$JS.API.STREAM.{op}.{stream}"), op
    assert perms.may_publish(f"$JS.API.CONSUMER.CREATE.{stream}") is public
    assert perms.may_publish(f"$JS.API.CONSUMER.CREATE.{stream}.mine.respawn.>") is public
    assert perms.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.mine") is public
    assert perms.may_publish(f"$JS.ACK.{stream}.mine.1.2.3.4.0") is public


def test_readers_live_in_accounts_of_their_own() -> None:
    users = natsauth.default_users(("subscriber", "team-dash"))
    accounts = {u.name: u.account for u in users}
    assert accounts == {
        **{service: natsauth.ACCOUNT for service in natsauth.SERVICES},
        "subscriber": "READER_SUBSCRIBER",
        "team-dash": "READER_TEAM_DASH",
    }
    # A reader cannot even ask for the prefix under which its account sees Respawn's API.
    perms = natsauth.subscriber_permissions()
    assert not perms.may_publish(f"{natsauth.MIRROR_API_PREFIX}.CONSUMER.CREATE.{subjects.VERDICTS_STREAM}")
    assert not perms.may_publish(f"{natsauth.mirror_deliver_prefix('subscriber')}.M.abc")


@pytest.mark.parametrize("service", natsauth.SERVICES)
def test_services_cannot_delete_or_purge_streams(service: str) -> None:
    perms = natsauth.service_permissions(service)
    for stream in (s.name for s in default_streams()):
        for op in ("DELETE", "PURGE", "MSG.DELETE"):
            assert not perms.may_publish(f"$JS.API.STREAM.{op}.{stream}")
        # Every service sets the streams up at start (Bus.ensure_streams), in any order.
        assert perms.may_publish(f"$JS.API.STREAM.INFO.{stream}")
        assert perms.may_publish(f"$JS.API.STREAM.CREATE.{stream}")


@pytest.mark.parametrize("service", natsauth.SERVICES)
def test_each_services_replicas_may_heartbeat_only_under_their_own_group(service: str) -> None:
    # shared/bus/membership.py: a put (heartbeat) or delete (clean stop) of <group>.<member>.
    perms = natsauth.service_permissions(service)
    for other in natsauth.SERVICES:
        for member in ("pod-7c9f", "host-1234"):
            key = f"$KV.{MEMBERS_BUCKET}.{other}.{member}"
            assert perms.may_publish(key) is (other == service), (service, key)
    assert not perms.may_publish(f"$KV.{MEMBERS_BUCKET}.anything")
    assert not perms.may_publish("$KV.OTHER_BUCKET.health.x")


@pytest.mark.parametrize("service", natsauth.SERVICES)
def test_every_service_may_set_up_and_watch_the_members_bucket(service: str) -> None:
    perms = natsauth.service_permissions(service)
    stream = natsauth.MEMBERS_STREAM
    assert stream == f"KV_{MEMBERS_BUCKET}"
    # The bucket is created by whichever replica starts first, and watched by a push consumer
    # without flow control: created without a name in the subject, asked for its state.
    for allowed in (
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.INFO.{stream}.ABCdef123",
        f"$JS.API.CONSUMER.DELETE.{stream}.ABCdef123",
    ):
        assert perms.may_publish(allowed), (service, allowed)
    # Nobody changes, deletes or purges the bucket, nor reads it any other way.
    for refused in (
        f"$JS.API.STREAM.UPDATE.{stream}",
        f"$JS.API.STREAM.DELETE.{stream}",
        f"$JS.API.STREAM.PURGE.{stream}",
        f"$JS.API.STREAM.MSG.DELETE.{stream}",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.x",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.x",
        f"$JS.FC.{stream}.abc.1",
    ):
        assert not perms.may_publish(refused), (service, refused)
    # The watch delivers to an inbox, never to the bucket's own subjects.
    assert not perms.may_subscribe(f"$KV.{MEMBERS_BUCKET}.{service}.x")


def test_each_stream_has_one_owner_and_only_it_may_update_the_stream() -> None:
    streams = [s.name for s in default_streams()]
    assert sorted(natsauth.STREAM_OWNERS) == sorted(streams)
    users = natsauth.default_users(("subscriber",))
    for stream in streams:
        updaters = {
            u.name
            for u in users
            if u.account == natsauth.ACCOUNT and u.permissions.may_publish(f"$JS.API.STREAM.UPDATE.{stream}")
        }
        assert updaters == {natsauth.STREAM_OWNERS[stream]}, stream
    # The owner is a producer into the stream.
    for stream, owner in natsauth.STREAM_OWNERS.items():
        spec = next(s for s in default_streams() if s.name == stream)
        perms = natsauth.service_permissions(owner)
        produced = (
            subjects.dead_letter(f"respawn-{owner}")
            if stream == subjects.DEAD_LETTER_STREAM
            else spec.subjects[0].replace(">", "x.y")
        )
        assert perms.may_publish(produced), (stream, owner)


def test_services_read_only_the_streams_they_consume() -> None:
    reads = {
        "watcher": set(),
        "health": {subjects.OBSERVATIONS_STREAM, subjects.NODE_VERDICTS_STREAM, subjects.VERDICTS_STREAM},
        # lifecycle: the quarantine node verdict too; autopilot: the verdicts, for node quarantine.
        "lifecycle": {subjects.VERDICTS_STREAM, subjects.NODE_VERDICTS_STREAM},
        "autopilot": {subjects.OBSERVATIONS_STREAM, subjects.NODE_VERDICTS_STREAM, subjects.VERDICTS_STREAM},
    }
    for service, expected in reads.items():
        perms = natsauth.service_permissions(service)
        readable = {
            s.name
            for s in default_streams()
            if perms.may_publish(f"$JS.API.CONSUMER.CREATE.{s.name}")
            or any(perms.may_publish(p) for p in _any_create(service, s.name))
        }
        assert readable == expected, service


def _any_create(service: str, stream: str) -> list[str]:
    """Named creates ``service`` could send on ``stream``: its own durables or a fresh name, with
    every filter any service uses."""
    filters = (
        subjects.appwrapper_obs_filter(),
        subjects.appwrapper_obs_partition_filter(3),
        subjects.node_obs_filter(),
        subjects.verdict_filter(),
        subjects.verdict_partition_filter(3),
        subjects.node_verdict_filter(),
        subjects.node_verdict(QUARANTINE_RESOURCE),
        subjects.lifecycle_filter(),
    )
    names = (f"{service}-replica-1a2b3c4d", *(d for _, d, _ in natsauth.lifecycle_durables()))
    return [f"$JS.API.CONSUMER.CREATE.{stream}.{n}.{f}" for n in names for f in filters]


def test_consumer_creation_is_pinned_to_each_services_names_and_filters() -> None:
    create = "$JS.API.CONSUMER.CREATE"
    obs, nodes = subjects.OBSERVATIONS_STREAM, subjects.NODE_VERDICTS_STREAM
    aw, node = subjects.appwrapper_obs_filter(), subjects.node_obs_filter()
    health, lifecycle, autopilot = (
        natsauth.service_permissions(s) for s in ("health", "lifecycle", "autopilot")
    )
    # health reads one partition per consumer, whichever partitions it owns, and nothing wider.
    for partition in (0, 7, 1023):
        part = subjects.appwrapper_obs_partition_filter(partition)
        assert health.may_publish(f"{create}.{obs}.health-pod-1-0a1b2c3d-p{partition}.{part}")
        verdicts = subjects.verdict_partition_filter(partition)
        assert health.may_publish(
            f"{create}.{subjects.VERDICTS_STREAM}.health-pod-1-0a1b2c3d-p{partition}-verdicts.{verdicts}"
        )
    assert not health.may_publish(f"{create}.{obs}.health-pod-1-0a1b2c3d.{aw}")
    assert not health.may_publish(f"{create}.{subjects.VERDICTS_STREAM}.h.{subjects.verdict_filter()}")
    assert not health.may_publish(f"{create}.{obs}.health-pod-1-0a1b2c3d.{node}")
    assert health.may_publish(
        f"{create}.{nodes}.health-pod-1-0a1b2c3d-nodes.{subjects.node_verdict_filter()}"
    )
    assert autopilot.may_publish(f"{create}.{obs}.autopilot-pod-1-0a1b2c3d.{node}")
    assert not autopilot.may_publish(f"{create}.{obs}.autopilot-pod-1-0a1b2c3d.{aw}")
    assert not lifecycle.may_publish(f"{create}.{obs}.lifecycle-x.{aw}")
    # lifecycle: one durable per partition, each pinned to its own partition's verdicts.
    verdicts = subjects.VERDICTS_STREAM
    for partition in (0, subjects.partitions() - 1):
        durable, part = (
            subjects.lifecycle_verdict_durable(partition),
            subjects.verdict_partition_filter(partition),
        )
        assert lifecycle.may_publish(f"{create}.{verdicts}.{durable}.{part}")
        assert not lifecycle.may_publish(f"{create}.{verdicts}.{durable}.{subjects.verdict_filter()}")
    assert not lifecycle.may_publish(
        f"{create}.{verdicts}.lifecycle-verdicts-0.{subjects.verdict_partition_filter(1)}"
    )
    assert not lifecycle.may_publish(f"{create}.{verdicts}.lifecycle-verdicts.{subjects.verdict_filter()}")
    # The legacy forms (which carry the consumer's name in the body) are needed by nobody in
    # Respawn's account: every consumer is created with its name and filter in the subject.
    for user in natsauth.default_users():
        if user.account != natsauth.ACCOUNT:
            continue
        for stream in (s.name for s in default_streams()):
            assert not user.permissions.may_publish(f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.x"), user.name
            assert not user.permissions.may_publish(f"{create}.{stream}"), (user.name, stream)


def test_lifecycles_durables_are_denied_to_every_other_user() -> None:
    users = natsauth.default_users(("subscriber",))
    for stream, durable, _ in natsauth.lifecycle_durables():
        requests = [
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.respawn.>",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.1.2.3.4.0",
        ]
        for user in users:
            if user.account != natsauth.ACCOUNT:
                continue  # an outside reader's requests are answered by its own account
            for request in requests:
                allowed = user.permissions.may_publish(request)
                # lifecycle may do all but delete and the other create forms with its durables.
                if user.name != "lifecycle":
                    assert not allowed, (user.name, request)
        lifecycle = natsauth.service_permissions("lifecycle")
        assert lifecycle.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}")
        assert lifecycle.may_publish(f"$JS.ACK.{stream}.{durable}.1.2.3.4.0")
        assert not lifecycle.may_publish(f"$JS.API.CONSUMER.DELETE.{stream}.{durable}")


def _consume_calls(path: Path) -> list[tuple[str, ast.expr, ast.expr]]:
    """(stream, durable expression, filter expression) of every ``.consume(`` and ``.replay(``
    call in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("consume", "replay")
        ):
            stream, durable, filter_ = node.args[:3]
            assert isinstance(stream, ast.Attribute), ast.unparse(stream)
            found.append((getattr(subjects, stream.attr), durable, filter_))
    return found


class _AnyPartition(dict[str, Any]):
    """Names for ``eval``: any name not otherwise bound stands for a partition number."""

    def __missing__(self, key: str) -> int:
        return 5


@pytest.mark.parametrize("service", natsauth.SERVICES)
def test_every_consumer_in_the_services_code_is_permitted_by_name_and_filter(service: str) -> None:
    # The durable names and filters are read from the services' code, so a new or renamed
    # consumer fails here instead of as a permission violation in production.
    perms = natsauth.service_permissions(service)
    # lifecycle binds its per-partition durables in shares.py.
    modules = [p for p in (REPO / "services" / service).glob("*.py") if p.name in ("service.py", "shares.py")]
    calls = [c for path in sorted(modules) for c in _consume_calls(path)]
    for stream, durable, filter_ in calls:
        assert isinstance(filter_, ast.Call), ast.unparse(filter_)
        # A subjects.*_filter() call; a name among its arguments is a partition number.
        subject_filter = eval(ast.unparse(filter_), {}, _AnyPartition(subjects=subjects))
        fixed = isinstance(durable, ast.Constant) or (
            isinstance(durable, ast.Call)
            and ast.unparse(durable.func) == "subjects.lifecycle_verdict_durable"
        )
        if fixed:  # a fixed name, or lifecycle's one per partition
            name = eval(ast.unparse(durable), {}, _AnyPartition(subjects=subjects))
            assert service == "lifecycle", name
            assert (stream, name, subject_filter) in natsauth.lifecycle_durables(), name
        else:  # a per-run name from replay_consumer_name
            name = f"{service}-pod-7-0a1b2c3d"
        assert perms.may_publish(f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{subject_filter}"), (stream, name)
        assert perms.may_publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}")
        assert perms.may_publish(f"$JS.ACK.{stream}.{name}.1.2.3.4.0")
    # Every service but the watcher consumes something; an empty list means the scan broke.
    assert bool(calls) is (service != "watcher")


@given(a=names, b=names)
def test_nobody_may_subscribe_to_a_stream_subject(a: str, b: str) -> None:
    # With such a subscription a push consumer could deliver into a subject another stream
    # captures: a write by a user that may not publish there.
    for user in natsauth.default_users(("subscriber", "dashboard")):
        for _, subject in message_subjects(a, b):
            assert not user.permissions.may_subscribe(subject), (user.name, subject)


def test_subscribers_receive_only_on_inboxes_of_their_own_account() -> None:
    perms = natsauth.subscriber_permissions("dashboard")
    # The reader's account has only its own replies under _INBOX; the private prefix still works
    # for clients configured with it.
    assert perms.subscribe == ("_INBOX.>", "_INBOX_dashboard.>")
    assert not perms.may_subscribe("_INBOX_subscriber.abc")
    assert natsauth.inbox_prefix("dashboard") == "_INBOX_dashboard"


def test_auth_config_exports_to_readers_only_what_their_mirrors_need() -> None:
    text = natsauth.render_auth_config(natsauth.default_users(("subscriber", "team-dash")))
    exports = [
        line.strip() for line in text.splitlines() if line.strip().startswith(("{service:", "{stream:"))
    ]
    readers = '["READER_SUBSCRIBER", "READER_TEAM_DASH"]'
    assert exports[: 2 * len(natsauth.PUBLIC_STREAMS) + 2] == [
        f'{{service: "$JS.API.CONSUMER.CREATE.{subjects.VERDICTS_STREAM}", accounts: {readers}}}',
        f'{{service: "$JS.FC.{subjects.VERDICTS_STREAM}.>", accounts: {readers}}}',
        f'{{service: "$JS.API.CONSUMER.CREATE.{subjects.LIFECYCLE_STREAM}", accounts: {readers}}}',
        f'{{service: "$JS.FC.{subjects.LIFECYCLE_STREAM}.>", accounts: {readers}}}',
        '{stream: "respawn.mirror.subscriber.>", accounts: ["READER_SUBSCRIBER"]}',
        '{stream: "respawn.mirror.team-dash.>", accounts: ["READER_TEAM_DASH"]}',
    ]
    # Each reader imports the create request under another prefix (its own $JS.API stays its
    # own), the flow-control replies, and only its own delivery subject.
    dash = text[text.index("READER_TEAM_DASH {") :]
    imports = [
        line.strip() for line in dash.splitlines() if line.strip().startswith(("{service:", "{stream:"))
    ]
    assert f'to: "{natsauth.MIRROR_API_PREFIX}.CONSUMER.CREATE.{subjects.VERDICTS_STREAM}"' in imports[0]
    assert imports[-1] == '{stream: {account: "RESPAWN", subject: "respawn.mirror.team-dash.>"}}'
    assert "max_streams: 2" in dash


def test_a_readers_mirror_copies_the_streams_name_and_limits() -> None:
    for spec in (s for s in default_streams() if s.name in natsauth.PUBLIC_STREAMS):
        config = natsauth.mirror_stream_config(spec, "team-dash", replicas=3)
        assert config.name == config.mirror.name == spec.name
        assert config.mirror.external.api == natsauth.MIRROR_API_PREFIX
        assert config.mirror.external.deliver == "respawn.mirror.team-dash"
        assert config.subjects is None  # a mirror takes no subjects: nothing can be published into it
        assert (config.max_msgs_per_subject, config.max_age, config.num_replicas) == (
            spec.max_msgs_per_subject,
            spec.max_age,
            3,
        )


def test_only_public_streams_can_be_opened_to_subscribers() -> None:
    with pytest.raises(ValueError, match="public streams"):
        natsauth.subscriber_permissions(streams=(subjects.OBSERVATIONS_STREAM,))


def test_user_names_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown service"):
        natsauth.service_permissions("scheduler")
    with pytest.raises(ValueError, match="taken by a service"):
        natsauth.subscriber_user("health")
    with pytest.raises(ValueError, match="lowercase"):
        natsauth.subscriber_user("Dash.board")
    with pytest.raises(ValueError, match="unique"):
        natsauth.default_users(("dash", "dash"))


# ------------------------------------------------------------------ passwords


@pytest.mark.parametrize("bad", ["12k", "true", "short", "1" * 30, "has space" + "x" * 20, "a" * 23])
def test_passwords_nats_would_misread_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="at least 24 characters"):
        natsauth.validate_password("watcher", bad)


def test_generated_passwords_are_valid_and_distinct() -> None:
    passwords = {natsauth.generate_password() for _ in range(200)}
    assert len(passwords) == 200
    for password in passwords:
        assert natsauth.validate_password("watcher", password) == password


def test_password_variables_follow_user_names() -> None:
    assert natsauth.password_variable("watcher") == "NATS_PASSWORD_WATCHER"
    assert natsauth.password_variable("team-dash") == "NATS_PASSWORD_TEAM_DASH"


# ------------------------------------------------------------------ rendering


def test_committed_auth_conf_is_the_generated_one() -> None:
    expected = natsauth.render_auth_config(natsauth.default_users())
    regenerate = "python -m respawn.natsauth config > deploy/nats/auth.conf"
    assert AUTH_CONF.read_text() == expected, f"stale file; regenerate it: {regenerate}"


def test_auth_config_references_password_variables_unless_given() -> None:
    users = natsauth.default_users()
    by_reference = natsauth.render_auth_config(users)
    for user in users:
        assert f"password: ${user.password_variable}\n" in by_reference
    passwords = {u.name: "Pw" + u.name * 8 for u in users}
    literal = natsauth.render_auth_config(users, passwords=passwords)
    assert "$NATS_PASSWORD" not in literal
    for user in users:
        assert f'password: "{passwords[user.name]}"' in literal


def test_auth_config_lists_every_permission_once_per_user() -> None:
    users = natsauth.default_users()
    text = natsauth.render_auth_config(users)
    blocks = text.split("user: ")[1:]
    assert [json.loads(b.split("\n", 1)[0]) for b in blocks] == [u.name for u in users]
    for user, block in zip(users, blocks, strict=True):
        for subject in (
            *user.permissions.publish,
            *user.permissions.publish_deny,
            *user.permissions.subscribe,
        ):
            assert block.count(f"{json.dumps(subject)}\n") >= 1, (user.name, subject)


def test_secret_holds_every_password_under_the_user_name() -> None:
    passwords = {u.name: natsauth.generate_password() for u in natsauth.default_users()}
    secret = json.loads(natsauth.render_secret(passwords, namespace="ops"))
    assert secret["kind"] == "Secret"
    assert secret["metadata"] == {
        "name": natsauth.SECRET_NAME,
        "namespace": "ops",
        "labels": {"app.kubernetes.io/name": "respawn", "app.kubernetes.io/component": "nats"},
    }
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == passwords


def test_env_file_is_one_line_per_user() -> None:
    passwords = {"watcher": "W" * 30, "health": "H" * 30}
    assert natsauth.render_env_file(passwords) == f"health={'H' * 30}\nwatcher={'W' * 30}\n"


def test_command_line_prints_config_and_fresh_secrets(capsys: pytest.CaptureFixture[str]) -> None:
    assert natsauth.main(["config"]) == 0
    assert capsys.readouterr().out == AUTH_CONF.read_text()

    assert natsauth.main(["secret", "--namespace", "ops", "--subscriber", "dash"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert sorted(first["data"]) == ["autopilot", "dash", "health", "lifecycle", "watcher"]
    assert first["metadata"]["namespace"] == "ops"
    natsauth.main(["secret"])
    second = json.loads(capsys.readouterr().out)
    assert second["metadata"]["namespace"] == "respawn-system"
    assert first["data"]["watcher"] != second["data"]["watcher"]

    assert natsauth.main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == sorted((*natsauth.SERVICES, "subscriber"))

    assert natsauth.main(["config", "--subscriber", "health"]) == 2
    assert "taken by a service" in capsys.readouterr().err


def test_mirrors_command_wants_the_readers_credentials_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_PASSWORD", raising=False)
    assert natsauth.main(["mirrors", "--url", "nats://127.0.0.1:1"]) == 2
    assert "set NATS_PASSWORD" in capsys.readouterr().err
    monkeypatch.setenv("NATS_PASSWORD", "x" * 30)
    assert natsauth.main(["mirrors", "--url", "nats://127.0.0.1:1"]) == 1
    assert "cannot connect to NATS at nats://127.0.0.1:1 as subscriber" in capsys.readouterr().err


# ------------------------------------------------------------------ the manifests agree


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_nats_servers_get_every_users_password_from_the_secret() -> None:
    (statefulset,) = load_all(REPO / "deploy" / "nats" / "statefulset.yaml")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert from_secret == {
        u.password_variable: {"name": natsauth.SECRET_NAME, "key": u.name} for u in natsauth.default_users()
    }


@pytest.mark.parametrize("service", natsauth.SERVICES)
def test_each_service_connects_as_its_own_user(service: str) -> None:
    docs = load_all(REPO / "deploy" / "base" / "services" / f"{service}.yaml")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NATS_USER"]["value"] == service
    assert env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": natsauth.SECRET_NAME, "key": service}
    # No other password reaches the pod.
    refs = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert len(refs) == 1
