"""Tokens (security/tokens.py): keys, creation, verification with the key's own algorithm, and errors that never
hold the token or the key."""
from __future__ import annotations

import base64
import json
import os
import stat

import jwt
import pytest

from bksim.security.tokens import (SigningKey, TokenError, TokenVerifier, client_token, create_key_pair,
                                   create_secret_key, create_token, parse_expiry, read_secret_key,
                                   token_from_metadata)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture()
def secret(tmp_path):
    path = str(tmp_path / "secret.key")
    create_secret_key(path)
    return path


@pytest.fixture(params=["RS256", "ES256"])
def pair(tmp_path, request):
    private, public = str(tmp_path / "private.pem"), str(tmp_path / "public.pem")
    create_key_pair(private, public, request.param)
    return request.param, private, public


def test_key_files_are_private_and_never_overwritten(secret, pair):
    _, private, public = pair
    for path in (secret, private, public):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(read_secret_key(secret)) == 32
    with pytest.raises(TokenError, match="exists"):
        create_secret_key(secret)


def test_secret_token_round_trip_and_expiry(secret):
    key = SigningKey.from_secret_file(secret)
    verifier = TokenVerifier.from_files(secret_key_file=secret)
    token = create_token(key, "alice", expiry_s=3600, now_s=1_000_000)
    assert verifier.verify(token, now_s=1_000_000 + 3599) == "alice"
    with pytest.raises(TokenError) as e:
        verifier.verify(token, now_s=1_000_000 + 3600)
    assert e.value.reason == "expired"
    past = create_token(key, "alice", expiry_s=1, now_s=1)  # expired by the wall clock too
    with pytest.raises(TokenError) as e:
        verifier.verify(past)
    assert e.value.reason == "expired" and past not in str(e.value)


def test_pair_token_verifies_with_the_public_key_only(pair):
    algorithm, private, public = pair
    key = SigningKey.from_private_key_file(private)
    assert key.algorithm == algorithm
    verifier = TokenVerifier.from_files(public_key_file=public)
    assert verifier.algorithm == algorithm
    assert verifier.verify(create_token(key, "svc")) == "svc"


def test_wrong_secret_is_a_bad_signature(secret, tmp_path):
    other = str(tmp_path / "other.key")
    create_secret_key(other)
    token = create_token(SigningKey.from_secret_file(other), "mallory")
    with pytest.raises(TokenError) as e:
        TokenVerifier.from_files(secret_key_file=secret).verify(token)
    assert e.value.reason == "bad-signature"
    assert token not in str(e.value)
    assert base64.b64encode(read_secret_key(secret)).decode() not in str(e.value)


def test_alg_none_is_refused(secret, pair):
    _, _, public = pair
    token = _b64url(json.dumps({"alg": "none", "typ": "JWT"}).encode()) + "." + \
        _b64url(json.dumps({"sub": "root"}).encode()) + "."
    for verifier in (TokenVerifier.from_files(secret_key_file=secret), TokenVerifier.from_files(public_key_file=public)):
        with pytest.raises(TokenError) as e:
            verifier.verify(token)
        assert e.value.reason == "wrong-algorithm" and "'none'" in str(e.value)


def test_algorithm_confusion_is_refused(pair):
    """An HS256 token 'signed' with the public key's PEM as the secret: refused by the public key's verifier."""
    _, _, public = pair
    pem = open(public, "rb").read()
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64url(json.dumps({"sub": "root"}).encode())
    import hashlib
    import hmac
    sig = _b64url(hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest())
    with pytest.raises(TokenError) as e:
        TokenVerifier.from_files(public_key_file=public).verify(f"{header}.{body}.{sig}")
    assert e.value.reason == "wrong-algorithm"


def test_other_pair_kind_is_a_wrong_algorithm(tmp_path):
    create_key_pair(str(tmp_path / "r.pem"), str(tmp_path / "r.pub"), "RS256")
    create_key_pair(str(tmp_path / "e.pem"), str(tmp_path / "e.pub"), "ES256")
    token = create_token(SigningKey.from_private_key_file(str(tmp_path / "e.pem")), "x")
    with pytest.raises(TokenError) as e:
        TokenVerifier.from_files(public_key_file=str(tmp_path / "r.pub")).verify(token)
    assert e.value.reason == "wrong-algorithm"


@pytest.mark.parametrize("token,reason", [(None, "missing"), ("", "missing"), ("abc", "malformed"),
                                          ("a.b.c", "malformed"), ("x" * 9000, "malformed")])
def test_missing_and_malformed(secret, token, reason):
    with pytest.raises(TokenError) as e:
        TokenVerifier.from_files(secret_key_file=secret).verify(token)
    assert e.value.reason == reason


def test_token_without_subject(secret):
    token = jwt.encode({"exp": 2**40}, read_secret_key(secret), algorithm="HS256")
    with pytest.raises(TokenError) as e:
        TokenVerifier.from_files(secret_key_file=secret).verify(token)
    assert e.value.reason == "no-subject"


def test_short_or_unreadable_keys(tmp_path):
    short = tmp_path / "short.key"
    short.write_text(base64.b64encode(b"x" * 16).decode())
    with pytest.raises(TokenError, match="at least 32"):
        read_secret_key(str(short))
    with pytest.raises(TokenError, match="cannot read"):
        TokenVerifier.from_files(secret_key_file=str(tmp_path / "absent"))
    with pytest.raises(TokenError, match="no key"):
        TokenVerifier.from_files()


def test_expiry_units():
    assert parse_expiry("1h") == 3600 and parse_expiry("2d") == 172800 and parse_expiry("30s") == 30
    for bad in ("0h", "1x", "h", "-1h", ""):
        with pytest.raises(TokenError):
            parse_expiry(bad)


def test_client_token_sources(tmp_path):
    f = tmp_path / "t"
    f.write_text("  tok-from-file\n")
    assert client_token(str(f), env={"BKSIM_TOKEN": "tok-env"}) == "tok-from-file"
    assert client_token("", env={"BKSIM_TOKEN": "tok-env"}, config_token_file=str(f)) == "tok-env"
    assert client_token("", env={}, config_token_file=str(f)) == "tok-from-file"
    assert client_token("", env={}) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TokenError, match="empty"):
        client_token(str(tmp_path / "empty"), env={})


def test_bearer_metadata_parsing():
    assert token_from_metadata((("x", "y"), ("authorization", "Bearer abc"))) == "abc"
    assert token_from_metadata((("x", "y"),)) is None
    with pytest.raises(TokenError) as e:
        token_from_metadata((("authorization", "Basic secret-value"),))
    assert e.value.reason == "malformed" and "secret-value" not in str(e.value)
