"""The shared secret and the request guard every RPC server puts in front of its routes.

Whoever holds the token can make an agent run arbitrary machine code, so servers refuse to
start without one, compare it in constant time, and bound every request body.
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path

TOKEN_ENV = "TUNAFLOW_RPC_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY = 64 * 1024 * 1024


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


def auth_headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Guard:
    """ASGI middleware: 401 without the right bearer token, 413 for a body over `max_body` bytes."""

    def __init__(self, app, token: str, max_body: int = DEFAULT_MAX_BODY):
        self.app, self.max_body = app, max_body
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if not hmac.compare_digest(headers.get(b"authorization", b""), self._expected):
            return await _reply(send, 401, "missing or wrong RPC token")
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await _reply(send, 413, f"request body over {self.max_body} bytes")
        seen = 0

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise _TooLarge
            return message

        try:
            await self.app(scope, bounded_receive, send)
        except _TooLarge:
            await _reply(send, 413, f"request body over {self.max_body} bytes")


class _TooLarge(Exception):
    pass


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
