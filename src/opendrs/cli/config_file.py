"""Where the commands that drive a cluster find their configuration: ``--config FILE``, else
the default path — ``/etc/opendrs/opendrs.yaml``, or the file the environment variable
``OPENDRS_CONFIG`` names."""

from __future__ import annotations

import argparse
import os
from typing import Final

from opendrs.cli.process import UsageError

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "add_config_option",
    "default_config_path",
    "existing_default_config",
    "resolve_config",
]

#: The configuration file ``run``, ``status``, ``history``, ``snapshot`` and ``maintenance``
#: read when no ``--config`` is given (and the file ``opendrs init`` writes by default).
DEFAULT_CONFIG: Final = "/etc/opendrs/opendrs.yaml"
#: The environment variable that names another default configuration file.
CONFIG_ENV: Final = "OPENDRS_CONFIG"


def default_config_path() -> str:
    """The default configuration file: ``$OPENDRS_CONFIG`` when set (and not blank), else
    :data:`DEFAULT_CONFIG`."""
    return os.environ.get(CONFIG_ENV, "").strip() or DEFAULT_CONFIG


def add_config_option(p: argparse.ArgumentParser) -> None:
    """``--config FILE``, optional: :func:`resolve_config` puts the default path in when it is
    not given."""
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"the configuration (YAML; default {DEFAULT_CONFIG}, or ${CONFIG_ENV})",
    )
    p.set_defaults(default_config=True)


def resolve_config(args: argparse.Namespace) -> None:
    """Set ``args.config`` to the default configuration file for a command that takes one
    (:func:`add_config_option`) and was given none; :class:`UsageError` when that file does not
    exist, saying how to write one."""
    if not getattr(args, "default_config", False) or args.config is not None:
        return
    args.config = existing_default_config()


def existing_default_config() -> str:
    """:func:`default_config_path`, or :class:`UsageError` when that file does not exist,
    naming it and saying how to write one."""
    path = default_config_path()
    if not os.path.exists(path):
        origin = f" (from ${CONFIG_ENV})" if path != DEFAULT_CONFIG else ""
        raise UsageError(
            f"no configuration file at {path}{origin}: write one with 'opendrs init --platform "
            f"proxmox' (or incus) and edit it, or name one with --config FILE"
        )
    return path
