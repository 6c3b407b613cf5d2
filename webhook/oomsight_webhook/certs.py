"""Certificates for the admission webhook's TLS, made with ``cryptography``.

A long-lived CA (10 years) signs a short-lived serving certificate (1 year) for the
webhook Service's DNS names. The API server trusts the CA (``caBundle``), so renewing
the serving certificate never changes what the webhook configuration holds.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY_DAYS = 3650
SERVING_VALIDITY_DAYS = 365
CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclasses.dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach a Service (it dials ``<svc>.<ns>.svc``)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def make_ca(common_name: str, now: datetime.datetime) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key(), now, CA_VALIDITY_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_serving(ca: KeyPair, dns_names: list[str], now: datetime.datetime) -> KeyPair:
    """A serving certificate for ``dns_names`` (IP literals become IP SANs) signed by ``ca``."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = ca.certificate
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, SERVING_VALIDITY_DAYS)
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in dns_names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def needs_renewal(pair: KeyPair, now: datetime.datetime, renew_before: datetime.timedelta) -> bool:
    """True when ``pair`` expires within ``renew_before`` or cannot be parsed."""
    try:
        return pair.not_after() - now < renew_before
    except ValueError:
        return True


def signed_by(pair: KeyPair, ca: KeyPair) -> bool:
    """True when ``pair``'s certificate was issued by ``ca`` (checks the signature)."""
    try:
        pair.certificate.verify_directly_issued_by(ca.certificate)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def covers(pair: KeyPair, dns_names: list[str]) -> bool:
    """True when the certificate's SANs include every name in ``dns_names``."""
    try:
        san = pair.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    present = set(san.get_values_for_type(x509.DNSName)) | {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    return set(dns_names) <= present


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: datetime.datetime, days: int
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    pkcs8 = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())
