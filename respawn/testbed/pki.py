"""PKI for the local testbed: one CA, the apiserver's serving cert, client certs, SA keys.

Generated with `cryptography` at `up` time so nothing secret is ever committed and each
state dir has its own CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def client(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.crt", self.dir / f"{name}.key"


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    server_sans: list[x509.GeneralName] | None = None,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        usages = []
        if server_sans is not None:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(x509.SubjectAlternativeName(server_sans), critical=False)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False).add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def generate(directory: Path, *, clients: dict[str, tuple[str, tuple[str, ...]]]) -> Pki:
    """Create the CA, the apiserver serving cert, SA signing keys and the named client certs.

    ``clients`` maps a file stem to (common name, organisations), e.g.
    ``{"admin": ("respawn-admin", ("system:masters",))}``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("respawn-testbed-ca")
    ca_cert = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    _write_key(pki.ca_key, ca_key)
    pki.ca_crt.write_bytes(_pem(ca_cert))

    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv = _sign(_name("kube-apiserver"), srv_key.public_key(), ca_name, ca_key, ca=False, server_sans=sans)
    _write_key(pki.apiserver_key, srv_key)
    pki.apiserver_crt.write_bytes(_pem(srv))

    # Service-account tokens are signed with RSA (what every Kubernetes client expects).
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key, sa)
    pki.sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

    for stem, (cn, orgs) in clients.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(_name(cn, orgs), key.public_key(), ca_name, ca_key, ca=False, client=True)
        crt_path, key_path = pki.client(stem)
        _write_key(key_path, key)
        crt_path.write_bytes(_pem(cert))
    return pki


def _load_ca(pki: Pki) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not the EC key this module makes")
    return ca_key, x509.load_pem_x509_certificate(pki.ca_crt.read_bytes()).subject


def client_cert(pki: Pki, stem: str, cn: str, orgs: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A client certificate for user ``cn`` in groups ``orgs``, signed by the CA of ``pki``,
    written as ``<stem>.crt`` and ``<stem>.key`` beside it (what ``pki.client(stem)`` names).
    For a client added to a running testbed, whose CA is on disk already."""
    ca_key, ca_name = _load_ca(pki)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(_name(cn, orgs), key.public_key(), ca_name, ca_key, ca=False, client=True)
    crt_path, key_path = pki.client(stem)
    _write_key(key_path, key)
    crt_path.write_bytes(_pem(cert))
    return crt_path, key_path


def serving_cert(
    pki: Pki,
    stem: str,
    *,
    dns_names: tuple[str, ...] = ("localhost",),
    ips: tuple[str, ...] = ("127.0.0.1",),
    client: bool = False,
) -> tuple[Path, Path]:
    """A serving certificate for ``dns_names`` and ``ips``, signed by the CA of ``pki``, written
    as ``<stem>.crt`` and ``<stem>.key`` beside it; with ``client`` it may also authenticate as a
    client (NATS routes verify each other both ways). Returns (certificate, key)."""
    ca_key, ca_name = _load_ca(pki)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(
        _name(dns_names[0] if dns_names else stem),
        key.public_key(),
        ca_name,
        ca_key,
        ca=False,
        server_sans=sans,
        client=client,
    )
    crt_path, key_path = pki.dir / f"{stem}.crt", pki.dir / f"{stem}.key"
    _write_key(key_path, key)
    crt_path.write_bytes(_pem(cert))
    return crt_path, key_path


def kubeconfig(pki: Pki, server: str, client: str, *, user: str | None = None) -> str:
    """A kubeconfig (YAML text) that embeds the CA and the named client cert by path."""
    crt, key = pki.client(client)
    user = user or client
    return f"""apiVersion: v1
kind: Config
clusters:
- name: respawn-testbed
  cluster:
    server: {server}
    certificate-authority: {pki.ca_crt}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: respawn-testbed
  context:
    cluster: respawn-testbed
    user: {user}
current-context: respawn-testbed
"""


def serving_bundle(dns_name: str) -> dict[str, bytes]:
    """A self-contained CA + serving cert for ``dns_name`` (keys ca.crt, ca.key, tls.crt, tls.key).

    Used to pre-seed the Kubeflow training operator's webhook secret and cert dir: its
    certificate rotator expects a kubelet to mount that secret as files, and the testbed
    has no kubelet.
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{dns_name}-ca")
    ca_cert = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(
        _name(dns_name), key.public_key(), ca_name, ca_key, ca=False, server_sans=[x509.DNSName(dns_name)]
    )

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    return {
        "ca.crt": _pem(ca_cert),
        "ca.key": pem_key(ca_key),
        "tls.crt": _pem(cert),
        "tls.key": pem_key(key),
    }
