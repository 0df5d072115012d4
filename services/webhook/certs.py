"""The webhook's self-managed serving certificate: what its Secret holds, and whether it will do.

The Secret (``respawn-webhook-cert`` in the webhook's namespace) holds a CA of the webhook's own
and a serving certificate that CA signed:

- ``ca.crt``: the signing CA first, then any earlier CA that is still valid (the bundle the
  webhook configurations trust, so a certificate of the previous CA, still served by a replica
  that has not reloaded yet, stays trusted while the CA is replaced);
- ``ca.key``: the signing CA's key, so that renewing the serving certificate keeps the CA and
  the configurations' ``caBundle`` unchanged;
- ``tls.crt`` / ``tls.key``: the serving certificate, for every name the API server may call.

Everything is replaced when less than a third of its lifetime is left, well before it expires
(:data:`RENEW_WHEN_LEFT`). The decisions (:func:`assess`, :func:`bundle_needs_update`) are pure,
with the time passed in; :func:`issue` only adds fresh keys.
"""

from __future__ import annotations

import datetime as dt
import enum
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "BACKDATE",
    "CA_CERT",
    "CA_KEY",
    "CA_LIFETIME",
    "CA_NAME",
    "CERT",
    "KEY",
    "RENEW_WHEN_LEFT",
    "SERVING_LIFETIME",
    "Assessment",
    "Need",
    "assess",
    "bundle_needs_update",
    "issue",
    "service_hosts",
]

# The Secret's keys. tls.crt and tls.key are what a kubernetes.io/tls Secret must hold; ca.crt is
# where cert-manager puts the CA too.
CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
CERT: Final = "tls.crt"
KEY: Final = "tls.key"

CA_LIFETIME: Final = dt.timedelta(days=3650)
SERVING_LIFETIME: Final = dt.timedelta(days=365)
# A certificate is replaced once less than this share of its lifetime is left: the serving one
# about four months before it expires, the CA about three years before. Checked every minute,
# so a replacement never waits long; what is left is the margin for a webhook that is down.
RENEW_WHEN_LEFT: Final = 1 / 3
# Certificates start this long before they are made, so that a node or an API server whose
# clock is somewhat behind the webhook's still accepts them.
BACKDATE: Final = dt.timedelta(hours=1)
# The CA's subject. Also how bundle_needs_update recognises a CA of the webhook's own.
CA_NAME: Final = "respawn-webhook-ca"
# How many earlier CAs a new one keeps in the bundle (the latest ones still valid).
_EARLIER_CAS_KEPT: Final = 2


class Need(enum.Enum):
    """What the Secret needs."""

    NOTHING = "nothing"
    # A new serving certificate, signed by the CA the Secret holds.
    SERVING = "serving"
    # A new CA, and a serving certificate of it.
    CA = "ca"


@dataclass(frozen=True, slots=True)
class Assessment:
    need: Need
    # Why, in words for the log: what is missing or wrong, or until when all is well.
    reason: str


