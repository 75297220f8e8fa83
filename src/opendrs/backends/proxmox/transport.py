"""How one API host is reached: a proxmoxer API object whose requests can be ended from outside.

Each try of a call (one HTTP request to one host) runs on a thread of its own
(:mod:`opendrs.backends.tries`) while the calling thread waits for it. The requests transport
made here tells the try under way which sockets it uses, so a try given up on (deadline passed,
stop requested) has its connections shut down and its thread ends soon after. A password login
goes through the same session, and so under a try's deadline too.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import time
from typing import Any

from opendrs.backends.proxmox.config import ProxmoxConfig
from opendrs.backends.tries import Try, handle_of, track

__all__ = ["Try", "close_api", "connect"]


def connect(config: ProxmoxConfig, host: str, port: int, secret: str) -> Any:
    """A proxmoxer API object for a host, on the tracked transport (logged in, for a
    password)."""
    from proxmoxer import ProxmoxAPI

    verify: bool | str = (config.ca_file or True) if config.verify_tls else False
    # With a password, proxmoxer would log in here, around the tracked transport: it gets a
    # token placeholder instead, and the login happens below through the session.
    api = ProxmoxAPI(
        host,
        port=port,
        user=config.user,
        verify_ssl=verify,
        timeout=config.timeout,
        service="PVE",
        token_name=config.token_name or "-",
        token_value=secret if config.token_name else "-",
    )
    session = api._store["session"]
    adapter = _adapter_type()
    session.mount("https://", adapter())
    session.mount("http://", adapter())
    if not config.token_name:
        try:
            session.auth = _ticket_auth_type()(
                session,
                api._backend.get_base_url(),
                config.user,
                secret,
                timeout=config.timeout,
                service="PVE",
                verify_ssl=verify,
            )
        except BaseException:
            close_api(api)
            raise
    return api


def close_api(api: Any) -> None:
    """Close an API object's connections (best effort)."""
    with contextlib.suppress(Exception):  # closing is best effort
        api._store["session"].close()


@functools.cache
def _adapter_type() -> type[Any]:
    """A requests transport adapter whose connections tell the try under way their socket."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
    from urllib3.poolmanager import ProxyManager

    class Tracked:
        #: A second descriptor of the connection's socket: shutting it down from another thread
        #: ends a TLS handshake or a read under way, whatever object wraps the socket by then.
        _opendrs_handle: socket.socket | None = None

        def _new_conn(self) -> socket.socket:
            sock: socket.socket = super()._new_conn()  # type: ignore[misc]
            self._opendrs_drop()
            self._opendrs_handle = handle_of(sock)
            track(self._opendrs_handle)
            return sock

        def request(self, *args: Any, **kwargs: Any) -> Any:
            track(self._opendrs_handle)  # a kept-alive connection, used by another try
            return super().request(*args, **kwargs)  # type: ignore[misc]

        def close(self) -> None:
            try:
                super().close()  # type: ignore[misc]
            finally:
                self._opendrs_drop()

        def _opendrs_drop(self) -> None:
            handle, self._opendrs_handle = self._opendrs_handle, None
            if handle is not None:
                handle.close()

    class TrackedHTTPConnection(Tracked, HTTPConnection):
        pass

    class TrackedHTTPSConnection(Tracked, HTTPSConnection):
        pass

    class TrackedHTTPPool(HTTPConnectionPool):
        ConnectionCls = TrackedHTTPConnection

    class TrackedHTTPSPool(HTTPSConnectionPool):
        ConnectionCls = TrackedHTTPSConnection

    pools = {"http": TrackedHTTPPool, "https": TrackedHTTPSPool}

    class TrackedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: Any, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **kwargs)
            if isinstance(manager, ProxyManager):
                manager.pool_classes_by_scheme = pools
            return manager

    return TrackedAdapter


@functools.cache
def _ticket_auth_type() -> type[Any]:
    """proxmoxer's password login, sent through the API session (and so under a try's deadline).

    proxmoxer's own logs in with ``requests.post``, around the session's transport, where a try
    given up on could not end it.
    """
    from proxmoxer import AuthenticationError
    from proxmoxer.backends.https import ProxmoxHTTPAuth, ProxmoxHTTPAuthBase

    class TicketAuth(ProxmoxHTTPAuth):  # type: ignore[misc]
        def __init__(
            self, session: Any, base_url: str, user: str, password: str, **kwargs: Any
        ) -> None:
            ProxmoxHTTPAuthBase.__init__(self, **kwargs)  # not ProxmoxHTTPAuth's: no login yet
            self.base_url = base_url
            self.username = user
            self.pve_auth_ticket = ""
            self.csrf_prevention_token = ""
            self.birth_time = time.monotonic()
            self._session = session
            #: No ticket: for the login request itself.
            self._plain = ProxmoxHTTPAuthBase(**kwargs)
            self._get_new_tokens(password=password)

        def _get_new_tokens(
            self, password: str | None = None, otp: Any = None, otptype: Any = None
        ) -> None:
            url = self.base_url + "/access/ticket"
            data = {"username": self.username, "password": password or self.pve_auth_ticket}
            response = self._session.request("POST", url, data=data, auth=self._plain)
            status = response.status_code
            if status == 200:
                answer = response.json()["data"]
                if isinstance(answer, dict) and "ticket" in answer and not answer.get("NeedTFA"):
                    self.birth_time = time.monotonic()
                    self.pve_auth_ticket = str(answer["ticket"])
                    self.csrf_prevention_token = str(answer.get("CSRFPreventionToken", ""))
                    return
                status = 401  # a second factor is asked for: not supported
            raise AuthenticationError(
                f"Couldn't authenticate user: {self.username} to {url} code: {status}"
            )

        def __call__(self, request: Any) -> Any:
            request = super().__call__(request)  # renews the ticket when it is old
            request.prepare_cookies(self.get_cookies())  # the ticket in force now
            return request

    return TicketAuth
