"""Servers that misbehave on purpose, for testing clients' deadlines (loopback only).

:class:`HostileServer` listens on 127.0.0.1 (or ``::1``) on a port the system picks, optionally
over TLS, or on a unix socket (``unix``), and treats every connection the way its ``mode`` says:

* ``silent``: accept the connection and never read or send a byte (a TLS handshake never ends);
* ``hang``: read the request (after the TLS handshake), never answer;
* ``drip``: answer a valid HTTP response, one byte every ``interval`` seconds;
* ``garbage``: answer bytes that are not HTTP, then close;
* ``close``: read the request, then close the connection without a word.

Everything is bounded: at most ``max_connections`` connections are served at once (more are
closed at once), a connection is held at most ``max_seconds``, and :meth:`HostileServer.stop`
(or leaving the ``with`` block) closes every socket and joins every thread. A connection also
ends when the client closes it, which the server counts (:attr:`HostileServer.client_closed`):
a test can see that a client that gave up really let go of its socket.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import threading
import time
from typing import Final, Literal

__all__ = ["HostileServer", "Mode"]

Mode = Literal["silent", "hang", "drip", "garbage", "close"]
MODES: Final = ("silent", "hang", "drip", "garbage", "close")
#: The largest request read (headers and body).
_REQUEST_MAX: Final = 1 << 20


class HostileServer:
    """A TCP (or TLS) server on loopback that answers badly; a context manager."""

    def __init__(
        self,
        mode: Mode,
        *,
        tls: tuple[str, str] | None = None,
        interval: float = 3.0,
        body: object = None,
        max_seconds: float = 120.0,
        max_connections: int = 32,
        host: str = "127.0.0.1",
        unix: str | None = None,
    ) -> None:
        """``tls``: (certificate file, key file) to serve TLS with; ``interval``: seconds between
        two bytes in ``drip`` mode; ``body``: the JSON ``data`` a ``drip`` answer carries (a
        Proxmox-style ``{"data": …}``); ``unix``: a unix socket's path to listen on instead of
        a TCP port."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        if host not in ("127.0.0.1", "::1"):
            raise ValueError("hostile servers listen on loopback only")
        self.mode: Mode = mode
        self.interval = interval
        self.max_seconds = max_seconds
        self.max_connections = max_connections
        payload = json.dumps({"data": body}).encode()
        self.answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json;charset=UTF-8\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        self._context: ssl.SSLContext | None = None
        if tls is not None:
            self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._context.load_cert_chain(*tls)
        self.unix = unix
        if unix is not None:
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(unix)
            self.port: int = 0
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._listener = socket.socket(family, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, 0))
            self.port = self._listener.getsockname()[1]
        self._listener.listen(64)
        self.host = host
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        #: Connections accepted, and requests whose headers were read (method and path).
        self.connections = 0
        self.requests: list[tuple[str, str]] = []
        #: Set when the first request was read.
        self.seen = threading.Event()
        #: Connections the client closed while the server still held them.
        self.client_closed = 0
        self._acceptor = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)
        self._acceptor.start()

    @property
    def address(self) -> str:
        """``host:port`` (``[::1]:port``), as the Proxmox backend's ``hosts`` take it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def active(self) -> int:
        """Connections the server holds now."""
        with self._lock:
            return len(self._sockets)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.1)
                if not ready:
                    continue
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._stop.is_set() or len(self._sockets) >= self.max_connections:
                    conn.close()
                    continue
                self.connections += 1
                self._sockets.add(conn)
                thread = threading.Thread(
                    target=self._serve, args=(conn,), name="hostile-conn", daemon=True
                )
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        sock: socket.socket = conn
        ends = time.monotonic() + self.max_seconds
        try:
            if self.mode == "silent":
                self._hold(sock, ends)
                return
            if self._context is not None:
                conn.settimeout(max(0.1, min(10.0, ends - time.monotonic())))
                sock = self._context.wrap_socket(conn, server_side=True)
                with self._lock:
                    self._sockets.discard(conn)
                    self._sockets.add(sock)
            while not self._stop.is_set() and time.monotonic() < ends:
                if self.mode == "garbage":
                    self._read_request(sock, ends)
                    sock.sendall(b"\x00\xff\xfe not http at all \x07\r\n\r\n\x00")
                    return
                if not self._read_request(sock, ends):
                    return
                if self.mode == "close":
                    return
                if self.mode == "hang":
                    self._hold(sock, ends)
                    return
                for index in range(len(self.answer)):  # drip
                    if self._stop.wait(self.interval) or time.monotonic() >= ends:
                        return
                    sock.sendall(self.answer[index : index + 1])
        except OSError:  # the client went away, or TLS failed: the connection is over
            with self._lock:
                self.client_closed += 1
        finally:
            with self._lock:
                self._sockets.discard(sock)
                self._sockets.discard(conn)
            with contextlib.suppress(OSError):
                sock.close()

    def _read_request(self, sock: socket.socket, ends: float) -> bool:
        """Read one request (headers and a Content-Length body); False when the client closed."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self._recv(sock, ends)
            if not chunk:
                return False
            data += chunk
            if len(data) > _REQUEST_MAX:
                return False
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, _, target = lines[0].partition(" ")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                length = min(int(value.strip()), _REQUEST_MAX)
        while len(rest) < length:
            chunk = self._recv(sock, ends)
            if not chunk:
                break
            rest += chunk
        with self._lock:
            self.requests.append((method, target.partition(" ")[0]))
        self.seen.set()
        return True

    def _recv(self, sock: socket.socket, ends: float) -> bytes:
        """Some bytes, or b"" once the client closed, the server stops or time is up."""
        while not self._stop.is_set() and time.monotonic() < ends:
            pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
            if not pending:
                ready, _, _ = select.select([sock], [], [], 0.1)
                if not ready:
                    continue
            sock.settimeout(1.0)
            try:
                data = sock.recv(65536)
            except (ssl.SSLWantReadError, TimeoutError):
                continue
            if not data:
                with self._lock:
                    self.client_closed += 1
            return data
        return b""

    def _hold(self, sock: socket.socket, ends: float) -> None:
        """Keep the connection open without a word, until the client closes it (or the end)."""
        while not self._stop.is_set() and time.monotonic() < ends:
            ready, _, _ = select.select([sock], [], [], 0.1)
            if not ready:
                continue
            try:
                raw = socket.socket.recv(sock, 65536, socket.MSG_PEEK)
            except OSError:
                raw = b""
            if not raw:
                with self._lock:
                    self.client_closed += 1
                return
            # The client sent more (TLS records, a second request): drop it, keep silent.
            try:
                socket.socket.recv(sock, len(raw))
            except OSError:
                return

    def stop(self) -> None:
        """Close every socket and join every thread (within a few seconds)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._acceptor.join(5)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
        for thread in threads:
            thread.join(5)
        alive = [t for t in threads if t.is_alive()]
        if alive or self._acceptor.is_alive():
            raise RuntimeError(f"hostile server: {len(alive)} threads did not end")
