"""The shared secret, signed requests and signed responses between every RPC party.

Whoever holds the token can make an agent run arbitrary machine code, so authentication goes both
ways. The token never travels. Each request carries an HMAC of its method, path, body digest,
the tracker's epoch, a timestamp and a fresh nonce: a captured request cannot be altered, and
replaying it is refused (same nonce while the tracker runs, a timestamp outside the window, or an
epoch from before the tracker's last start: the epoch is drawn anew at every start, so the
in-memory nonce set losing its contents on a restart opens no hole). Each response carries an
HMAC of its status, body digest, the epoch and the request's nonce, so a client or agent accepts
only an answer made for this very request by a holder of the token: nothing else that answers on
the tracker's address (a process that took its port, a replayed capture) is believed, and no
object reaches a loader unless it came that way. A client learns the epoch from the tracker's
signed refusal of its first request and signs again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections import deque
from pathlib import Path

import httpx

TOKEN_ENV = "TUNAFLOW_RPC_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY = 64 * 1024 * 1024
MAX_REPLY_BYTES = 96 * 1024 * 1024
AUTH_HEADER = "x-tunaflow-auth"
REPLY_HEADER = "x-tunaflow-reply"
REPLAY_WINDOW_S = 60.0
NO_EPOCH = "-"
_OTHER_EPOCH = "request signed for another start of the tracker"

_REQUEST = re.compile(r"(-|[0-9a-f]{32}) ([0-9]{1,12}(?:\.[0-9]{1,6})?) ([0-9a-f]{32}) ([0-9a-f]{64}) ([0-9a-f]{64})")
_REPLY = re.compile(r"([0-9a-f]{32}) ([0-9a-f]{64})")


class TokenError(ValueError):
    """No usable shared secret."""


class UntrustedResponse(httpx.HTTPError):
    """An answer that is not signed, for this request, by a holder of the token: never used."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code


def load_token(token_file: str | os.PathLike[str] | None = None) -> str:
    """The token from `token_file`, else from TUNAFLOW_RPC_TOKEN; TokenError says which is missing."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenError(f"cannot read token file {token_file}: {getattr(exc, 'strerror', None) or exc}") from exc
        source = f"token file {token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        source = TOKEN_ENV
        if not token:
            raise TokenError(f"no RPC token: set {TOKEN_ENV} or pass --token-file")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the RPC token from {source} is shorter than {MIN_TOKEN_CHARS} characters")
    return token


def new_epoch() -> str:
    """A tracker start's identity; requests signed for another start are refused."""
    return secrets.token_hex(16)


