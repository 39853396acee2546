"""The test bed's certificates: one CA, the API server's serving cert, client certs, the SA signing key.

ECDSA P-256 throughout (fast to generate; kube-apiserver accepts it for serving, client auth and
ServiceAccount token signing). Files are written 0600 into the cluster's own temp dir.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    """A throwaway CA that signs the cluster's serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        name = _name("ballast-e2e-ca")
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(self._key, hashes.SHA256())
        )
        self.cert_file = _write(directory / "ca.crt", self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        stem: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """Sign a leaf: a serving cert when names/IPs are given, a client cert otherwise."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        serving = bool(server_names or server_ips)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organizations))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if serving else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if serving:
            alt: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert=_write(self.directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            key=_write(self.directory / f"{stem}.key", _key_pem(key)),
        )


def service_account_keys(directory: Path) -> KeyPair:
    """The ServiceAccount token signing key (private) and its public half (`cert` holds the public key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(cert=_write(directory / "sa.pub", public), key=_write(directory / "sa.key", _key_pem(key)))
