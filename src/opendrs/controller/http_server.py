"""The dashboard (``/``, ``/api/state``, ``/api/panel``), ``/metrics`` and ``/healthz`` of
``opendrs run`` (and ``opendrs demo``), served from a background thread.

Read-only: GET and HEAD are answered, every other method is refused (405); nothing served changes
anything. The one POST, ``/api/place`` (:mod:`opendrs.controller.place_api`), changes nothing
either: it asks where a new guest should start, and is answered from the last observation. It
needs ``http.token_file`` (403 without one), ``Content-Type: application/json`` and, from a
browser, an ``Origin`` that is the server's own; its errors are JSON (``{"error": …}``). With a
bearer token (``http.token_file``) every path asks for ``Authorization: Bearer TOKEN`` (401
otherwise; ``/`` answers its 401 with the page's frame, no data, whose field takes the token for
the browser tab); the token is compared in constant time and never logged. Requests are
logged at DEBUG only. The dashboard's answers come from the snapshot the daemon publishes once
per cycle (:class:`opendrs.controller.dashboard.Dashboard`): a request never reaches the backend.

The one exception, off unless ``http.write`` is on (it needs the token): the POST paths of
:mod:`opendrs.controller.http_write` — approve or reject a proposal, balance now — taken with the
bearer token only, from the page's own origin (an ``Origin`` header naming another: 403), and
``GET /api/proposals``; every other path stays read-only (:func:`write_request`).

Bounded, so that clients cannot starve the daemon of files or threads: at most
:data:`MAX_CONNECTIONS` connections are held at once — a new one beyond closes the connection
that has waited longest for its request (or is refused when every one is being answered) — and a
connection that has not sent its whole request (line and headers) within
:data:`REQUEST_TIMEOUT` seconds of opening is closed, however slowly it sends. The token is in
the headers, so it is checked once they are read: an unauthenticated client holds a connection
no longer than that.

Stopped in order (:meth:`MetricsServer.stop`): no new connection is taken, those still sending
their request are closed, the requests read are answered for up to :data:`STOP_GRACE` seconds,
then their connections are cut — a thread reading or writing ends at once — and one line says
which requests were cut (by route: ``POST /api/place``; a path the server does not serve is
``another request``, never repeated). A write of the dashboard's under way then (an approval,
balance now) is waited for, :data:`WRITE_WAIT` seconds at most (then it counts as computing,
below), and none begins after (:meth:`DashboardWriter.stop
<opendrs.controller.http_write.DashboardWriter.stop>`). A thread still computing its answer then
(a placement, a page) cannot be ended: ``stop`` returns after :data:`CUT_WAIT` seconds all the
same, and :meth:`MetricsServer.computing` says how many are left, for the process to exit
without waiting for them (:func:`opendrs.cli.process.exit_now`). Nothing of the server may run while
the interpreter finalises: a request drawing a chart then would have it abort (matplotlib's C++
code, a thread ended under it), hence threads that are not daemon threads and, when some are
left, an exit that skips finalisation.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from opendrs.controller.config import HttpConfig
from opendrs.controller.dashboard import Dashboard, dashboard_headers
from opendrs.controller.history import BUSY_TIMEOUT
from opendrs.controller.http_write import MAX_BODY as MAX_WRITE
from opendrs.controller.http_write import DashboardWriter, is_write_path
from opendrs.controller.metrics import DaemonMetrics
from opendrs.controller.place_api import MAX_BODY, PlaceView, json_error
from opendrs.secret_file import SecretError, read_secret_file

__all__ = [
    "CUT_WAIT",
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "STOP_GRACE",
    "HttpError",
    "MetricsServer",
    "start_server",
]

log = logging.getLogger(__name__)

#: The dashboard's paths: the page, its JSON, the part of the page its script swaps in.
_DASHBOARD = frozenset({"/", "/api/state", "/api/panel"})
#: Where a provisioning tool asks where a new guest should start (POST only).
_PLACE = "/api/place"


#: Connections held at once (each is a file and a thread of the daemon's).
MAX_CONNECTIONS: Final = 64
#: Seconds a connection may take, from its opening, to send its request line and headers.
REQUEST_TIMEOUT: Final = 10.0
#: Seconds the requests read when the server stops have to be answered before they are cut.
STOP_GRACE: Final = 5.0
#: Seconds the threads of the requests cut are waited for (one in a read or write ends at once).
CUT_WAIT: Final = 0.5
#: Seconds a write of the dashboard's under way once the requests are cut is waited for: a
#: statement waiting out the history's busy timeout, and the time to end.
WRITE_WAIT: Final = BUSY_TIMEOUT + CUT_WAIT
#: The requests a stop's line names, at most (then how many more).
_NAMED_CUT: Final = 5


class _Server(ThreadingHTTPServer):
    #: Each request on a thread the interpreter would wait for at exit (stop ends them in order;
    #: one still computing after the cut is left to :func:`~opendrs.cli.process.exit_now`).
    daemon_threads = False
    #: Connections the kernel queues while the server accepts: a burst is accepted, then bounded.
    request_queue_size = 128
    metrics: DaemonMetrics
    dashboard: Dashboard | None
    place: PlaceView | None
    token: bytes | None
    writer: DashboardWriter | None = None

    def server_activate(self) -> None:
        self._lock = threading.Lock()
        #: The connections held, and of those still sending their request, since when.
        self._held: set[socket.socket] = set()
        self._waiting: dict[socket.socket, float] = {}
        #: The threads answering a connection, ended or not (those ended are let go), and what
        #: each was asked once its request line is read (``POST /api/place``).
        self._answering: list[threading.Thread] = []
        self._asked: dict[threading.Thread, str] = {}
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._held) >= MAX_CONNECTIONS:
                if not self._waiting:  # every connection is being answered: refuse this one
                    log.debug("http %s: refused: %d connections", client_address, len(self._held))
                    _shut(request)
                    request.close()
                    return
                oldest = min(self._waiting, key=self._waiting.__getitem__)
                del self._waiting[oldest]
                _shut(oldest)  # its thread sees the end of the stream and lets go
            self._held.add(request)
            self._waiting[request] = time.monotonic()
            thread = threading.Thread(
                target=self.process_request_thread,
                args=(request, client_address),
                name="opendrs-http-request",
                daemon=self.daemon_threads,
            )
            self._answering = [t for t in self._answering if t.is_alive()]
            self._asked = {t: a for t, a in self._asked.items() if t.is_alive()}
            thread.start()  # kept only once started: the stop joins every thread it keeps
            self._answering.append(thread)

    def answering(self, request: socket.socket, asked: str) -> None:
        """The request of this connection (``asked``: its method and path) was read: it is
        answered, no longer waited for."""
        with self._lock:
            self._waiting.pop(request, None)
            self._asked[threading.current_thread()] = asked

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._held.discard(request)
            self._waiting.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed: a broken connection (the client left, or :meth:`close_in_order`
        cut it) is one DEBUG line; another error is logged with its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("http %s: connection ended: %s", client_address[0], error)
        else:
            log.exception("http %s: the request failed", client_address[0])

    def service_actions(self) -> None:
        """Between two accepts (every 0.5 s at most): close the connections whose request has
        not come within :data:`REQUEST_TIMEOUT`."""
        late = time.monotonic() - REQUEST_TIMEOUT
        with self._lock:
            expired = [r for r, since in self._waiting.items() if since <= late]
            for request in expired:
                del self._waiting[request]
        for request in expired:
            _shut(request)

    def close_in_order(self, grace: float) -> tuple[list[str], list[threading.Thread]]:
        """After the accept loop has ended: stop listening, close the connections still sending
        their request, give those being answered ``grace`` seconds, then cut them and wait
        :data:`CUT_WAIT` seconds more; return what the requests cut asked, and the threads
        still running then (each computing an answer it can no longer send)."""
        self.socket.close()
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            threads = list(self._answering)
        for request in waiting:
            _shut(request)
        _join(threads, time.monotonic() + grace)
        late = [thread for thread in threads if thread.is_alive()]
        with self._lock:
            held = list(self._held)
            asked = [self._asked.get(thread, "a request") for thread in late]
        for request in held:
            _shut(request)  # a read or write under way fails at once: the thread ends
        _join(late, time.monotonic() + CUT_WAIT)
        return asked, [thread for thread in late if thread.is_alive()]


#: The methods a log line may name.
_METHODS: Final = frozenset({"GET", "HEAD", "POST"})


def _route(method: str, path: str) -> str:
    """A request as a log line may name it (``POST /api/place``): one of the server's paths
    with a method it takes, else ``another request`` — what a client sent is never repeated."""
    known = path in _DASHBOARD or path in (_PLACE, "/metrics", "/healthz") or is_write_path(path)
    return f"{method} {path}" if method in _METHODS and known else "another request"


def _join(threads: list[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _shut(request: socket.socket) -> None:
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    #: Each read or write of the connection (beside the whole request's deadline).
    timeout = REQUEST_TIMEOUT

    def version_string(self) -> str:
        return "opendrs"

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        asked = _route(self.command, self.path.partition("?")[0]) if parsed else "a bad request"
        self.server.answering(self.connection, asked)
        return parsed

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_POST(self) -> None:
        path = self.path.partition("?")[0]
        if path == _PLACE and self.server.place is not None:
            self._place(self.server.place)
        elif self.server.writer is not None and self.server.writer.handles(path):
            write_request(self, self.server.writer)
        else:  # every other path stays read-only, with or without http.write
            self._not_allowed()

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Every other method (``do_PUT``, ``do_DELETE``…): 405, nothing changes."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED, b"read-only: GET or HEAD\n", {"Allow": "GET, HEAD"}
        )

    def _answer(self, *, body: bool) -> None:
        path, _, query = self.path.partition("?")
        dashboard = self.server.dashboard
        if not self._authorized():
            headers = {"WWW-Authenticate": 'Bearer realm="opendrs"'}
            if path == "/" and dashboard is not None:
                # The page's frame alone (no data): its field takes the token for the tab.
                headers |= {**dict(dashboard_headers()), "Content-Type": "text/html; charset=utf-8"}
                text = dashboard.sign_in().encode()
                self._send(HTTPStatus.UNAUTHORIZED, text, headers, body=body)
                return
            self._send(HTTPStatus.UNAUTHORIZED, b"a bearer token is needed\n", headers, body=body)
            return
        if path == _PLACE and self.server.place is not None:
            status, text = json_error(HTTPStatus.METHOD_NOT_ALLOWED, f"{_PLACE} takes POST")
            self._send(status, text, {"Allow": "POST", **_JSON}, body=body)
        elif dashboard is not None and path in _DASHBOARD:
            self._dashboard(dashboard, path, query, body=body)
        elif path == "/api/proposals" and self.server.writer is not None:
            send_json(self, *self.server.writer.open_proposals(), body=body)
        elif path == "/metrics":
            text = generate_latest(self.server.metrics.registry)
            self._send(HTTPStatus.OK, text, {"Content-Type": CONTENT_TYPE_LATEST}, body=body)
        elif path == "/healthz":
            problem = self.server.metrics.health()
            if problem is None:
                self._send(HTTPStatus.OK, b"ok\n", body=body)
            else:
                reason = " ".join(problem.split()) + "\n"
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, reason.encode(), body=body)
        else:
            known = "/, /api/state, /api/panel, " if dashboard is not None else ""
            reason = f"not found: {known}/metrics or /healthz\n".encode()
            self._send(HTTPStatus.NOT_FOUND, reason, body=body)

    def _dashboard(self, dashboard: Dashboard, path: str, query: str, *, body: bool) -> None:
        try:
            status, text, headers = _dashboard_part(dashboard, path, query)
        except Exception:  # a bug drawing the page must not reach the daemon: 500, logged
            log.exception("http %s: cannot answer %s", self.address_string(), path)
            status, text = HTTPStatus.INTERNAL_SERVER_ERROR, b"cannot draw the page: see the log\n"
            headers = {}
        # Sent once drawn: a connection that breaks meanwhile is no bug of the page's.
        self._send(status, text, headers, body=body and status != HTTPStatus.NO_CONTENT)

    def _place(self, place: PlaceView) -> None:
        """``POST /api/place``: token, origin, type and size of the request checked, then
        answered from ``place``; every answer is JSON."""
        refused = self._place_refused()
        if refused is not None:
            status, reason, headers = refused
            self._send(*json_error(status, reason), {**headers, **_JSON})
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", "")))
        try:
            answer = place.answer(body)
        except Exception:  # a bug placing the guest must not reach the daemon: 500, logged
            log.exception("http %s: cannot answer %s", self.address_string(), _PLACE)
            answer = json_error(HTTPStatus.INTERNAL_SERVER_ERROR, "cannot place: see the log")
        self._send(*answer, _JSON)

    def _place_refused(self) -> tuple[HTTPStatus, str, dict[str, str]] | None:
        """Why ``POST /api/place`` is refused before its body is read (status, reason, headers),
        or None."""
        if self.server.token is None:
            return HTTPStatus.FORBIDDEN, f"{_PLACE} needs http.token_file", {}
        if not self._authorized():
            headers = {"WWW-Authenticate": 'Bearer realm="opendrs"'}
            return HTTPStatus.UNAUTHORIZED, "a bearer token is needed", headers
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{self.headers.get('Host', '')}":
            return HTTPStatus.FORBIDDEN, f"origin {origin} is not this server's", {}
        kind = self.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "expected Content-Type: application/json", {}
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return HTTPStatus.LENGTH_REQUIRED, "expected a Content-Length", {}
        if int(length) > MAX_BODY:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"at most {MAX_BODY} bytes", {}
        return None

    def _authorized(self) -> bool:
        token = self.server.token
        if token is None:
            return True
        scheme, _, given = self.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def _send(
        self,
        status: HTTPStatus,
        content: bytes,
        headers: dict[str, str] | None = None,
        *,
        body: bool = True,
    ) -> None:
        self.send_response(status)
        fields = {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}
        for name, value in fields.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if body:
            self.wfile.write(content)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s: " + format, self.address_string(), *args)


_JSON: Final = {"Content-Type": "application/json"}


def _dashboard_part(
    dashboard: Dashboard, path: str, query: str
) -> tuple[HTTPStatus, bytes, dict[str, str]]:
    """The status, body and headers of the dashboard's ``path`` (one of :data:`_DASHBOARD`)."""
    headers = dict(dashboard_headers())
    if path == "/api/state":
        headers["Content-Type"] = "application/json"
        text = dashboard.state_json()
    elif path == "/api/panel":
        after = parse_qs(query).get("after", [""])[0]
        if after == str(dashboard.snapshot().version):
            return HTTPStatus.NO_CONTENT, b"", headers
        headers["Content-Type"] = "text/html; charset=utf-8"
        text = dashboard.panel()
    else:
        headers["Content-Type"] = "text/html; charset=utf-8"
        text = dashboard.page()
    return HTTPStatus.OK, text.encode(), headers


