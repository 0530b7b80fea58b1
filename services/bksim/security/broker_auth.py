"""Token authentication at a broker's gRPC server: one grpc.aio server interceptor (PROTOCOL.md §8).

With security.auth_enabled every call of the Broker (ledger) and Topics services must carry the metadata
"authorization: Bearer <token>"; gRPC health and reflection stay open (probes and tools). A call without a
token, or with one that does not verify, ends with UNAUTHENTICATED and a message saying what is missing or
wrong (TokenError's, never the token). The trailer "bksim-status" says UNAUTHENTICATED (or PERMISSION_DENIED).

The verified role travels to the servicers in the context variable CALLER_ROLE (set around the handler, so the
tasks a handler starts see it too): `caller_role()`. With security.authorization_enabled, the raw ledger API
(the Broker service) is allowed here to super-users and security.ledger_roles only; the Topics service checks
each call against its resource (adapters/topic_server.py with security/permissions.py).

Must not: log, count or echo a token; keep per-call state beyond the handler.
"""
from __future__ import annotations

import collections
import contextvars

import grpc

from bksim.security.authz import Authorizer, PermissionDenied
from bksim.security.handlers import around, rebuild
from bksim.security.tokens import TokenError, TokenVerifier, token_from_metadata

STATUS_KEY = "bksim-status"
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
LEDGER_SERVICE_PREFIX = "/bksim.broker.v1.Broker/"

CALLER_ROLE: contextvars.ContextVar[str | None] = contextvars.ContextVar("bksim_caller_role", default=None)


def caller_role() -> str | None:
    """The authenticated role of the call being served (None when authentication is off)."""
    return CALLER_ROLE.get()


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, status: str, message: str):
    """A handler of the same shape as `handler` that ends the call with `code` before reading anything."""
    async def refuse(_request, context) -> None:
        context.set_trailing_metadata(((STATUS_KEY, status),))
        await context.abort(code, message)

    return rebuild(handler, lambda inner: around(inner, before=refuse))


def _with_role(handler: grpc.RpcMethodHandler, role: str):
    """`handler` with CALLER_ROLE set to `role` while its behaviour runs."""
    def scope():
        token = CALLER_ROLE.set(role)
        return lambda: CALLER_ROLE.reset(token)

    return rebuild(handler, lambda inner: around(inner, scope=scope))


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, verifier: TokenVerifier, authorizer: Authorizer | None = None) -> None:
        self.verifier = verifier
        self.authorizer = authorizer  # None: authentication only (any valid role may do anything)
        self.refused: collections.Counter = collections.Counter()  # by TokenError reason / "permission"

    def statistics(self) -> dict:
        return {"refused": dict(self.refused)}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        try:
            role = self.verifier.verify(token_from_metadata(handler_call_details.invocation_metadata))
        except TokenError as e:
            self.refused[e.reason] += 1
            hint = (": send the call metadata 'authorization: Bearer <token>' (bksim --token-file FILE, "
                    "$BKSIM_TOKEN, or Client(token=...))") if e.reason == "missing" else ""
            return _refusing(handler, grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED",
                             f"{method}: authentication failed: {e.message}{hint}")
        if self.authorizer is not None and method.startswith(LEDGER_SERVICE_PREFIX):
            try:
                self.authorizer.require_ledger_api(role, method[len(LEDGER_SERVICE_PREFIX):])
            except PermissionDenied as e:
                self.refused["permission"] += 1
                return _refusing(handler, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", e.message)
        return _with_role(handler, role)


def make_interceptor(security) -> AuthInterceptor | None:
    """The interceptor for a SecurityConfig (None when security.auth_enabled is off); keys are read now, so a
    broker with an unreadable key fails at start (TokenError naming the file)."""
    if not security.auth_enabled:
        return None
    from bksim.security.authz import parse_roles

    verifier = TokenVerifier.from_files(security.token_secret_key_file, security.token_public_key_file)
    authorizer = Authorizer(parse_roles(security.super_user_roles), parse_roles(security.ledger_roles)) \
        if security.authorization_enabled else None
    return AuthInterceptor(verifier, authorizer)
