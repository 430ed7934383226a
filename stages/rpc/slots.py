"""Connection slots for authenticated work: idle strangers cannot crowd out the agents' long polls.

uvicorn answers 503 to every request once `limit_concurrency` connections are open, and it never
times out a request head that is still arriving, so a few hundred sockets that send nothing
(no token needed) would lock out the agents and get them dropped. Here a connection that has not
yet carried a validly signed request gets HEAD_S to send a complete request head (and again after
each answer); once the Guard has seen a valid signature on it, IDLE_S. The limit is high (1024 by
default, the file limit raised to fit), and near it (from `evict_at(limit)` open connections on)
each new connection closes the oldest idle one that never authenticated, so strangers can only
compete with each other for what is left. On shutdown the tracker is told first, so its long
polls answer at once instead of being cancelled.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_S = 2.0  # a connection that has not authenticated must complete a request head within this
IDLE_S = 10.0  # an authenticated connection with no request in progress for this long is closed
LIMIT = 1024  # default open connections (uvicorn's limit_concurrency: past it every request is a 503)
FDS_RESERVED = 64  # descriptors kept for everything but connections


def evict_at(limit: int) -> int:
    """Open connections from which a new one evicts an idle unauthenticated one: room is kept for agents."""
    return limit - max(8, limit // 8)


def protocol(trusted: set, limit: int, on_shutdown: Callable[[], None]) -> type[H11Protocol]:
    """An h11 protocol class sharing `trusted` (client addresses the Guard saw a valid signature from)."""
    crowded = evict_at(limit)

    class Slotted(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._since = time.monotonic()
            self._idle = None
            self._arm()
            if len(self.connections) > crowded:
                self._evict()

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

        def _evict(self) -> None:
            strangers = [p for p in self.connections if isinstance(p, Slotted) and p is not self
                         and not p._trusted() and p._waiting() and not p.transport.is_closing()]
            if strangers:
                min(strangers, key=lambda p: p._since).transport.close()

    return Slotted


def fit_fd_limit(limit: int) -> int:
    """Raise the soft file limit so `limit` connections fit (as far as the hard limit allows); the limit that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limit + FDS_RESERVED
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return limit if soft == resource.RLIM_INFINITY else min(limit, soft - FDS_RESERVED)
