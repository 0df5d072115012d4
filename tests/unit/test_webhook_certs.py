"""The self-managed certificate's decisions (services/webhook/certs.py): what the Secret needs at a
given time, what is issued for it, and when a configuration's caBundle is changed."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.webhook import certs
from services.webhook.certs import CA_CERT, CA_KEY, CERT, KEY, Need, assess, bundle_needs_update, issue

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOSTS = certs.service_hosts("respawn-webhook", "respawn-system")
DAY = dt.timedelta(days=1)


def fresh(now: dt.datetime = NOW, hosts: tuple[str, ...] = HOSTS) -> dict[str, bytes]:
    return issue(None, Need.CA, hosts, now)


def chain(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def serving(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[CERT])


def names(cert: x509.Certificate) -> set[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = (str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return {*san.get_values_for_type(x509.DNSName), *ips}


def test_the_names_are_the_services_in_both_forms_then_the_extra_ones() -> None:
    assert HOSTS == ("respawn-webhook.respawn-system.svc", "respawn-webhook.respawn-system.svc.cluster.local")
    assert certs.service_hosts("w", "ns", ("127.0.0.1", "w.ns.svc", "")) == (
        "w.ns.svc",
        "w.ns.svc.cluster.local",
        "127.0.0.1",
    )


def test_no_secret_needs_a_ca_and_what_is_issued_is_then_good_for_the_hosts() -> None:
    assert assess(None, HOSTS, NOW) == certs.Assessment(Need.CA, "there is no Secret yet")
    data = fresh()
    assert set(data) == {CA_CERT, CA_KEY, CERT, KEY}
    verdict = assess(data, HOSTS, NOW)
    assert verdict.need is Need.NOTHING
    (ca,) = chain(data[CA_CERT])
    cert = serving(data)
    cert.verify_directly_issued_by(ca)
    assert names(cert) == set(HOSTS)
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == certs.CA_NAME
    # Valid from a little before now (clocks differ), for the lifetimes documented.
    assert cert.not_valid_before_utc == NOW - certs.BACKDATE
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == certs.SERVING_LIFETIME
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == certs.CA_LIFETIME
    assert verdict.reason == f"valid until {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}"
    assert isinstance(x509.load_pem_x509_certificate(data[CERT]).public_key(), ec.EllipticCurvePublicKey)


def test_the_serving_certificate_is_renewed_once_less_than_a_third_of_its_lifetime_is_left() -> None:
    data = fresh()
    cert = serving(data)
    renew_at = cert.not_valid_after_utc - certs.SERVING_LIFETIME / 3
    assert assess(data, HOSTS, renew_at - DAY).need is Need.NOTHING
    late = assess(data, HOSTS, renew_at + DAY)
    assert late.need is Need.SERVING
    assert late.reason == (
        f"the serving certificate expires at {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}, "
        "less than a third of its lifetime left"
    )
    # Expired is the same need.
    assert assess(data, HOSTS, cert.not_valid_after_utc + DAY).need is Need.SERVING


def test_a_renewed_serving_certificate_keeps_the_ca_so_the_ca_bundle_does_not_change() -> None:
    data = fresh()
    later = serving(data).not_valid_after_utc - DAY
    renewed = issue(data, Need.SERVING, HOSTS, later)
    assert renewed[CA_CERT] == data[CA_CERT]
    assert renewed[CA_KEY] == data[CA_KEY]
    assert renewed[CERT] != data[CERT] and renewed[KEY] != data[KEY]
    assert assess(renewed, HOSTS, later).need is Need.NOTHING
    assert serving(renewed).not_valid_before_utc == later - certs.BACKDATE


def test_the_ca_is_renewed_with_a_third_of_its_lifetime_left_and_the_old_one_stays_trusted() -> None:
    data = fresh()
    (old,) = chain(data[CA_CERT])
    renew_at = old.not_valid_after_utc - certs.CA_LIFETIME / 3
    # Serving certificates renewed meanwhile keep the CA; the CA's own time is checked first.
    kept = issue(data, Need.SERVING, HOSTS, renew_at - DAY)
    assert assess(kept, HOSTS, renew_at - DAY).need is Need.NOTHING
    verdict = assess(kept, HOSTS, renew_at + DAY)
    assert verdict.need is Need.CA
    assert verdict.reason.startswith("the CA expires at ")
    renewed = issue(kept, Need.CA, HOSTS, renew_at + DAY)
    new, previous = chain(renewed[CA_CERT])
    assert previous == old  # still trusted: replicas not reloaded yet serve certificates of it
    assert new != old
    serving(renewed).verify_directly_issued_by(new)
    assert assess(renewed, HOSTS, renew_at + DAY).need is Need.NOTHING
    # Once the old CA has expired, the next CA leaves it out.
    much_later = new.not_valid_after_utc - certs.CA_LIFETIME / 3 + DAY
    assert much_later > old.not_valid_after_utc
    third = issue(renewed, Need.CA, HOSTS, much_later)
    assert [c for c in chain(third[CA_CERT]) if c == old] == []
    assert chain(third[CA_CERT])[1] == new


def test_the_bundle_keeps_at_most_the_two_latest_earlier_cas() -> None:
    data = fresh()
    for n in range(1, 5):
        data = issue(data, Need.CA, HOSTS, NOW + n * DAY)
    bundle = chain(data[CA_CERT])
    assert len(bundle) == 3
    assert [c.not_valid_before_utc for c in bundle] == [NOW + n * DAY - certs.BACKDATE for n in (4, 3, 2)]


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    data = fresh()
    (ca,) = chain(data[CA_CERT])
    near_the_end = ca.not_valid_after_utc - 30 * DAY
    renewed = issue(data, Need.SERVING, HOSTS, near_the_end)
    assert serving(renewed).not_valid_after_utc == ca.not_valid_after_utc


@pytest.mark.parametrize(
    ("drop", "need", "reason"),
    [
        (CA_CERT, Need.CA, "no usable ca.crt"),
        (CA_KEY, Need.CA, "no usable ca.key"),
        (CERT, Need.SERVING, "no usable tls.crt"),
        (KEY, Need.SERVING, "no usable tls.key"),
    ],
)
def test_a_missing_piece_is_issued_again(drop: str, need: Need, reason: str) -> None:
    data = fresh()
    del data[drop]
    assert assess(data, HOSTS, NOW) == certs.Assessment(need, reason)


@pytest.mark.parametrize("key", [CA_CERT, CA_KEY, CERT, KEY])
def test_an_unreadable_piece_counts_as_missing(key: str) -> None:
    data = fresh()
    data[key] = b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
    assert assess(data, HOSTS, NOW).need is (Need.CA if key.startswith("ca.") else Need.SERVING)


def test_pieces_that_do_not_belong_together_are_issued_again() -> None:
    one, other = fresh(), fresh()
    wrong_ca_key = {**one, CA_KEY: other[CA_KEY]}
    assert assess(wrong_ca_key, HOSTS, NOW) == certs.Assessment(
        Need.CA, "ca.key is not the key of the first certificate in ca.crt"
    )
    wrong_key = {**one, KEY: other[KEY]}
    assert assess(wrong_key, HOSTS, NOW) == certs.Assessment(
        Need.SERVING, "tls.key is not the key of tls.crt"
    )
    other_ca = {**one, CERT: other[CERT], KEY: other[KEY]}
    assert assess(other_ca, HOSTS, NOW) == certs.Assessment(
        Need.SERVING, "the serving certificate was not signed by the CA"
    )


def test_a_certificate_without_a_host_asked_for_is_issued_again_with_it() -> None:
    data = fresh()
    wider = (*HOSTS, "127.0.0.1", "Webhook.Example")
    verdict = assess(data, wider, NOW)
    assert verdict == certs.Assessment(
        Need.SERVING, "the serving certificate does not name 127.0.0.1, webhook.example"
    )
    renewed = issue(data, verdict.need, wider, NOW)
    assert names(serving(renewed)) == {*HOSTS, "127.0.0.1", "Webhook.Example"}
    assert assess(renewed, wider, NOW).need is Need.NOTHING
    # An IP is an IP address SAN, which is what a client checks an IP against.
    san = serving(renewed).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_a_certificate_not_valid_yet_is_issued_again() -> None:
    data = fresh(NOW + 10 * DAY)
    verdict = assess(data, HOSTS, NOW)
    assert verdict.need is Need.CA
    assert verdict.reason == f"the CA not valid before {NOW + 10 * DAY - certs.BACKDATE:%Y-%m-%dT%H:%M:%SZ}"


def test_nothing_needed_changes_nothing_and_a_serving_certificate_needs_the_ca() -> None:
    data = fresh()
    assert issue(data, Need.NOTHING, HOSTS, NOW) == data
    with pytest.raises(ValueError, match="needs the CA"):
        issue({CERT: data[CERT]}, Need.SERVING, HOSTS, NOW)
    with pytest.raises(ValueError, match="at least one host"):
        issue(None, Need.CA, (), NOW)


def test_the_ca_bundle_is_set_where_it_differs_but_never_back_to_an_older_ca_of_our_own() -> None:
    old = fresh()[CA_CERT]
    new = issue(fresh(), Need.CA, HOSTS, NOW + DAY)[CA_CERT]
    assert bundle_needs_update(None, new)
    assert not bundle_needs_update(new, new)
    assert bundle_needs_update(old, new)
    # A replica that read the Secret before another replaced the CA must not undo it.
    assert not bundle_needs_update(new, old)
    # Anything else there (someone's own CA, however new, or garbage) is replaced.
    assert bundle_needs_update(foreign_ca(NOW + 10 * DAY), old)
    assert bundle_needs_update(b"not a certificate", old)
    assert bundle_needs_update(b"", old)


def foreign_ca(start: dt.datetime) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone-else-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + 365 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)
