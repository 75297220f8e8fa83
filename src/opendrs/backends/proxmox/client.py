"""Calls to the Proxmox API: hosts in turn, a deadline per try, bounded retries, errors as
:class:`~opendrs.backends.base.BackendError` s that never hold the secret.

Deadlines: each try of a call — one HTTP request to one host: connect, TLS, send, the whole
answer — ends within ``timeout``, whatever the server does (it runs on a thread of its own, which
the caller stops waiting for; the try's sockets are then shut down, so the thread ends too, see
:mod:`opendrs.backends.proxmox.transport`). Calls fail at once while too many tries given up on
are still ending: they cannot pile up. A read is tried again after a timeout, a lost connection
or a passing server error, on each host in turn, ``retries`` more times with exponential backoff,
so one read takes at most ``(retries + 1) × len(hosts) × timeout`` plus the backoffs (47 s with
the defaults and one host). A migration request is never sent twice unless the first surely did
not reach the server; when it may have (no answer in time, the connection broke after sending, a
stop request, a proxy's 502 or 504), the :class:`~opendrs.backends.base.BackendError` says
``uncertain``. While a call
waits (for its answer, or between tries), ``should_stop()`` is asked every 0.2 s; once it is true
the call is given up on and no new one is sent.

Reads made together (:func:`gather`) end together: once one fails for good, those under way are
given up on and those not started dropped.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Final, TypeVar

from opendrs.backends.base import (
    GATEWAY_STATUS,
    Abandoned,
    BackendError,
    HttpError,
    after_tries,
    stop_reason,
)
from opendrs.backends.proxmox.config import ProxmoxConfig, host_text, parse_host
from opendrs.backends.proxmox.transport import close_api, connect
from opendrs.backends.proxmox.values import clip
from opendrs.backends.tries import Expired, Tries, pause

log = logging.getLogger(__name__)

#: Calls made at once by :func:`gather` (per-node and per-guest reads).
_WORKERS: Final = 4
#: Longest wait between two tries of a call, in seconds.
_BACKOFF_MAX: Final = 30.0
#: HTTP statuses worth asking again (a read only): the server or a proxy had a passing problem.
_RETRY_STATUS: Final = frozenset({500, 502, 503, 504, 599})
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\"()\]]+)")
_SSL_REASON = re.compile(r"certificate verify failed: ([^'\"()\]]+)")
#: Server errors that asking again will not mend.
_PERMANENT = (
    "does not exist",
    "no such cluster node",
    "no such task",
    "unable to parse worker upid",
    "not implemented",
    "is local node",
    "can't migrate",
    "not defined",
    "rrd error",
)

T = TypeVar("T")


#: Per thread: the abort flag of the reads :func:`gather` runs together.
_local = threading.local()


class Client:
    """Calls the Proxmox API through proxmoxer, one session per API host."""

    def __init__(
        self,
        config: ProxmoxConfig,
        secret: str,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self._config = config
        self._secret = secret
        #: The secrets it had before :meth:`renew`, still scrubbed from errors.
        self._old_secrets: list[str] = []
        self._should_stop = should_stop
        self._hosts = [p for p in (parse_host(h) for h in config.hosts) if p is not None]
        if not self._hosts:
            raise BackendError("no usable API host in the configuration", transient=False)
        self._apis: dict[int, Any] = {}
        self._current = 0
        self._lock = threading.Lock()
        self._tries = Tries("Proxmox API", "opendrs-pve-call", self._stop_reason)
        #: Waits between rounds of tries; returns early when opendrs is stopping (replaceable
        #: in tests).
        self.sleep: Callable[[float], None] = self._pause

    def renew(self, secret: str) -> None:
        """Log in with ``secret`` from the next call on (the sessions with the old one closed);
        both stay scrubbed from every error."""
        if secret == self._secret:
            return
        self._old_secrets.append(self._secret)
        self._secret = secret
        with self._lock:
            apis, self._apis = list(self._apis.values()), {}
        for api in apis:
            close_api(api)

    def host_text(self, index: int) -> str:
        return host_text(*self._hosts[index])

    def scrub(self, text: str) -> str:
        """``text`` without the secret (nor one it had before), whatever put it there."""
        for secret in (self._secret, *self._old_secrets):
            if secret:
                text = text.replace(secret, "***")
        return text

    @contextlib.contextmanager
    def only_backend_errors(self, what: str) -> Iterator[None]:
        """Nothing but :class:`BackendError` may escape a backend method: anything else becomes
        one, ``what`` first, without the secret."""
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(self.scrub(f"{what}: {type(exc).__name__}: {exc}")) from None

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params)

    def post(self, path: str, **data: Any) -> Any:
        return self._call("POST", path, data)

    def delete(self, path: str, **params: Any) -> Any:
        return self._call("DELETE", path, params)

    def close(self) -> None:
        """End the calls still running (:meth:`Tries.close`, a few seconds at most), then close
        every session."""
        self._tries.close()
        with self._lock:
            apis, self._apis = list(self._apis.values()), {}
        for api in apis:
            close_api(api)

    def _api(self, index: int) -> Any:
        with self._lock:
            api = self._apis.get(index)
        if api is not None:
            return api
        # Outside the lock: a password login takes a request.
        api = connect(self._config, *self._hosts[index], self._secret)
        with self._lock:
            existing = self._apis.setdefault(index, api)
        if existing is not api:
            close_api(api)
        return existing

    def _forget(self, index: int) -> None:
        with self._lock:
            api = self._apis.pop(index, None)
        if api is not None:
            close_api(api)

    def _stop_reason(self) -> str | None:
        """Why calls must end now, if they must: :func:`stop_reason`, or another read failed."""
        reason = stop_reason(self._should_stop)
        if reason is not None:
            return reason
        abort: threading.Event | None = getattr(_local, "abort", None)
        if abort is not None and abort.is_set():
            return "another read of the observation failed"
        return None

    def _pause(self, seconds: float) -> None:
        """Sleep, in slices: a stop request ends the wait (and the next try is not sent)."""
        pause(seconds, lambda: self._stop_reason() is not None)

    def _call(self, method: str, path: str, params: dict[str, Any]) -> Any:
        """One API call: each host in turn, then again after a backoff, ``retries`` more times.

        Every try has a deadline of ``timeout``. A read (or a ``DELETE``, which stops a task) is
        tried again after a timeout, a lost connection or a passing server error; a ``POST`` only
        when it surely did not reach the server (connection refused), else the error says
        ``uncertain``. A stop request ends the call at once.
        """
        config = self._config
        what = f"{method} /{path}"
        last: BackendError | None = None
        for attempt in range(config.retries + 1):
            if attempt:
                if last is not None and not last.transient:
                    break
                delay = min(config.backoff * 2 ** (attempt - 1), _BACKOFF_MAX)
                log.debug("%s: try %d of %d in %.2fs", what, attempt + 1, config.retries + 1, delay)
                self.sleep(delay)
            start = self._current
            for index in [(start + k) % len(self._hosts) for k in range(len(self._hosts))]:
                result, error = self._call_host(index, method, path, params, what)
                if error is None:
                    return result
                last = error
        assert last is not None
        raise after_tries(last, config.retries)

    def _call_host(
        self, index: int, method: str, path: str, params: dict[str, Any], what: str
    ) -> tuple[Any, BackendError | None]:
        """One try on one host: ``(answer, None)``, or ``(None, error)`` when the next host (or
        round) may be tried; an error that ends the call is raised."""
        import requests
        from proxmoxer import AuthenticationError, ResourceException

        where = self.host_text(index)
        repeatable = method != "POST"
        try:
            result = self._try(index, method, path, params, what)
        except Abandoned:
            raise
        except Expired as error:
            if not repeatable:
                raise
            self._note(error)
            return None, error
        except ResourceException as exc:
            error = self._http_error(exc, what, where, changes=not repeatable)
            if not repeatable or exc.status_code not in _RETRY_STATUS or not error.transient:
                raise error from None
            log.debug("%s", error)
            return None, error
        except AuthenticationError as exc:
            return None, self._login_error(exc, index, what, where)
        except requests.exceptions.RequestException as exc:
            if _is_tls(exc):
                self._forget(index)
            error, sent = self._network_error(exc, what, where)
            if sent and not repeatable:
                raise BackendError(
                    error.reason, transient=error.transient, uncertain=True
                ) from None
            self._note(error)
            return None, error
        except (ValueError, TypeError, KeyError) as exc:
            # A malformed answer (not JSON, not the expected shape) from proxmoxer.
            raise BackendError(
                self.scrub(f"{what} on {where}: unexpected answer ({type(exc).__name__})")
            ) from None
        if index != self._current:
            log.info("using the Proxmox API on %s", where)
            self._current = index
        if isinstance(result, dict) and set(result) == {"errors"}:
            raise BackendError(f"{what} on {where}: the answer is not JSON")
        return result, None

    def _try(self, index: int, method: str, path: str, params: dict[str, Any], what: str) -> Any:
        """One request to one host, given up on at the deadline or when opendrs is stopping."""

        def work() -> Any:
            resource = self._api(index)(path)
            call = {"GET": resource.get, "POST": resource.post, "DELETE": resource.delete}
            return call[method](**params)

        # A request that changes the cluster may have arrived and taken effect.
        return self._tries.run(
            work,
            what=f"{what} on {self.host_text(index)}",
            seconds=self._config.timeout,
            uncertain=method == "POST",
        )

    def _note(self, error: BackendError) -> None:
        if len(self._hosts) > 1:
            log.warning("%s; trying the next API host", error)
        else:
            log.debug("%s", error)

    def _login_error(self, exc: Exception, index: int, what: str, where: str) -> BackendError:
        """A password login that failed: raised when the password is wrong, else the error that
        lets the next host be tried."""
        self._forget(index)
        code = re.search(r"code: (\d+)", str(exc))
        status = int(code.group(1)) if code else 401
        if status in (401, 403):
            raise BackendError(
                f"authentication failed at {where} for {self._config.auth_id}: check the password",
                transient=False,
            ) from None
        # The login itself did not get through (a server or proxy error).
        error = BackendError(f"{what} on {where}: login failed: HTTP {status}")
        log.debug("%s", error)
        return error

    def _http_error(self, exc: Any, what: str, where: str, *, changes: bool) -> HttpError:
        """The error of an answer ``exc``; a proxy's 502 or 504 to a request that ``changes`` the
        cluster is uncertain (the request may have reached the API behind it)."""
        status = int(exc.status_code)
        message = str(exc.content or exc.status_message or "").strip()
        errors = exc.errors
        if isinstance(errors, dict) and isinstance(errors.get("errors"), bytes):
            errors = None  # an answer that is not JSON (a proxy's page): its status says it all
        if isinstance(errors, dict) and errors:
            detail = "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()))
            message = f"{message} ({detail})" if message else detail
        message = self.scrub(clip(message or "no reason given", 240))
        if status == 401:
            hint = "the API token" if self._config.token_name else "the password"
            return HttpError(
                f"authentication failed at {where} for {self._config.auth_id}: check {hint} "
                f"({status} {message})",
                status,
                message,
                transient=False,
            )
        if status == 403:
            return HttpError(
                f"{what} on {where}: permission denied for {self._config.auth_id}: {message}",
                status,
                message,
                transient=False,
            )
        transient = status >= 500 and not _permanent(message)
        return HttpError(
            f"{what} on {where}: HTTP {status}: {message}",
            status,
            message,
            transient=transient,
            uncertain=changes and status in GATEWAY_STATUS,
        )

    def _network_error(self, exc: Exception, what: str, where: str) -> tuple[BackendError, bool]:
        """The error and whether the request may have reached the server."""
        import requests

        text = str(exc)
        timeout = self._config.timeout
        if _is_tls(exc):
            found = _SSL_REASON.search(text)
            reason = found.group(1).strip() if found else "handshake failed"
            hint = " (set ca_file to the cluster's CA)" if self._config.verify_tls else ""
            error = BackendError(
                self.scrub(f"{what} on {where}: TLS verification failed: {reason}{hint}"),
                transient=False,
            )
            return error, False
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return BackendError(
                f"{what} on {where}: no connection within {timeout:g}s", transient=True
            ), False
        if isinstance(exc, requests.exceptions.Timeout):
            return BackendError(
                f"{what} on {where}: no answer within {timeout:g}s", transient=True
            ), True
        if isinstance(exc, requests.exceptions.ConnectionError):
            found = _ERRNO.search(text)
            reason = found.group(1).strip().lower() if found else "connection lost"
            sent = "NewConnectionError" not in text and "NameResolutionError" not in text
            if not sent:
                return BackendError(
                    self.scrub(f"{what} on {where}: cannot connect: {reason}"), transient=True
                ), False
            if "BadStatusLine" in text or "InvalidHeader" in text:
                reason = "the answer is not HTTP"
            return BackendError(
                self.scrub(f"{what} on {where}: no answer: {reason}"), transient=True
            ), True
        return BackendError(
            self.scrub(f"{what} on {where}: request failed ({type(exc).__name__})"),
            transient=True,
        ), True


def gather(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run the reads ``jobs`` a few at a time; the first error is raised.

    Once a read failed, the reads not started are dropped and those under way given up on
    (their calls end within a fraction of a second): a failing API ends an observation after
    one call's worst case, not one per guest.
    """
    if len(jobs) <= 1:
        return [job() for job in jobs]
    abort = threading.Event()

    def run(job: Callable[[], T]) -> T:
        _local.abort = abort
        try:
            return job()
        finally:
            _local.abort = None

    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="opendrs-pve") as pool:
        futures = [pool.submit(run, job) for job in jobs]
        wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            abort.set()
            for future in futures:
                future.cancel()
    errors = [f.exception() for f in futures if not f.cancelled()]
    failures = [e for e in errors if e is not None]
    if failures:
        # The read that failed first in the list, rather than one given up on because of it.
        raise next((e for e in failures if not isinstance(e, Abandoned)), failures[0])
    return [f.result() for f in futures]


def _is_tls(exc: Exception) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.SSLError)


def _permanent(message: str) -> bool:
    lowered = message.lower()
    return any(p in lowered for p in _PERMANENT)
