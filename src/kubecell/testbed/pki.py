"""Credentials of a testbed: a CA, the API server's serving certificate, a service-account key and
bearer tokens for the clients, with a kubeconfig per client.

The API server could self-sign its own serving certificate, but then clients would have to skip TLS
verification; a small CA of our own lets every client verify the server exactly as in a real
cluster. Clients authenticate with static tokens (``--token-auth-file``), one identity per component,
so RBAC is exercised for real: the admin is in ``system:masters``, the stock kube-scheduler is
``system:kube-scheduler`` and kube-controller-manager ``system:kube-controller-manager`` (both bound by
the API server's bootstrap policy, as kubeadm's client certificates are), and kubecell's own
components get only what ``deploy/`` grants them.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True, slots=True)
class Identity:
    """A client of the testbed: a user name, its groups and the kubeconfig file written for it."""

    name: str
    user: str
    groups: tuple[str, ...]


IDENTITIES = (
    Identity("admin", "kubecell-admin", ("system:masters",)),
    Identity("kube-scheduler", "system:kube-scheduler", ()),
    Identity("kube-controller-manager", "system:kube-controller-manager", ()),
    Identity("kubecell-scheduler", "system:serviceaccount:kubecell-system:kubecell-scheduler", ()),
    Identity("kubelet", "system:node-agent-fake", ("system:masters",)),
)
"""Who talks to the testbed. kube-controller-manager's own identity watches (its shared informers) and
asks for a token per controller: with ``--use-service-account-credentials`` each controller writes as
its own ServiceAccount in ``kube-system``, held to its ``system:controller:<name>`` role of the
bootstrap policy, as in a real cluster. The fake kubelet stands in for every node's kubelet at once,
which no single node identity may do under the Node authorizer, so it runs with admin rights."""


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True, slots=True)
class Pki:
    """Paths of the files :func:`create` writes."""

    directory: Path
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    token_file: Path
    tokens: dict[str, str]

    def kubeconfig(self, identity: str) -> Path:
        return self.directory / f"{identity}.kubeconfig"


def create(directory: Path, server: str) -> Pki:
    """Write a fresh CA, serving certificate (127.0.0.1 and localhost), service-account key, token file
    and one kubeconfig per :data:`IDENTITIES` entry into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubecell-testbed-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(serving_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(
        directory=directory,
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        service_account_key=directory / "service-account.key",
        token_file=directory / "tokens.csv",
        tokens={identity.name: secrets.token_hex(24) for identity in IDENTITIES},
    )
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_private(pki.serving_key, _pem_key(serving_key))
    # One RSA key both signs and verifies service-account tokens (the API server requires RSA or ECDSA).
    _write_private(pki.service_account_key, _pem_key(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
    lines = []
    for index, identity in enumerate(IDENTITIES):
        groups = ",".join(identity.groups)
        lines.append(f'{pki.tokens[identity.name]},{identity.user},uid-{index}' + (f',"{groups}"' if groups else ""))
    _write_private(pki.token_file, ("\n".join(lines) + "\n").encode())
    for identity in IDENTITIES:
        write_kubeconfig(pki.kubeconfig(identity.name), server=server, ca_cert=pki.ca_cert,
                         token=pki.tokens[identity.name], user=identity.name)
    return pki


def write_kubeconfig(path: Path, *, server: str, ca_cert: Path, token: str, user: str) -> None:
    """A kubeconfig with one cluster, one user (a bearer token) and one current context."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubecell-testbed", "cluster": {"server": server,
                                                              "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "kubecell-testbed", "context": {"cluster": "kubecell-testbed", "user": user}}],
        "current-context": "kubecell-testbed",
    }
    _write_private(path, yaml.safe_dump(config, sort_keys=False).encode())


def read_token(kubeconfig: Path) -> str:
    """The bearer token of a kubeconfig written by :func:`write_kubeconfig`."""
    config = yaml.safe_load(kubeconfig.read_text())
    return str(config["users"][0]["user"]["token"])