class MetricsServer:
    """The HTTP server on ``config``'s address, in a thread of its own until :meth:`stop`."""

    def __init__(
        self,
        config: HttpConfig,
        metrics: DaemonMetrics,
        token: str | None,
        dashboard: Dashboard | None = None,
        place: PlaceView | None = None,
        writer: DashboardWriter | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        server_class = type("_Server", (_Server,), {"address_family": family})
        self.config = config
        #: Raises OSError when the address cannot be bound.
        self.server: _Server = server_class((config.host, config.port), _Handler)
        self.server.metrics = metrics
        self.server.dashboard = dashboard
        self.server.place = place
        self.server.token = token.encode() if token is not None else None
        self.server.writer = writer
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="opendrs-http", daemon=True
        )
        self._computing: list[threading.Thread] = []

    @property
    def address(self) -> str:
        """``HOST:PORT`` bound (the port chosen when the configuration says 0)."""
        port = self.server.server_address[1]
        host = self.config.host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop serving (see the module's text): when this returns the address is free, and no
        thread of the server is left but those :meth:`computing` counts."""
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join()
        cut, self._computing = self.server.close_in_order(grace)
        if self.server.writer is not None:
            self._stop_writer(self.server.writer)
        if cut:
            log.warning(
                "http: %d request(s) not answered within %gs of stopping: cut (%s)%s",
                len(cut),
                grace,
                _named(cut),
                f"; {len(self._computing)} still computing, not waited for"
                if self._computing
                else "",
            )
        self.server.server_close()

    def _stop_writer(self, writer: DashboardWriter) -> None:
        """Refuse the dashboard's writes and wait for those under way, :data:`WRITE_WAIT`
        seconds at most: one not ended then is not waited for (one WARNING line), its thread
        counted among those :meth:`computing`."""
        under_way, left = writer.stop(WRITE_WAIT)
        if left:
            log.warning(
                "http: %d dashboard write(s) not ended within %gs of the cut: not waited for "
                "(a verdict given may lack its decision-log line)",
                left,
                WRITE_WAIT,
            )
        elif under_way:
            # The writes ended whole (no more begin): their threads end at once, their
            # connections cut.
            _join(self._computing, time.monotonic() + CUT_WAIT)
            self.computing()

    def computing(self) -> int:
        """How many threads of requests cut by :meth:`stop` still compute their answer."""
        self._computing = [thread for thread in self._computing if thread.is_alive()]
        return len(self._computing)


def _named(asked: list[str]) -> str:
    """The requests cut, as the stop's line names them: ``POST /api/place, GET / (2)``."""
    counts = {a: asked.count(a) for a in dict.fromkeys(asked)}
    named = [a if n == 1 else f"{a} ({n})" for a, n in counts.items()]
    more = len(named) - _NAMED_CUT
    return ", ".join(named[:_NAMED_CUT]) + (f" and {more} more" if more > 0 else "")


class HttpError(Exception):
    """The server cannot start; ``str()`` is one line. ``usage``: the configuration is at fault
    (the token file), else the address (in use, not this host's)."""

    def __init__(self, reason: str, *, usage: bool) -> None:
        super().__init__(reason)
        self.usage = usage


def start_server(
    config: HttpConfig,
    metrics: DaemonMetrics,
    dashboard: Dashboard | None = None,
    place: PlaceView | None = None,
    writer: DashboardWriter | None = None,
) -> MetricsServer:
    """Read the token, bind, serve in the background and log the address bound — at WARNING
    when it is not a loopback address."""
    token = None
    if config.token_file is not None:
        try:
            token = read_secret_file(config.token_file, header=True)
        except SecretError as exc:
            raise HttpError(f"http.token_file: {exc}", usage=True) from None
    try:
        server = MetricsServer(config, metrics, token, dashboard, place, writer)
    except OSError as exc:
        raise HttpError(f"cannot listen on {config.address}: {exc.strerror}", usage=False) from None
    server.start()
    pages = "the dashboard, " if dashboard is not None else ""
    what = f"serving {pages}/metrics and /healthz on http://{server.address}"
    if config.loopback:
        log.info("%s", what)
    else:
        log.warning(
            "%s (not a loopback address: other hosts may connect%s)",
            what,
            "" if token else " and no http.token_file is set",
        )
    return server


# -- the writes (http.write) ------------------------------------------------------------------


def send_json(
    handler: _Handler, status: HTTPStatus, data: dict[str, Any], *, body: bool = True
) -> None:
    text = (json.dumps(data, sort_keys=True) + "\n").encode()
    handler._send(status, text, {"Content-Type": "application/json"}, body=body)


def write_request(handler: _Handler, writer: DashboardWriter) -> None:
    """A POST to one of the writer's paths with ``http.write`` on: the bearer token (never a
    cookie), the page's own origin and a small body; then the writer's answer."""
    path = handler.path.partition("?")[0]
    if not handler._authorized():
        headers = {"WWW-Authenticate": 'Bearer realm="opendrs"'}
        handler._send(HTTPStatus.UNAUTHORIZED, b"a bearer token is needed\n", headers)
        return
    # Behind a TLS proxy the page's origin is https://HOST: its host is compared, not its scheme.
    origin = handler.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != handler.headers.get("Host", ""):
        send_json(handler, HTTPStatus.FORBIDDEN, {"error": f"a write from {origin}: refused"})
        return
    try:
        length = int(handler.headers.get("Content-Length", "0"))
    except ValueError:
        length = -1
    if not 0 <= length <= MAX_WRITE:
        send_json(handler, HTTPStatus.BAD_REQUEST, {"error": "a body of 0 to 4096 bytes"})
        return
    body = handler.rfile.read(length) if length else b""
    log.info("http %s: POST %s", handler.address_string(), path)
    send_json(handler, *writer.post(path, body))
