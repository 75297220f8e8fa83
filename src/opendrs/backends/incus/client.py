"""Calls to the Incus (or LXD) REST API over httpx: the unix socket or HTTPS addresses in turn,
bounded retries of reads, operations followed, errors as one-line
:class:`~opendrs.backends.base.BackendError` s.

Every answer of the API is an envelope (``type`` sync, async or error); :meth:`Client.get`
returns a sync answer's ``metadata``, :meth:`Client.send` a :class:`Reply` that also names the
operation of an async answer, which :meth:`Client.wait` follows
(``GET /1.0/operations/ID/wait?timeout=S``).

Timeouts: each phase of a try (connecting, sending, each read of the answer) ends within
``timeout``. A read is tried again after a timeout, a lost connection or a passing server error
(500, 502, 503, 504), on each address in turn, ``retries`` more times with exponential backoff
(``backoff`` doubled each time, at most 30 s). A request that changes the cluster (``POST``,
``PUT``, ``PATCH``, ``DELETE``) is sent again only when it surely did not reach the server (the
connection was never made); otherwise its error says ``uncertain``. Between tries and during the
backoff ``should_stop()`` is asked: once true the call is given up on.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from opendrs.backends.base import Abandoned, BackendError, HttpError, after_tries
from opendrs.backends.incus.config import IncusConfig
from opendrs.backends.incus.values import clip

log = logging.getLogger(__name__)

_BACKOFF_MAX: Final = 30.0
_STOP_POLL: Final = 0.2
#: HTTP statuses worth asking again (a read only): the server or a proxy had a passing problem.
_RETRY_STATUS: Final = frozenset({500, 502, 503, 504})
#: How Incus answers ``…/wait?timeout=N`` when the operation is still running after N seconds.
_DEADLINE: Final = "deadline exceeded"
#: Server errors that asking again will not mend. LXD 5.0 answers a request for a member that
#: is down with 500 "Missing event connection with target cluster member", after 10 s each time.
_PERMANENT: Final = (
    "not found",
    "not implemented",
    "not clustered",
    "forbidden",
    "missing event connection",
)
#: Methods whose requests change the cluster.
_CHANGES: Final = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a request that changes something: its metadata, and the operation's id
    when the server answered with one (an async answer)."""

    metadata: Any
    operation: str | None = None


class Client:
    """The Incus API through httpx, one connection pool per endpoint."""

    def __init__(
        self, config: IncusConfig, should_stop: Callable[[], bool] = lambda: False
    ) -> None:
        self._config = config
        self._should_stop = should_stop
        self._endpoints: list[str] = list(config.addresses) or [f"unix:{config.socket}"]
        self._clients: dict[int, httpx.Client] = {}
        self._current = 0
        self._lock = threading.Lock()
        #: Waits between rounds of tries (replaceable in tests).
        self.sleep: Callable[[float], None] = self._pause

    @property
    def endpoint(self) -> str:
        """The endpoint in use (the first that answered)."""
        return self._endpoints[self._current]

    def get(self, path: str, **params: Any) -> Any:
        """A read: the ``metadata`` of the sync answer."""
        return self._call("GET", path, params, None).metadata

    def send(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, **params: Any
    ) -> Reply:
        """A request that changes something (``POST``, ``PUT``, ``PATCH``, ``DELETE``)."""
        if method not in _CHANGES:
            raise ValueError(f"not a changing method: {method}")
        return self._call(method, path, params, body)

    def wait(self, operation: str, seconds: float) -> dict[str, Any]:
        """The operation after it ended or ``seconds`` passed (``…/wait?timeout=``), whichever
        is first: its ``status`` (Running, Success, Failure, Cancelled) and ``err``.

        ``seconds`` under one reads the operation as it is (``GET /1.0/operations/ID``): Incus
        answers a wait whose time runs out before the operation ends with an error (HTTP 500,
        ``context deadline exceeded``) where LXD answers with the operation; after such an
        error the operation is read as it is too.
        """
        path = f"/1.0/operations/{operation}"
        whole = max(0, int(seconds))
        if whole == 0:
            reply = self._call("GET", path, {}, None)
        else:
            try:
                reply = self._call("GET", f"{path}/wait", {"timeout": whole}, None, extra=whole)
            except HttpError as exc:
                if _DEADLINE not in exc.message.lower():
                    raise
                reply = self._call("GET", path, {}, None)
        if not isinstance(reply.metadata, dict):
            raise BackendError(f"operation {operation}: the API answered it with no operation")
        return reply.metadata

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- one call ------------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any],
        body: Mapping[str, Any] | None,
        *,
        extra: float = 0.0,
    ) -> Reply:
        """Each endpoint in turn, then again after a backoff, ``retries`` more times."""
        config = self._config
        what = f"{method} {path}"
        last: BackendError | None = None
        for attempt in range(config.retries + 1):
            if attempt:
                if last is not None and not last.transient:
                    break
                self.sleep(min(config.backoff * 2 ** (attempt - 1), _BACKOFF_MAX))
            count = len(self._endpoints)
            for index in [(self._current + k) % count for k in range(count)]:
                if self._should_stop():
                    raise Abandoned(f"{what}: not sent: opendrs is stopping")
                reply, error = self._try(index, method, path, params, body, what, extra)
                if error is None:
                    if index != self._current:
                        log.info("using the Incus API at %s", self._endpoints[index])
                        self._current = index
                    return reply  # type: ignore[return-value]
                last = error
                if count > 1 and error.transient:
                    log.warning("%s; trying the next address", error)
        assert last is not None
        raise after_tries(last, config.retries)

    def _try(
        self,
        index: int,
        method: str,
        path: str,
        params: Mapping[str, Any],
        body: Mapping[str, Any] | None,
        what: str,
        extra: float,
    ) -> tuple[Reply | None, BackendError | None]:
        """One request to one endpoint: ``(reply, None)``, or ``(None, error)`` when the next
        endpoint (or round) may be tried; an error that ends the call is raised."""
        where = self._endpoints[index]
        changes = method in _CHANGES
        timeout = self._config.timeout
        try:
            response = self._client(index).request(
                method,
                path,
                params={k: _param(v) for k, v in params.items()},
                json=body,
                timeout=httpx.Timeout(timeout, read=timeout + extra),
            )
        except httpx.ConnectError as exc:
            if _is_tls(exc):
                raise BackendError(
                    f"{what} at {where}: {_tls_reason(exc)}", transient=False
                ) from None
            return None, BackendError(f"{what} at {where}: cannot connect: {_reason(exc)}")
        except httpx.ConnectTimeout:
            return None, BackendError(f"{what} at {where}: no connection within {timeout:g}s")
        except httpx.TimeoutException:
            error = BackendError(
                f"{what} at {where}: no answer within {timeout + extra:g}s", uncertain=changes
            )
            if changes:
                raise error from None
            return None, error
        except httpx.HTTPError as exc:
            error = BackendError(f"{what} at {where}: no answer: {_reason(exc)}", uncertain=changes)
            if changes:
                raise error from None
            return None, error
        return self._answer(response, what, where, changes)

    def _answer(
        self, response: httpx.Response, what: str, where: str, changes: bool
    ) -> tuple[Reply | None, BackendError | None]:
        """The reply of an HTTP answer, or its error."""
        try:
            envelope = response.json()
        except ValueError:
            envelope = None
        if not isinstance(envelope, dict):
            if response.status_code >= 400:
                envelope = {"type": "error", "error": response.reason_phrase}
            else:
                raise BackendError(f"{what} at {where}: the answer is not JSON")
        if envelope.get("type") == "error" or response.status_code >= 400:
            status = int(envelope.get("error_code") or response.status_code)
            message = clip(str(envelope.get("error") or "no reason given"), 240)
            error = _api_error(what, where, status, message)
            if changes or status not in _RETRY_STATUS or not error.transient:
                raise error
            log.debug("%s", error)
            return None, error
        operation = None
        if envelope.get("type") == "async":
            operation = _operation_id(envelope)
        return Reply(envelope.get("metadata"), operation), None

    def _client(self, index: int) -> httpx.Client:
        with self._lock:
            client = self._clients.get(index)
            if client is None:
                client = self._clients[index] = _make_client(self._config, self._endpoints[index])
            return client

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._should_stop():
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, _STOP_POLL))


