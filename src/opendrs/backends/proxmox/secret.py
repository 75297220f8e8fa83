"""The secret that logs opendrs in to the Proxmox API: the API token's secret or the password.

It comes from the file the configuration names (``token_file`` / ``password_file``), else from the
environment (``OPENDRS_PROXMOX_TOKEN`` / ``OPENDRS_PROXMOX_PASSWORD``), never from the command
line. It is never logged: errors name the file or the variable, never the content. Both are held
to the same rules (:func:`opendrs.secret_file.check_secret`): printable text on one line, and for
a token — sent in an HTTP header — Latin-1 only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from opendrs.backends.base import BackendError
from opendrs.secret_file import SecretError, check_secret, read_secret_file

__all__ = ["ENV_PASSWORD", "ENV_TOKEN", "Login", "environ_secret", "load_secret"]

#: Environment variables that hold the secret when no file is configured.
ENV_TOKEN: Final = "OPENDRS_PROXMOX_TOKEN"
ENV_PASSWORD: Final = "OPENDRS_PROXMOX_PASSWORD"


class Login(Protocol):
    """Who logs in and where the secret is: what :func:`load_secret` reads of the ``backend:``
    section (a :class:`~opendrs.backends.proxmox.config.ProxmoxConfig`)."""

    @property
    def token_name(self) -> str | None: ...

    @property
    def token_file(self) -> str | None: ...

    @property
    def password_file(self) -> str | None: ...

    @property
    def auth_id(self) -> str: ...


def load_secret(config: Login, environ: Mapping[str, str]) -> str:
    """The token secret or password: from its file, else from the environment. A secret that
    cannot be had is a :class:`BackendError` naming the setting (``backend.token_file: the
    secret file '…' is empty``)."""
    file = config.token_file if config.token_name else config.password_file
    token = config.token_name is not None
    key = "token_file" if token else "password_file"
    try:
        if file is not None:
            return read_secret_file(file, header=token)
        secret = environ_secret(environ, token=token)
    except SecretError as exc:
        setting = "backend" if file is None else f"backend.{key}"
        raise BackendError(f"{setting}: {exc}", transient=False) from None
    if secret is None:
        raise BackendError(
            f"no secret for {config.auth_id}: set backend.{key} or the environment variable "
            f"{ENV_TOKEN if token else ENV_PASSWORD}",
            transient=False,
        )
    return secret


def environ_secret(environ: Mapping[str, str], *, token: bool) -> str | None:
    """The secret the environment holds (``OPENDRS_PROXMOX_TOKEN`` for a token, else
    ``OPENDRS_PROXMOX_PASSWORD``), checked as one from a file; ``None`` when it is not set (or
    blank). Raises :class:`~opendrs.secret_file.SecretError`."""
    variable = ENV_TOKEN if token else ENV_PASSWORD
    value = environ.get(variable, "")
    if not value.strip():
        return None
    return check_secret(value, f"the environment variable {variable}", header=token)
