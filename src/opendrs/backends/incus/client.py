"""Calls to the Incus (or LXD) REST API over httpx: the unix socket or HTTPS addresses in turn,
bounded retries of reads, operations followed, errors as one-line
:class:`~opendrs.backends.base.BackendError` s.

Every answer of the API is an envelope (``type`` sync, async or error); :meth:`Client.get`
returns a sync answer's ``metadata``, :meth:`Client.send` a :class:`Reply` that also names the
operation of an async answer, which :meth:`Client.wait` follows
(``GET /1.0/operations/ID/wait?timeout=S``).

Deadlines: each try of a call — one request to one address: connecting, TLS, sending, the whole
answer — ends within ``timeout`` (``timeout`` plus the wait asked for, for
``…/operations/ID/wait``), whatever the server does: a server that sends one byte every few
seconds does not hold it longer. The try runs on a thread of its own, which the caller stops
waiting for; its sockets are then shut down, so the thread ends too
(:mod:`opendrs.backends.tries`, which the Proxmox backend uses as well). A read is tried again
after a timeout, a lost connection or a passing server error (500, 502, 503, 504), on each
address in turn, ``retries`` more times with exponential backoff (``backoff`` doubled each time,
at most 30 s), so one read takes at most ``(retries + 1) × addresses × timeout`` plus the
backoffs. A request that changes the cluster (``POST``, ``PUT``, ``PATCH``, ``DELETE``) is sent
again only when it surely did not reach the server (the connection was never made); otherwise
(a proxy's 502 or 504 too) its error says ``uncertain``. While a call waits (for its answer, or
between tries), ``should_stop()`` is asked every 0.2 s: once true the call is given up on at once
and no new one is sent.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpcore
import httpx

from opendrs.backends.base import (
    GATEWAY_STATUS,
    Abandoned,
    BackendError,
    HttpError,
    after_tries,
    stop_reason,
)
from opendrs.backends.incus.config import IncusConfig
from opendrs.backends.incus.values import clip
from opendrs.backends.tries import Expired, Tries, handle_of, pause, track

log = logging.getLogger(__name__)

_BACKOFF_MAX: Final = 30.0
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
        self._tries = Tries("Incus API", "opendrs-incus-call", self._stop_reason)
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
        """End the calls still running (:meth:`Tries.close`, a few seconds at most), then close
        every connection pool."""
        self._tries.close()
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
        client = self._client(index)

        def work() -> httpx.Response:
            return client.request(
                method,
                path,
                params={k: _param(v) for k, v in params.items()},
                json=body,
                timeout=httpx.Timeout(timeout, read=timeout + extra),
            )

        try:
            response = self._tries.run(
                work, what=f"{what} at {where}", seconds=timeout + extra, uncertain=changes
            )
        except Abandoned:
            raise
        except Expired as error:
            if changes:
                raise
            return None, error
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
            error = _api_error(what, where, status, message, changes=changes)
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

    def _stop_reason(self) -> str | None:
        """Why calls must end now, if they must (:func:`stop_reason`)."""
        return stop_reason(self._should_stop)

    def _pause(self, seconds: float) -> None:
        pause(seconds, self._should_stop)


def _make_client(config: IncusConfig, endpoint: str) -> httpx.Client:
    """An httpx client for one endpoint: the unix socket, or HTTPS with the client certificate;
    its connections tell the try under way their socket (so a try given up on ends)."""
    if endpoint.startswith("unix:"):
        uds: str | None = endpoint.removeprefix("unix:")
        context, base_url = None, "http://incus"
    else:
        uds, context, base_url = None, tls_context(config), endpoint
    transport = httpx.HTTPTransport(uds=uds, trust_env=False)
    # The transport's own pool, made again on the tracked network backend (httpx passes no
    # network backend through; without a proxy its pool is this one).
    limits = httpx.Limits()  # httpx's defaults
    transport._pool = httpcore.ConnectionPool(
        ssl_context=context,
        uds=uds,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=_TrackedBackend(),
    )
    return httpx.Client(transport=transport, base_url=base_url, trust_env=False)


class _TrackedStream(httpcore.NetworkStream):
    """A connection that tells the try under way its socket before each read and write."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self._handle = handle_of(stream.get_extra_info("socket"))
        track(self._handle)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        track(self._handle)  # a kept-alive connection, used by another try
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        track(self._handle)
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        # The TLS socket wraps the same connection: the handle still reaches it.
        self._stream = self._stream.start_tls(ssl_context, server_hostname, timeout)
        return self

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _TrackedBackend(httpcore.NetworkBackend):
    """httpcore's own network backend, its connections tracked."""

    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _TrackedStream(
            self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _TrackedStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


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


def _api_error(what: str, where: str, status: int, message: str, *, changes: bool) -> HttpError:
    """The error of an answer; a proxy's 502 or 504 to a request that ``changes`` the cluster is
    uncertain (the request may have reached the server behind it)."""
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
        f"{what} at {where}: HTTP {status}: {message}",
        status,
        message,
        transient=transient,
        uncertain=changes and status in GATEWAY_STATUS,
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
