"""Signed tokens (JWT) for broker authentication, Pulsar's model (PROTOCOL.md §8): the role is the `sub` claim,
`exp` is optional.

Keys: an HS256 secret (at least SECRET_KEY_BYTES_MIN random bytes, stored base64 in a file), or a key pair: RS256
(RSA 2048) or ES256 (EC P-256) in PEM files. Brokers check with the secret or the public key; whoever creates
tokens needs the secret or the private key. Key files are written mode 0600 (`write_private`).

Verification takes its algorithm allow-list from the kind of key, never from the token: {HS256} for a secret,
{RS256} for an RSA public key, {ES256} for an EC one. So `alg: none` and algorithm confusion (an HS256 token
"signed" with the public key as a secret) are refused as a wrong algorithm before any signature check.

Errors: TokenError with a `reason` (one of REASONS) and a message that says what is missing or wrong. Must not:
put a token, a secret or a key into a message, a log line or an exception (PyJWT's own texts are not passed on).
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bksim.model.errors import BksimError

SECRET_KEY_BYTES = 32  # what `create_secret_key` makes (HS256: a key as long as the hash)
SECRET_KEY_BYTES_MIN = 32  # a shorter secret is refused when loaded (RFC 7518 §3.2)
RSA_KEY_BITS = 2048
TOKEN_BYTES_MAX = 8 * 1024  # a longer bearer value is refused as malformed before it is parsed
KEY_FILE_BYTES_MAX = 64 * 1024
PAIR_ALGORITHMS = ("RS256", "ES256")
TOKEN_ENV = "BKSIM_TOKEN"  # the token itself, for clients (the CLI), when no token file is named
BEARER = "bearer "
_EXPIRY = re.compile(r"^([0-9]+)([smhdwy])$")
_EXPIRY_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}

REASONS = ("missing", "malformed", "expired", "bad-signature", "wrong-algorithm", "no-subject", "key")


class TokenError(BksimError):
    """A token or a key that cannot be used; `reason` is one of REASONS. The message never holds the token."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---- keys ----------------------------------------------------------------------------------------------------

