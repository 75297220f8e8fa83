"""One HTTP request under a total deadline, ended early when opendrs stops — for every backend
that talks to an API (Proxmox through requests, Incus through httpx).

Each try of a call (one request to one host) runs on a thread of its own (:class:`Try`) while
the calling thread waits for it (:meth:`Tries.run`), asking every 0.2 s whether it must stop. The
backend's transport tells the try under way which sockets it uses (:func:`track`), so a try given
up on (deadline passed, stop requested) has its connections shut down and its thread ends soon
after. A server that answers one byte at a time never holds a call beyond its deadline: the
deadline is the whole try's — connecting, TLS, sending, the whole answer — not each read's.

Threads of tries given up on that have not ended yet are counted; beyond
:data:`STRAGGLERS_MAX`, calls fail at once instead of piling up. When the backend closes
(:meth:`Tries.close`, opendrs stopping), every try still running is given up on and its thread
waited for, :data:`CLOSE_GRACE` seconds at most: a thread that outlasts it (a connection being
opened to a host that does not answer: no socket to shut yet) is left to end with the process,
and a warning says how many were.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from opendrs.backends.base import Abandoned, BackendError

#: How often a call waiting for its answer asks whether opendrs is stopping, in seconds.
STOP_POLL: Final = 0.2
#: Threads of tries given up on that may still be ending; beyond, calls fail at once.
STRAGGLERS_MAX: Final = 16

#: Seconds :meth:`Tries.close` waits for the threads of the tries still running.
CLOSE_GRACE: Final = 3.0

log = logging.getLogger(__name__)

#: Per thread: the try under way (on a try's thread).
_local = threading.local()


class Expired(BackendError):
    """A try that did not end within its deadline."""


class Try:
    """One HTTP request to one host, on a thread of its own; :meth:`abandon` ends it early."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work = work
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._abandoned = False

    def run(self) -> None:
        _local.current = self
        try:
            self.result = self._work()
        except BaseException as exc:  # handed over to the waiting caller
            self.error = exc
        finally:
            _local.current = None
            self.done.set()

    def track(self, sock: socket.socket) -> None:
        """A socket this try uses (shut down at once when the try was given up on)."""
        with self._lock:
            if not self._abandoned:
                if all(sock is not known for known in self._sockets):
                    self._sockets.append(sock)
                return
        shut(sock)

    def abandon(self) -> None:
        """Shut the try's connections down: whatever its thread waits for ends with an error."""
        with self._lock:
            self._abandoned = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            shut(sock)


def track(sock: socket.socket | None) -> None:
    """Tell the try under way on this thread (if any) that it uses ``sock``."""
    current: Try | None = getattr(_local, "current", None)
    if current is not None and sock is not None:
        current.track(sock)


def shut(sock: socket.socket) -> None:
    """Shut a connection down in both directions (best effort)."""
    # Not SSLSocket.shutdown (which drops its TLS state under a reading thread): the socket's own.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def handle_of(sock: socket.socket | None) -> socket.socket | None:
    """A second descriptor of a connection's socket: shutting it down from another thread ends
    a TLS handshake or a read under way, whatever object wraps the socket by then."""
    if sock is None:
        return None
    with contextlib.suppress(OSError):
        return sock.dup()
    return None


def pause(seconds: float, stop: Callable[[], bool]) -> None:
    """Sleep ``seconds`` in slices of :data:`STOP_POLL`; return early once ``stop()``."""
    end = time.monotonic() + seconds
    while not stop():
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, STOP_POLL))


class Tries:
    """Runs tries under their deadline for one API client; counts those given up on."""

    def __init__(self, api: str, thread_name: str, stop_reason: Callable[[], str | None]) -> None:
        """``api`` names the API in the log (``Proxmox API``); ``stop_reason()``: why calls must
        end now (asked on the calling thread), or None."""
        self._api = api
        self._thread_name = thread_name
        self._stop_reason = stop_reason
        self._lock = threading.Lock()
        #: The tries whose thread has not ended yet (given up on or not), with their thread.
        self._running: dict[Try, threading.Thread] = {}
        #: The running tries given up on.
        self._given_up: set[Try] = set()

    def run(self, work: Callable[[], Any], *, what: str, seconds: float, uncertain: bool) -> Any:
        """``work()`` on a thread of its own; its result, or its exception.

        ``what`` names the request and where it goes (the start of every error's text). Raises
        :class:`Abandoned` when opendrs stops (before sending: nothing was sent), :class:`Expired`
        when ``seconds`` pass first, :class:`BackendError` when too many tries given up on are
        still ending. ``uncertain``: a request given up on may have arrived and taken effect.
        """
        reason = self._stop_reason()
        if reason is not None:
            raise Abandoned(f"{what}: not sent: {reason}")
        with self._lock:
            stragglers = len(self._given_up)
        if stragglers >= STRAGGLERS_MAX:
            raise BackendError(
                f"{what}: not sent: {stragglers} calls given up on have not ended yet"
            )
        attempt = Try(work)
        thread = threading.Thread(
            target=self._run_try, args=(attempt,), name=self._thread_name, daemon=True
        )
        with self._lock:
            self._running[attempt] = thread
        deadline = time.monotonic() + seconds
        try:
            thread.start()
        except BaseException:
            with self._lock:
                self._running.pop(attempt, None)
            raise
        ended = False
        try:
            while not attempt.done.wait(max(0.0, min(STOP_POLL, deadline - time.monotonic()))):
                reason = self._stop_reason()
                if reason is None and time.monotonic() < deadline:
                    continue
                if reason is not None:
                    raise Abandoned(f"{what}: given up: {reason}", uncertain=uncertain)
                raise Expired(f"{what}: no answer within {seconds:g}s", uncertain=uncertain)
            ended = True
        finally:
            if not ended:  # given up on (or the waiting thread was interrupted): let it go
                with self._lock:
                    if attempt in self._running:
                        self._given_up.add(attempt)
                attempt.abandon()
        if attempt.error is not None:
            raise attempt.error
        return attempt.result

    def _run_try(self, attempt: Try) -> None:
        """A try's thread: the try, then it is no longer counted as running."""
        try:
            attempt.run()
        finally:
            with self._lock:
                self._running.pop(attempt, None)
                self._given_up.discard(attempt)

    def close(self, seconds: float = CLOSE_GRACE) -> int:
        """Give up on every try still running (their connections shut down) and wait up to
        ``seconds`` in all for their threads to end: how many are still running then (logged
        at WARNING, left to end with the process)."""
        with self._lock:
            running = list(self._running.items())
        for attempt, _ in running:
            attempt.abandon()
        deadline = time.monotonic() + seconds
        for _, thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = sum(1 for _, thread in running if thread.is_alive())
        if left:
            log.warning(
                "%d call(s) to the %s still running %gs after their connections were shut: "
                "left to end with the process",
                left,
                self._api,
                seconds,
            )
        return left
