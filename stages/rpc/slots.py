"""Connection slots for authenticated work: idle strangers cannot crowd out the agents' long polls.

uvicorn answers 503 to every request once `limit_concurrency` connections are open, and it never
times out a request head that is still arriving, so a few hundred sockets that send nothing
(no token needed) would lock out the agents and get them dropped. Here admission is ours instead
(uvicorn's own limit is off): a connection that has not yet carried a validly signed request gets
HEAD_S to send a complete request head (and again after each answer); once the Guard has seen a
valid signature on it, IDLE_S. Past `limit` open connections (1024 by default, the file limit
raised to fit), a new one closes the oldest idle connection that never authenticated, or is
closed itself if there is none: strangers only ever compete with each other, and an
authenticated connection is never refused nor answered 503. On shutdown the tracker is told
first, so its long polls answer at once instead of being cancelled.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_S = 2.0  # a connection that has not authenticated must complete a request head within this
IDLE_S = 10.0  # an authenticated connection with no request in progress for this long is closed
LIMIT = 1024  # default open connections
FDS_RESERVED = 64  # descriptors kept for everything but connections


def protocol(trusted: set, limit: int, on_shutdown: Callable[[], None]) -> type[H11Protocol]:
    """An h11 protocol class admitting at most `limit` connections, sharing `trusted` (client addresses the
    Guard saw a valid signature from)."""

    class Slotted(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._since = time.monotonic()
            self._idle = None
            self._arm()
            if len(self.connections) > limit:
                self._make_room()

        def shutdown(self) -> None:
            on_shutdown()
            super().shutdown()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._idle is not None:
                self._idle.cancel()
            trusted.discard(self.client)
            super().connection_lost(exc)

        def _trusted(self) -> bool:
            return self.client in trusted

        def _waiting(self) -> bool:
            """No request in progress: before the first head, or after the last answer."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._idle is not None:
                self._idle.cancel()
            self._idle = self.loop.call_later(IDLE_S if self._trusted() else HEAD_S, self._close_if_idle)

        def _close_if_idle(self) -> None:
            if self._waiting() and not self.transport.is_closing():
                self.transport.close()

        def _make_room(self) -> None:
            strangers = [p for p in self.connections if isinstance(p, Slotted) and p is not self
                         and not p._trusted() and p._waiting() and not p.transport.is_closing()]
            victim = min(strangers, key=lambda p: p._since) if strangers else self
            victim.transport.close()

    return Slotted


def fit_fd_limit(limit: int) -> int:
    """Raise the soft file limit so `limit` connections fit (as far as the hard limit allows); the limit that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limit + FDS_RESERVED
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit if soft == resource.RLIM_INFINITY else min(limit, soft - FDS_RESERVED)
