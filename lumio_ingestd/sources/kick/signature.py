"""Kick's webhook signature: RSA PKCS#1 v1.5 with SHA-256, verified with the standard library.

Kick signs `{Kick-Event-Message-Id}.{Kick-Event-Message-Timestamp}.{raw body}`
and sends the base64 signature in `Kick-Event-Signature` (docs/platforms.rst, "Official webhooks").
Verification needs only the public key, so it is done here without a crypto
package: the PEM's SubjectPublicKeyInfo is read with a small DER reader, the
signature raised to the public exponent (`pow(s, e, n)`), and the result
compared, in constant time, with the EMSA-PKCS1-v1_5 encoding of the SHA-256
digest (RFC 8017 8.2.2 and 9.2). The default key is the one Kick publishes,
shipped as package data (`kick_webhook_public_key.pem`, copied from
KickDevDocs events/webhook-security.md; also served at
`GET https://api.kick.com/public/v1/public-key`).

Nothing durable here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from importlib import resources

#: DER of the SHA-256 AlgorithmIdentifier + OCTET STRING header (RFC 8017 9.2, note 1).
SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")
#: OID 1.2.840.113549.1.1.1 (rsaEncryption).
RSA_OID = bytes.fromhex("2a864886f70d010101")
PACKAGED_KEY = "kick_webhook_public_key.pem"


class KeyFormatError(ValueError):
    """The PEM is not an RSA public key this module can read (the message says why)."""


@dataclass(frozen=True, slots=True)
class RsaPublicKey:
    n: int
    e: int

    @property
    def size(self) -> int:
        """The modulus length in bytes (every signature is exactly this long)."""
        return (self.n.bit_length() + 7) // 8


def _der(data: bytes, pos: int, tag: int, where: str) -> tuple[bytes, int]:
    """One DER element of type `tag` at `pos`: (its content, the position after it)."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise KeyFormatError(f"{where}: expected DER tag 0x{tag:02x} at byte {pos}")
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > len(data):
            raise KeyFormatError(f"{where}: bad DER length at byte {pos}")
        length = int.from_bytes(data[pos:pos + count], "big")
        pos += count
    if pos + length > len(data):
        raise KeyFormatError(f"{where}: DER element runs past the end")
    return data[pos:pos + length], pos + length


def parse_public_key_der(der: bytes) -> RsaPublicKey:
    """An RSA key from a SubjectPublicKeyInfo (or a bare PKCS#1 RSAPublicKey) DER."""
    outer, end = _der(der, 0, 0x30, "key")
    if end != len(der):
        raise KeyFormatError("key: trailing bytes after the DER structure")
    if outer[:1] == b"\x02":  # RSAPublicKey: SEQUENCE { n, e }
        return _rsa_public_key(der)
    algorithm, pos = _der(outer, 0, 0x30, "AlgorithmIdentifier")
    oid, _ = _der(algorithm, 0, 0x06, "algorithm OID")
    if oid != RSA_OID:
        raise KeyFormatError("key: not an RSA key (algorithm OID is not rsaEncryption)")
    bits, _ = _der(outer, pos, 0x03, "subjectPublicKey")
    if not bits or bits[0] != 0:
        raise KeyFormatError("key: subjectPublicKey has unused bits")
    return _rsa_public_key(bits[1:])


def _rsa_public_key(der: bytes) -> RsaPublicKey:
    seq, _ = _der(der, 0, 0x30, "RSAPublicKey")
    n_bytes, pos = _der(seq, 0, 0x02, "modulus")
    e_bytes, _ = _der(seq, pos, 0x02, "publicExponent")
    n, e = int.from_bytes(n_bytes, "big"), int.from_bytes(e_bytes, "big")
    if n.bit_length() < 1024 or e < 3 or e % 2 == 0:
        raise KeyFormatError(f"key: implausible RSA key ({n.bit_length()}-bit modulus, exponent {e})")
    return RsaPublicKey(n, e)


def parse_public_key_pem(text: str) -> RsaPublicKey:
    begin, end = "-----BEGIN PUBLIC KEY-----", "-----END PUBLIC KEY-----"
    rsa_begin, rsa_end = "-----BEGIN RSA PUBLIC KEY-----", "-----END RSA PUBLIC KEY-----"
    for head, tail in ((begin, end), (rsa_begin, rsa_end)):
        if head in text:
            start = text.index(head) + len(head)
            stop = text.find(tail, start)
            if stop < 0:
                raise KeyFormatError(f"PEM: {head} without {tail}")
            try:
                der = base64.b64decode("".join(text[start:stop].split()), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise KeyFormatError(f"PEM: body is not base64: {exc}") from None
            return parse_public_key_der(der)
    raise KeyFormatError("PEM: no -----BEGIN PUBLIC KEY----- block")


def packaged_key() -> RsaPublicKey:
    """Kick's published webhook key, as shipped with this package."""
    text = resources.files(__package__).joinpath(PACKAGED_KEY).read_text("ascii")
    return parse_public_key_pem(text)


def signed_bytes(message_id: str, timestamp: str, body: bytes) -> bytes:
    return message_id.encode() + b"." + timestamp.encode() + b"." + body


def emsa_pkcs1_v15_sha256(message: bytes, size: int) -> bytes:
    """The encoded message EM of RFC 8017 9.2 for `message`, `size` bytes long."""
    t = SHA256_DIGEST_INFO + hashlib.sha256(message).digest()
    if size < len(t) + 11:
        raise ValueError("modulus too short for SHA-256 PKCS#1 v1.5")
    return b"\x00\x01" + b"\xff" * (size - len(t) - 3) + b"\x00" + t


def verify(key: RsaPublicKey, message: bytes, signature_b64: str) -> bool:
    """True when `signature_b64` is a valid RSASSA-PKCS1-v1_5 SHA-256 signature of `message`."""
    try:
        sig = base64.b64decode(signature_b64.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(sig) != key.size:
        return False
    s = int.from_bytes(sig, "big")
    if s >= key.n:
        return False
    em = pow(s, key.e, key.n).to_bytes(key.size, "big")
    return hmac.compare_digest(em, emsa_pkcs1_v15_sha256(message, key.size))