def write_private(path: str, data: bytes) -> None:
    """Write `data` to a new file readable by its owner only (0600, also when the umask is wider). An existing
    file is refused: a key is never overwritten by accident."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise TokenError("key", f"{path} exists: not overwriting a key file") from None
    except OSError as e:
        raise TokenError("key", f"cannot create {path}: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def create_secret_key(path: str) -> None:
    """A new random HS256 secret, base64 in `path` (mode 0600)."""
    write_private(path, base64.b64encode(secrets.token_bytes(SECRET_KEY_BYTES)) + b"\n")


def create_key_pair(private_key_file: str, public_key_file: str, algorithm: str = "RS256") -> None:
    """A new RS256 (RSA 2048) or ES256 (EC P-256) key pair: PKCS#8 private key and SubjectPublicKeyInfo public
    key, PEM, both files mode 0600."""
    if algorithm == "RS256":
        key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm == "ES256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise TokenError("key", f"algorithm {algorithm!r} is not one of {', '.join(PAIR_ALGORITHMS)}")
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    write_private(private_key_file, private)
    write_private(public_key_file, public)


def _read_key_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(KEY_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise TokenError("key", f"cannot read the {what} file {path}: {e.strerror}") from None
    if len(data) > KEY_FILE_BYTES_MAX:
        raise TokenError("key", f"the {what} file {path} is longer than {KEY_FILE_BYTES_MAX} bytes")
    return data


def read_secret_key(path: str) -> bytes:
    """The HS256 secret of `path`: base64 text (what create_secret_key writes)."""
    text = _read_key_file(path, "secret key").strip()
    try:
        secret = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise TokenError("key", f"the secret key file {path} is not base64 "
                                f"(`bksim tokens create-secret-key` makes one)") from None
    if len(secret) < SECRET_KEY_BYTES_MIN:
        raise TokenError("key", f"the secret key in {path} has {len(secret)} bytes; at least {SECRET_KEY_BYTES_MIN} "
                                f"are needed")
    return secret


def _pair_algorithm(key, path: str) -> str:
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        if key.key_size < RSA_KEY_BITS:
            raise TokenError("key", f"the RSA key in {path} has {key.key_size} bits; at least {RSA_KEY_BITS}")
        return "RS256"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if not isinstance(key.curve, ec.SECP256R1):
            raise TokenError("key", f"the EC key in {path} is on {key.curve.name}; ES256 needs P-256 (secp256r1)")
        return "ES256"
    raise TokenError("key", f"the key in {path} is neither RSA nor EC P-256")


@dataclass(frozen=True, slots=True)
class SigningKey:
    """What creates tokens: the HS256 secret or a private key, with its one algorithm."""
    algorithm: str
    key: object

    @staticmethod
    def from_secret_file(path: str) -> "SigningKey":
        return SigningKey("HS256", read_secret_key(path))

    @staticmethod
    def from_private_key_file(path: str) -> "SigningKey":
        try:
            key = serialization.load_pem_private_key(_read_key_file(path, "private key"), password=None)
        except (ValueError, TypeError):
            raise TokenError("key", f"the private key file {path} is not an unencrypted PEM private key") from None
        return SigningKey(_pair_algorithm(key, path), key)

    def __repr__(self) -> str:  # never the key
        return f"SigningKey({self.algorithm})"


def parse_expiry(text: str) -> int:
    """'30s', '15m', '1h', '7d', '2w', '1y' (Pulsar's --expiry-time units) -> seconds (> 0)."""
    m = _EXPIRY.match(text.strip()) if isinstance(text, str) else None
    if not m or int(m.group(1)) == 0:
        raise TokenError("malformed", f"expiry {text!r} is not N followed by one of s, m, h, d, w, y (N > 0)")
    return int(m.group(1)) * _EXPIRY_UNIT_S[m.group(2)]


def create_token(key: SigningKey, subject: str, *, expiry_s: int | None = None, now_s: float | None = None) -> str:
    """A token whose role is `subject`, expiring `expiry_s` seconds after `now_s` (None: never)."""
    if not subject or not isinstance(subject, str):
        raise TokenError("no-subject", "a token needs a subject (the role)")
    claims: dict = {"sub": subject}
    if expiry_s is not None:
        claims["exp"] = int((time.time() if now_s is None else now_s) + expiry_s)
    return jwt.encode(claims, key.key, algorithm=key.algorithm)


class TokenVerifier:
    """Checks tokens with the HS256 secret or a public key; `verify(token)` -> role."""

    def __init__(self, algorithm: str, key) -> None:
        self.algorithm = algorithm  # the allow-list: this one algorithm, from the key
        self._key = key

    def __repr__(self) -> str:  # never the key
        return f"TokenVerifier({self.algorithm})"

    @staticmethod
    def from_files(secret_key_file: str = "", public_key_file: str = "") -> "TokenVerifier":
        """From the secret key file, else the public key file (security.token_secret_key_file /
        token_public_key_file)."""
        if secret_key_file:
            return TokenVerifier("HS256", read_secret_key(secret_key_file))
        if not public_key_file:
            raise TokenError("key", "no key to check tokens with: set security.token_secret_key_file or "
                                    "security.token_public_key_file")
        try:
            key = serialization.load_pem_public_key(_read_key_file(public_key_file, "public key"))
        except (ValueError, TypeError):
            raise TokenError("key", f"the public key file {public_key_file} is not a PEM public key") from None
        return TokenVerifier(_pair_algorithm(key, public_key_file), key)

    def verify(self, token: str | None, *, now_s: float | None = None) -> str:
        """The role (`sub`) of a valid token; TokenError naming what is wrong otherwise."""
        if not token:
            raise TokenError("missing", "no token")
        if len(token) > TOKEN_BYTES_MAX:
            raise TokenError("malformed", f"token longer than {TOKEN_BYTES_MAX} bytes")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenError("malformed", "the token is not a JWT (header.payload.signature, base64url)") from None
        alg = header.get("alg")
        if alg != self.algorithm:
            shown = alg if isinstance(alg, str) and alg.isalnum() and len(alg) <= 16 else "?"
            raise TokenError("wrong-algorithm", f"token algorithm {shown!r} is not accepted: this broker checks "
                                                f"{self.algorithm} tokens only")
        try:
            claims = jwt.decode(token, self._key, algorithms=[self.algorithm],
                                options={"require": [], "verify_aud": False, "verify_iat": False,
                                         "verify_exp": now_s is None})  # a given now_s: checked below
            if now_s is not None and "exp" in claims and float(claims["exp"]) <= now_s:
                raise jwt.ExpiredSignatureError()
        except jwt.ExpiredSignatureError:
            raise TokenError("expired", "the token has expired") from None
        except jwt.InvalidSignatureError:
            raise TokenError("bad-signature", "the token's signature does not verify with this broker's key") from None
        except (jwt.PyJWTError, TypeError, ValueError):
            raise TokenError("malformed", "the token's claims do not decode (bad JSON, or a non-numeric exp)") \
                from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise TokenError("no-subject", "the token has no subject (sub), so no role")
        return sub


# ---- clients -------------------------------------------------------------------------------------------------

def read_token_file(path: str) -> str:
    """The token in `path` (surrounding whitespace dropped); TokenError naming the file, never its content."""
    try:
        with open(path, "rb") as f:
            data = f.read(TOKEN_BYTES_MAX + 1)
    except OSError as e:
        raise TokenError("missing", f"cannot read the token file {path}: {e.strerror}") from None
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError("malformed", f"the token file {path} is not ASCII text") from None
    if not token:
        raise TokenError("missing", f"the token file {path} is empty")
    if len(token) > TOKEN_BYTES_MAX:
        raise TokenError("malformed", f"the token in {path} is longer than {TOKEN_BYTES_MAX} bytes")
    return token


def client_token(token_file: str = "", env: Mapping[str, str] | None = None, config_token_file: str = "") -> str | None:
    """The token a client presents: the named file, else $BKSIM_TOKEN, else security.token_file; None without."""
    env = os.environ if env is None else env
    if token_file:
        return read_token_file(token_file)
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    if config_token_file:
        return read_token_file(config_token_file)
    return None


def bearer_metadata(token: str) -> tuple[str, str]:
    """The gRPC metadata pair that carries `token`."""
    return ("authorization", f"Bearer {token}")


class BearerStub:
    """A generated gRPC stub whose every call (unary or stream) carries "authorization: Bearer <token>"."""

    def __init__(self, stub, token: str) -> None:
        self._stub = stub
        self._metadata = (bearer_metadata(token),)

    def __repr__(self) -> str:  # never the token
        return f"BearerStub({type(self._stub).__name__})"

    def __getattr__(self, method: str):
        call = getattr(self._stub, method)
        return lambda *args, **kwargs: call(*args, metadata=self._metadata, **kwargs)


def token_from_metadata(metadata) -> str | None:
    """The bearer token of gRPC invocation metadata; None when there is no authorization header; TokenError
    (malformed) when the header is not 'Bearer <token>'."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            if isinstance(value, bytes):
                raise TokenError("malformed", "the authorization header is binary, not 'Bearer <token>'")
            if not value.lower().startswith(BEARER):
                raise TokenError("malformed", "the authorization header is not 'Bearer <token>'")
            return value[len(BEARER):].strip() or None
    return None