def service_hosts(service: str, namespace: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The names the serving certificate must hold: the Service's, as the API server calls it
    (``<service>.<namespace>.svc``), its fully qualified form, and ``extra`` (DNS names or IPs)."""
    names = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", *extra]
    return tuple(dict.fromkeys(n for n in names if n))


# ---------------------------------------------------------------------------------------------
# Reading what the Secret holds


def _certs(pem: bytes | None) -> list[x509.Certificate]:
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _key(pem: bytes | None) -> ec.EllipticCurvePrivateKey | None:
    if not pem:
        return None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        return None
    # Only keys this module makes are used; another kind is replaced like a missing one.
    return key if isinstance(key, ec.EllipticCurvePrivateKey) else None


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key() == key.public_key()


def _left_too_little(cert: x509.Certificate, now: dt.datetime) -> str | None:
    """Why ``cert`` must be replaced at ``now`` for its validity, or None."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return f"not valid before {start:%Y-%m-%dT%H:%M:%SZ}"
    if end - now < (end - start) * RENEW_WHEN_LEFT:
        return f"expires at {end:%Y-%m-%dT%H:%M:%SZ}, less than a third of its lifetime left"
    return None


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {
        *san.get_values_for_type(x509.DNSName),
        *(str(ip) for ip in san.get_values_for_type(x509.IPAddress)),
    }


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _normal_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def assess(data: Mapping[str, bytes] | None, hosts: Sequence[str], now: dt.datetime) -> Assessment:
    """What the Secret's ``data`` (decoded; None: no Secret) needs at ``now`` to serve ``hosts``."""
    if data is None:
        return Assessment(Need.CA, "there is no Secret yet")
    cas = _certs(data.get(CA_CERT))
    ca_key = _key(data.get(CA_KEY))
    if not cas or ca_key is None:
        missing = [k for k, ok in ((CA_CERT, bool(cas)), (CA_KEY, ca_key is not None)) if not ok]
        return Assessment(Need.CA, f"no usable {' or '.join(missing)}")
    ca = cas[0]
    if not _same_key(ca, ca_key):
        return Assessment(Need.CA, f"{CA_KEY} is not the key of the first certificate in {CA_CERT}")
    why = _left_too_little(ca, now)
    if why:
        return Assessment(Need.CA, f"the CA {why}")
    certs = _certs(data.get(CERT))
    key = _key(data.get(KEY))
    if not certs or key is None:
        missing = [k for k, ok in ((CERT, bool(certs)), (KEY, key is not None)) if not ok]
        return Assessment(Need.SERVING, f"no usable {' or '.join(missing)}")
    cert = certs[0]
    if not _same_key(cert, key):
        return Assessment(Need.SERVING, f"{KEY} is not the key of {CERT}")
    if not _signed_by(cert, ca):
        return Assessment(Need.SERVING, "the serving certificate was not signed by the CA")
    wanted = {_normal_host(h) for h in hosts}
    absent = sorted(wanted - {_normal_host(n) for n in _names(cert)})
    if absent:
        return Assessment(Need.SERVING, f"the serving certificate does not name {', '.join(absent)}")
    why = _left_too_little(cert, now)
    if why:
        return Assessment(Need.SERVING, f"the serving certificate {why}")
    return Assessment(
        Need.NOTHING,
        f"valid until {min(cert.not_valid_after_utc, ca.not_valid_after_utc):%Y-%m-%dT%H:%M:%SZ}",
    )


# ---------------------------------------------------------------------------------------------
# Issuing


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _new_ca(now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    start = now - BACKDATE
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _serving(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Sequence[str], now: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    start = now - BACKDATE
    # Never beyond the CA: a certificate that outlives its issuer is not trusted for the rest.
    end = min(start + SERVING_LIFETIME, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def issue(
    data: Mapping[str, bytes] | None, need: Need, hosts: Sequence[str], now: dt.datetime
) -> dict[str, bytes]:
    """The Secret's new data for ``need`` (of :func:`assess` on ``data``): a serving certificate
    for ``hosts`` signed by the CA in ``data``, or by a new CA that then heads the bundle, followed
    by the earlier CAs still valid at ``now``."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    data = data or {}
    if need is Need.NOTHING:
        return dict(data)
    if need is Need.SERVING:
        cas = _certs(data.get(CA_CERT))
        ca_key = _key(data.get(CA_KEY))
        if not cas or ca_key is None:
            raise ValueError("a serving certificate alone needs the CA the Secret holds")
        ca, bundle = cas[0], data[CA_CERT]
    else:
        ca, ca_key = _new_ca(now)
        # The latest earlier CAs only: a bundle that lost its key again and again stays small.
        earlier = sorted(
            (c for c in _certs(data.get(CA_CERT)) if c.not_valid_after_utc > now),
            key=lambda c: c.not_valid_before_utc,
            reverse=True,
        )[:_EARLIER_CAS_KEPT]
        bundle = b"".join(_pem(c) for c in [ca, *earlier])
    cert, key = _serving(ca, ca_key, hosts, now)
    return {CA_CERT: bundle, CA_KEY: _key_pem(ca_key), CERT: _pem(cert), KEY: _key_pem(key)}


# ---------------------------------------------------------------------------------------------
# The configurations' caBundle


def _newest_own(pem: bytes | None) -> dt.datetime | None:
    starts = [
        c.not_valid_before_utc
        for c in _certs(pem)
        if c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        and c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == CA_NAME
    ]
    return max(starts) if starts else None


def bundle_needs_update(current: bytes | None, desired: bytes) -> bool:
    """Whether a configuration whose ``caBundle`` is ``current`` (None: none) gets ``desired``.

    Not when they are equal, and not when ``current`` holds a CA of the webhook's own newer than
    every one in ``desired``: that is a replica that read the Secret just before another one
    replaced the CA, and going back would make the API server distrust the new certificate.
    """
    if current == desired:
        return False
    theirs, ours = _newest_own(current), _newest_own(desired)
    return theirs is None or ours is None or ours >= theirs