def _make_client(config: IncusConfig, endpoint: str) -> httpx.Client:
    """An httpx client for one endpoint: the unix socket, or HTTPS with the client certificate."""
    if endpoint.startswith("unix:"):
        transport = httpx.HTTPTransport(uds=endpoint.removeprefix("unix:"))
        return httpx.Client(transport=transport, base_url="http://incus", trust_env=False)
    return httpx.Client(base_url=endpoint, verify=tls_context(config), trust_env=False, http2=False)


def tls_context(config: IncusConfig) -> ssl.SSLContext:
    """The TLS context of the HTTPS addresses: the client certificate, and the server's
    certificate (pinned: the chain must end in it, the name is not checked, as Incus's own
    client does) or the system's CAs; no verification with ``verify: false``."""
    if not config.verify:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif config.server_cert is not None:
        context = ssl.create_default_context(cafile=config.server_cert)
        context.check_hostname = False
    else:
        context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.client_cert is not None and config.client_key is not None:
        try:
            context.load_cert_chain(config.client_cert, config.client_key)
        except (ssl.SSLError, OSError) as exc:
            raise BackendError(
                f"cannot use the client certificate {config.client_cert} with its key "
                f"{config.client_key}: {getattr(exc, 'reason', None) or type(exc).__name__}",
                transient=False,
            ) from None
    return context


def _api_error(what: str, where: str, status: int, message: str) -> HttpError:
    if status == 403:
        return HttpError(
            f"{what} at {where}: permission denied: {message} (is the client certificate "
            "trusted, and for this project?)",
            status,
            message,
            transient=False,
        )
    lowered = message.lower()
    transient = status >= 500 and not any(p in lowered for p in _PERMANENT)
    if what.endswith("/wait") and _DEADLINE in lowered:
        transient = False  # a wait that ran out of time (Incus): asking again only waits again
    return HttpError(
        f"{what} at {where}: HTTP {status}: {message}", status, message, transient=transient
    )


def _operation_id(envelope: Mapping[str, Any]) -> str | None:
    """The id of an async answer's operation (``/1.0/operations/ID``, or its metadata's id)."""
    text = envelope.get("operation")
    if isinstance(text, str) and text:
        return text.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    metadata = envelope.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("id"), str):
        return metadata["id"]
    return None


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_tls(exc: Exception) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "SSL" in str(exc) or "certificate" in str(exc).lower()


def _tls_reason(exc: Exception) -> str:
    text = str(exc)
    if "certificate verify failed" in text:
        detail = text.split("certificate verify failed:", 1)[-1].split("(")[0].strip()
        return f"TLS verification failed: {detail or 'untrusted certificate'} (set server_cert)"
    return f"TLS handshake failed: {clip(text, 160)}"


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    if "] " in text:
        text = text.split("] ", 1)[1]
    return clip(text or type(exc).__name__, 160).lower()