def _mac(token: str, *fields: str) -> str:
    return hmac.new(token.encode(), "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def _request_mac(token: str, method: str, target: str, epoch: str, ts: str, nonce: str, digest: str) -> str:
    return _mac(token, "tunaflow-request-v2", method.upper(), target, epoch, ts, nonce, digest)


def reply_mac(token: str, epoch: str, status: int, nonce: str, body: bytes) -> str:
    """The HMAC a response for the request with `nonce` carries."""
    return _mac(token, "tunaflow-response-v2", epoch, str(status), nonce, hashlib.sha256(body).hexdigest())


def signature(token: str, method: str, target: str, body: bytes, now: float | None = None,
              epoch: str = NO_EPOCH) -> str:
    """The auth header value for one request: `epoch timestamp nonce body-sha256 hmac`."""
    ts, nonce, digest = f"{now or time.time():.3f}", secrets.token_hex(16), hashlib.sha256(body).hexdigest()
    return f"{epoch} {ts} {nonce} {digest} {_request_mac(token, method, target, epoch, ts, nonce, digest)}"


def nonce_of(header: str) -> str:
    return header.split(" ")[2]


def verify_reply(token: str, nonce: str, response: httpx.Response) -> str:
    """The tracker's epoch from a response to the request signed with `nonce`; UntrustedResponse unless the
    response is signed for exactly that request by a holder of the token."""
    header = response.headers.get(REPLY_HEADER, "")
    match = _REPLY.fullmatch(header)
    where = f"{response.request.method} {response.request.url.path}"
    if match is None:
        raise UntrustedResponse(f"{response.status_code} answer to {where} carries no tracker signature",
                                response.status_code)
    epoch, mac = match.groups()
    if not hmac.compare_digest(mac, reply_mac(token, epoch, response.status_code, nonce, response.content)):
        raise UntrustedResponse(f"{response.status_code} answer to {where} has a signature that is not for this "
                                "request or not made with the RPC token", response.status_code)
    return epoch


class RequestSigner(httpx.Auth):
    """httpx auth that signs every request (retries included) with a fresh nonce and accepts only responses
    signed for it; a signed refusal naming a new epoch (the tracker restarted) is answered by signing again."""

    def __init__(self, token: str):
        self._token = token
        self.epoch = NO_EPOCH

    def _sign(self, request: httpx.Request) -> tuple[str, str]:
        epoch = self.epoch
        header = signature(self._token, request.method, request.url.raw_path.decode(), request.content, epoch=epoch)
        request.headers[AUTH_HEADER] = header
        return nonce_of(header), epoch

    @staticmethod
    def _admit(response: httpx.Response) -> None:
        """Refuse before reading the body: no signature header, or a body of unknown length or larger than any
        tracker answer (the tracker always sends a length), so nothing can make an agent read without end."""
        where = f"{response.request.method} {response.request.url.path}"
        if REPLY_HEADER not in response.headers:
            raise UntrustedResponse(f"{response.status_code} answer to {where} carries no tracker signature",
                                    response.status_code)
        length = response.headers.get("content-length")
        if length is None and response.status_code not in (204, 304):
            raise UntrustedResponse(f"{response.status_code} answer to {where} has no length", response.status_code)
        if length is not None and (not length.isdigit() or int(length) > MAX_REPLY_BYTES):
            raise UntrustedResponse(f"{response.status_code} answer to {where} of {length} bytes is over "
                                    f"{MAX_REPLY_BYTES}", response.status_code)

    def _again(self, response: httpx.Response, nonce: str, sent_epoch: str) -> bool:
        """Check the read response; True when it is the tracker's signed request to sign for a new epoch."""
        self.epoch = verify_reply(self._token, nonce, response)
        return response.status_code == 401 and self.epoch != sent_epoch

    def sync_auth_flow(self, request: httpx.Request):
        request.read()
        for attempt in range(2):
            nonce, epoch = self._sign(request)
            response = yield request
            self._admit(response)
            response.read()
            if not (self._again(response, nonce, epoch) and attempt == 0):
                return

    async def async_auth_flow(self, request: httpx.Request):
        await request.aread()
        for attempt in range(2):
            nonce, epoch = self._sign(request)
            response = yield request
            self._admit(response)
            await response.aread()
            if not (self._again(response, nonce, epoch) and attempt == 0):
                return


class Guard:
    """ASGI middleware in front of every route. Refuses, before any body is read: a missing, malformed or
    wrong signature (401, unsigned: the asker has not shown it holds the token), a stale, replayed or
    other-epoch one (401, signed), a body over `max_body` bytes (413); then a body that does not match its
    signed digest (401). Every response to a request with a valid signature is signed for its nonce.
    `trusted` collects the client addresses whose connections carried a valid signature (for the server's
    connection slots)."""

    def __init__(self, app, token: str, max_body: int = DEFAULT_MAX_BODY, window_s: float = REPLAY_WINDOW_S,
                 epoch: str | None = None, trusted: set | None = None):
        self.app, self.max_body, self.window_s = app, max_body, window_s
        self.epoch = epoch or new_epoch()
        self.trusted = trusted if trusted is not None else set()
        self._token = token
        self._seen: set[str] = set()
        self._expiry: deque[tuple[float, str]] = deque()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        fields, why = self._authentic(scope, headers.get(AUTH_HEADER.encode(), b""))
        if fields is None:
            return await _reply(send, 401, why)
        _, ts, nonce, digest, _ = fields
        send = self._signing(send, nonce)
        why = self._fresh(fields)
        if scope.get("client") and (not why or why.startswith(_OTHER_EPOCH)):
            self.trusted.add(tuple(scope["client"]))  # a holder of the token (about to sign again, for a new epoch)
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

    def _authentic(self, scope, raw: bytes) -> tuple[tuple[str, ...] | None, str]:
        """(the header's fields, '') when its HMAC is right; else (None, why it is refused)."""
        try:
            match = _REQUEST.fullmatch(raw.decode("ascii"))
        except UnicodeDecodeError:
            match = None
        if match is None:
            return None, "missing or malformed RPC token signature"
        epoch, ts, nonce, digest, mac = match.groups()
        target = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        if not hmac.compare_digest(mac, _request_mac(self._token, scope["method"], target, epoch, ts, nonce, digest)):
            return None, "wrong RPC token (bad signature)"
        return match.groups(), ""

    def _fresh(self, fields: tuple[str, ...]) -> str:
        """'' for a request inside the window, with an unseen nonce, of this epoch; else why not (in that order: a
        fresh request of another epoch comes from a client that has yet to learn it)."""
        epoch, ts, nonce, _, _ = fields
        now = time.time()
        skew = abs(now - float(ts))
        if not skew <= self.window_s:
            return f"stale request: signed {skew:.0f} s away from this server's clock (window {self.window_s:g} s)"
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(self._expiry.popleft()[1])
        if nonce in self._seen:
            return "replayed request: this signature was already used"
        self._seen.add(nonce)
        self._expiry.append((now + 2 * self.window_s, nonce))
        if epoch != self.epoch:
            return f"{_OTHER_EPOCH}: sign again for this epoch"
        return ""

    def _signing(self, send, nonce: str):
        """`send` that holds the response head until the whole body is known, then adds its signature."""
        start: dict = {}
        chunks: list[bytes] = []

        async def signed_send(message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                return await send(message)
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return None
            body = b"".join(chunks)
            mac = reply_mac(self._token, self.epoch, start["status"], nonce, body)
            headers = [*start.get("headers", []), (REPLY_HEADER.encode(), f"{self.epoch} {mac}".encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return signed_send


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
