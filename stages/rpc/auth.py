"""The shared secret and the request guard every RPC server puts in front of its routes.

Whoever holds the token can make an agent run arbitrary machine code, so servers refuse to
start without one and bound every request body. The token never travels: each request carries
an HMAC of its method, path, body digest, a timestamp and a fresh nonce, so a captured request
cannot be altered, and replaying it (same nonce, or a timestamp outside the window) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections import deque
from pathlib import Path

import httpx

TOKEN_ENV = "TUNAFLOW_RPC_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY = 64 * 1024 * 1024
AUTH_HEADER = "x-tunaflow-auth"
REPLAY_WINDOW_S = 60.0


class TokenError(ValueError):
    """No usable shared secret."""


def load_token(token_file: str | os.PathLike[str] | None = None) -> str:
    """The token from `token_file`, else from TUNAFLOW_RPC_TOKEN; TokenError says which is missing."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise TokenError(f"cannot read token file {token_file}: {exc.strerror}") from exc
        source = f"token file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        source = TOKEN_ENV
        if not token:
            raise TokenError(f"no RPC token: set {TOKEN_ENV} or pass --token-file")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the RPC token from {source} is shorter than {MIN_TOKEN_CHARS} characters")
    return token


def _mac(token: str, method: str, target: str, ts: str, nonce: str, body_digest: str) -> str:
    msg = "\n".join((method.upper(), target, ts, nonce, body_digest)).encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def signature(token: str, method: str, target: str, body: bytes, now: float | None = None) -> str:
    """The auth header value for one request: `timestamp nonce body-sha256 hmac`."""
    ts, nonce, digest = f"{now or time.time():.3f}", secrets.token_hex(16), hashlib.sha256(body).hexdigest()
    return f"{ts} {nonce} {digest} {_mac(token, method, target, ts, nonce, digest)}"


class RequestSigner(httpx.Auth):
    """httpx auth that signs every request (retries included) with a fresh nonce."""

    requires_request_body = True

    def __init__(self, token: str):
        self._token = token

    def auth_flow(self, request: httpx.Request):
        request.headers[AUTH_HEADER] = signature(self._token, request.method, request.url.raw_path.decode(),
                                                 request.content)
        yield request


class Guard:
    """ASGI middleware: 401 for a missing, wrong, stale or replayed signature (checked before any body
    is read), 413 for a body over `max_body` bytes, 401 when the body does not match its signed digest."""

    def __init__(self, app, token: str, max_body: int = DEFAULT_MAX_BODY, window_s: float = REPLAY_WINDOW_S):
        self.app, self.max_body, self.window_s = app, max_body, window_s
        self._token = token
        self._seen: set[str] = set()
        self._expiry: deque[tuple[float, str]] = deque()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        digest, why = self._check(scope, headers.get(AUTH_HEADER.encode(), b"").decode("latin-1"))
        if why:
            return await _reply(send, 401, why)
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, f"request body over {self.max_body} bytes")
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await _reply(send, 413, f"request body over {self.max_body} bytes")
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
            return await _reply(send, 401, "the request body does not match its signature")
        sent = False

        async def replay_body():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay_body, send)

    def _check(self, scope, header: str) -> tuple[str, str]:
        """(signed body digest, '') for a fresh, valid signature; else ('', why it is refused)."""
        parts = header.split(" ")
        if len(parts) != 4:
            return "", "missing or malformed RPC token signature"
        ts, nonce, digest, mac = parts
        target = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        if not hmac.compare_digest(mac, _mac(self._token, scope["method"], target, ts, nonce, digest)):
            return "", "wrong RPC token (bad signature)"
        now = time.time()
        try:
            skew = abs(now - float(ts))
        except ValueError:
            return "", "malformed signature timestamp"
        if not skew <= self.window_s:
            return "", f"stale request: signed {skew:.0f} s away from this server's clock (window {self.window_s:g} s)"
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(self._expiry.popleft()[1])
        if nonce in self._seen:
            return "", "replayed request: this signature was already used"
        self._seen.add(nonce)
        self._expiry.append((now + 2 * self.window_s, nonce))
        return digest, ""


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
