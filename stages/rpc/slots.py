"""Connection slots for authenticated work: idle strangers cannot crowd out the agents' long polls.

uvicorn answers 503 to every request once `limit_concurrency` connections are open, and it never
times out a request head that is still arriving, so a few hundred sockets that send nothing
(no token needed) would lock out the agents and get them dropped. Here a connection that has not
yet carried a validly signed request gets HEAD_S to send a complete request head (and again after
each answer); once the Guard has seen a valid signature on it, IDLE_S. And from EVICT_AT open
connections on, each new one closes the oldest idle connection that never authenticated, so
strangers can only compete with each other for what is left.
"""

from __future__ import annotations

import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_S = 2.0  # a connection that has not authenticated must complete a request head within this
IDLE_S = 10.0  # an authenticated connection with no request in progress for this long is closed
EVICT_AT = 256  # open connections from which new ones evict idle unauthenticated ones
LIMIT = 1024  # uvicorn's limit_concurrency: room for EVICT_AT strangers plus the authenticated ones
FDS_WANTED = 4096


def protocol(trusted: set) -> type[H11Protocol]:
    """An h11 protocol class sharing `trusted` (client addresses the Guard saw a valid signature from)."""

    class Slotted(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._since = time.monotonic()
            self._idle = None
            self._arm()
            if len(self.connections) > EVICT_AT:
                self._evict()

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


def raise_fd_limit() -> None:
    """Let the server hold LIMIT connections even where the soft file limit is 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < FDS_WANTED:
        new = FDS_WANTED if hard == resource.RLIM_INFINITY else min(FDS_WANTED, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
