"""The secret that logs opendrs in to the Proxmox API: the API token's secret or the password.

It comes from the file the configuration names (``token_file`` / ``password_file``), else from the
environment (``OPENDRS_PROXMOX_TOKEN`` / ``OPENDRS_PROXMOX_PASSWORD``), never from the command
line. It is never logged: errors name the file, never its content; the file is read and checked
by :mod:`opendrs.secret_file`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from opendrs.backends.base import BackendError
from opendrs.secret_file import SecretError, read_secret_file

__all__ = ["ENV_PASSWORD", "ENV_TOKEN", "load_secret"]

if TYPE_CHECKING:
    from opendrs.backends.proxmox.config import ProxmoxConfig

#: Environment variables that hold the secret when no file is configured.
ENV_TOKEN: Final = "OPENDRS_PROXMOX_TOKEN"
ENV_PASSWORD: Final = "OPENDRS_PROXMOX_PASSWORD"


def load_secret(config: ProxmoxConfig, environ: Mapping[str, str]) -> str:
    """The token secret or password: from its file, else from the environment."""
    file = config.token_file if config.token_name else config.password_file
    try:
        if file is not None:
            return read_secret_file(file)
    except SecretError as exc:
        raise BackendError(str(exc), transient=False) from None
    variable = ENV_TOKEN if config.token_name else ENV_PASSWORD
    secret = environ.get(variable, "").strip()
    if not secret:
        key = "token_file" if config.token_name else "password_file"
        raise BackendError(
            f"no secret for {config.auth_id}: set backend.{key} or the environment variable "
            f"{variable}",
            transient=False,
        )
    if not secret.isprintable():
        raise BackendError(f"the environment variable {variable} is not printable text", False)
    return secret
