"""How to reach an Incus (or LXD) cluster: :class:`IncusConfig`, read from a configuration file's
``backend:`` section (``type: incus``) by :func:`parse_incus`.

Two ways in: the local unix socket (``socket``; the default when no ``addresses`` are given:
Incus's ``/var/lib/incus/unix.socket``, or LXD's with ``flavour: lxd``), or HTTPS
(``addresses``, tried in turn) with a client certificate and its key (``client_cert``,
``client_key``) and the server's certificate or CA (``server_cert``); TLS verification is on
unless ``verify: false`` says otherwise (which logs a warning). The key file is checked to be
readable here and read by the TLS layer when the backend connects: neither the configuration nor
a log line ever holds its content.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from opendrs.model.document import Path, Reader, describe
from opendrs.model.units import format_duration

INCUS_SOCKET: Final = "/var/lib/incus/unix.socket"
#: LXD's sockets: the snap's, then the one of Debian's ``lxd`` package (``LXD_DIR=/var/lib/lxd``).
LXD_SOCKETS: Final = ("/var/snap/lxd/common/lxd/unix.socket", "/var/lib/lxd/unix.socket")
FLAVOURS: Final = ("incus", "lxd")
_KEYS: Final = (
    "type",
    "flavour",
    "socket",
    "addresses",
    "client_cert",
    "client_key",
    "server_cert",
    "verify",
    "project",
    "all_projects",
    "timeout",
    "retries",
    "migration_timeout",
    "leader_only",
    "rebalance_keys",
    "user_keys",
    "placement_scriptlet",
    "scriptlet_timeout",
)
#: The range of ``timeout`` and of ``migration_timeout``, in seconds.
_TIMEOUT_RANGE: Final = (1, 3600)
_MIGRATION_TIMEOUT_RANGE: Final = (10, 7 * 86400)
#: The range of ``scriptlet_timeout``, in seconds (Incus gives a run 5 s).
_SCRIPTLET_TIMEOUT_RANGE: Final = (1, 60)
_ADDRESS = re.compile(r"https://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(?::\d{1,5})?/?")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True, slots=True)
class IncusConfig:
    """How to reach an Incus or LXD cluster. It names the key file, never holds the key."""

    #: The local unix socket, when ``addresses`` is empty.
    socket: str | None = INCUS_SOCKET
    #: HTTPS endpoints (``https://host:8443``), tried in this order.
    addresses: tuple[str, ...] = ()
    client_cert: str | None = None
    client_key: str | None = None
    #: The server's certificate or its CA (PEM); ``None``: the system's CAs.
    server_cert: str | None = None
    verify: bool = True
    flavour: Literal["incus", "lxd"] = "incus"
    #: The project observed and acted in, unless ``all_projects``.
    project: str = "default"
    all_projects: bool = False
    #: Seconds one try of an API call may take, all told.
    timeout: float = 10.0
    #: Extra tries of a failed read (and of a request that surely did not arrive).
    retries: int = 3
    #: Seconds a migration (its operation) may run before it counts as failed.
    migration_timeout: float = 3600.0
    #: Act only on the member that is the cluster's database leader.
    leader_only: bool = False
    #: Take ``cluster.rebalance.*`` as the policy's defaults (and warn about Incus's balancer).
    rebalance_keys: bool = True
    #: Read the instances' ``user.opendrs.*`` keys as rules.
    user_keys: bool = True
    #: Honour the server's ``instances.placement.scriptlet`` for the targets opendrs chooses.
    placement_scriptlet: bool = True
    #: Seconds one run of the placement scriptlet may take before it is cut off.
    scriptlet_timeout: float = 5.0
    #: Seconds before the first retry; doubled for each further one, at most 30 s.
    backoff: float = 0.5

    def __post_init__(self) -> None:
        if not self.addresses and not self.socket:
            raise ValueError("IncusConfig needs a socket or at least one address")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("IncusConfig takes client_cert and client_key together")

    @property
    def where(self) -> str:
        """Where the API is reached (for messages; never secret)."""
        return ", ".join(self.addresses) if self.addresses else f"unix:{self.socket}"


def default_socket(flavour: str) -> str:
    """The platform's own socket: Incus's, or LXD's (the snap's when it exists, else Debian's)."""
    if flavour == "incus":
        return INCUS_SOCKET
    return next((s for s in LXD_SOCKETS if os.path.exists(s)), LXD_SOCKETS[-1])


def parse_incus(reader: Reader, value: object, path: Path) -> IncusConfig:
    """The ``backend:`` section of a configuration file, ``type: incus``.

    Problems are :class:`~opendrs.model.document.DocumentError` s, one line each. The certificate
    and key files are checked to be readable; a key file that every user may read is refused.
    """
    mapping = reader.mapping(value, path)
    reader.check_keys(mapping, path, _KEYS)
    reader.choice(reader.require(mapping, "type", path), (*path, "type"), ("incus",))
    flavour = "incus"
    if "flavour" in mapping:
        flavour = reader.choice(mapping["flavour"], (*path, "flavour"), FLAVOURS)
    addresses = _parse_addresses(reader, mapping, path)
    socket: str | None = None
    if "socket" in mapping:
        if addresses:
            reader.fail((*path, "socket"), "give a socket or addresses, not both")
        socket = _file(reader, mapping["socket"], (*path, "socket"))
    elif not addresses:
        socket = default_socket(flavour)
    cert, key, server_cert, verify = _parse_tls(reader, mapping, path, bool(addresses))
    project, all_projects = _parse_project(reader, mapping, path)
    flags = {
        name: reader.boolean(mapping[name], (*path, name)) if name in mapping else default
        for name, default in (
            ("leader_only", False),
            ("rebalance_keys", True),
            ("user_keys", True),
            ("placement_scriptlet", True),
        )
    }
    retries = 3
    if "retries" in mapping:
        retries = reader.integer(mapping["retries"], (*path, "retries"), minimum=0, maximum=10)
    return IncusConfig(
        socket=socket,
        addresses=addresses,
        client_cert=cert,
        client_key=key,
        server_cert=server_cert,
        verify=verify,
        flavour=flavour,  # type: ignore[arg-type]
        project=project,
        all_projects=all_projects,
        timeout=_seconds(reader, mapping, path, "timeout", 10.0, _TIMEOUT_RANGE),
        retries=retries,
        migration_timeout=_seconds(
            reader, mapping, path, "migration_timeout", 3600.0, _MIGRATION_TIMEOUT_RANGE
        ),
        scriptlet_timeout=_seconds(
            reader, mapping, path, "scriptlet_timeout", 5.0, _SCRIPTLET_TIMEOUT_RANGE
        ),
        **flags,
    )


def _parse_addresses(reader: Reader, mapping: Mapping[str, Any], path: Path) -> tuple[str, ...]:
    """``addresses``: one HTTPS URL or a list of them, each listed once."""
    if "addresses" not in mapping:
        return ()
    where: Path = (*path, "addresses")
    raw = mapping["addresses"]
    items = reader.text_list([raw] if isinstance(raw, str) else raw, where)
    if not items:
        reader.fail(where, "must name at least one https:// address")
    addresses: list[str] = []
    for index, item in enumerate(items):
        if not _ADDRESS.fullmatch(item):
            reader.fail(
                (*where, index),
                f"expected https://host[:port] (e.g. https://incus1:8443), got {describe(item)}",
            )
        address = item.rstrip("/")
        if address in addresses:
            reader.fail((*where, index), f"{address} is listed twice")
        addresses.append(address)
    return tuple(addresses)


def _parse_tls(
    reader: Reader, mapping: Mapping[str, Any], path: Path, https: bool
) -> tuple[str | None, str | None, str | None, bool]:
    """``client_cert``, ``client_key``, ``server_cert`` and ``verify``."""
    verify = reader.boolean(mapping["verify"], (*path, "verify")) if "verify" in mapping else True
    files: dict[str, str | None] = {}
    for name in ("client_cert", "client_key", "server_cert"):
        files[name] = None
        if name in mapping:
            if not https:
                reader.fail((*path, name), "is for addresses (HTTPS); the unix socket needs none")
            files[name] = _file(reader, mapping[name], (*path, name), must_exist=True)
    if https:
        for name in ("client_cert", "client_key"):
            if files[name] is None:
                reader.fail((*path, name), "required with addresses: the API trusts certificates")
        key = files["client_key"]
        assert key is not None
        if os.stat(key).st_mode & 0o004:
            reader.fail(
                (*path, "client_key"), f"{key} may be read by every user: chmod o-r it first"
            )
    if files["server_cert"] is not None and not verify:
        reader.fail((*path, "server_cert"), "has no use with verify: false")
    return files["client_cert"], files["client_key"], files["server_cert"], verify


def _parse_project(reader: Reader, mapping: Mapping[str, Any], path: Path) -> tuple[str, bool]:
    all_projects = False
    if "all_projects" in mapping:
        all_projects = reader.boolean(mapping["all_projects"], (*path, "all_projects"))
    project = "default"
    if "project" in mapping:
        if all_projects:
            reader.fail((*path, "project"), "give project or all_projects: true, not both")
        project = reader.text(mapping["project"], (*path, "project"))
        if not _PROJECT.fullmatch(project):
            reader.fail((*path, "project"), f"not a project name: {describe(project)}")
    return project, all_projects


def _seconds(
    reader: Reader,
    mapping: Mapping[str, Any],
    path: Path,
    key: str,
    default: float,
    limits: tuple[int, int],
) -> float:
    if key not in mapping:
        return default
    seconds = reader.duration(mapping[key], (*path, key))
    shortest, longest = limits
    if not shortest <= seconds <= longest:
        reader.fail(
            (*path, key),
            f"must be between {format_duration(shortest)} and {format_duration(longest)}, "
            f"got {describe(mapping[key])}",
        )
    return float(seconds)


def _file(reader: Reader, value: object, path: Path, *, must_exist: bool = False) -> str:
    """A file named in the configuration, relative to it; with ``must_exist``, readable."""
    text = reader.text(value, path)
    local_path = getattr(reader, "local_path", None)
    resolved = str(local_path(text, path)) if callable(local_path) else os.path.expanduser(text)
    if must_exist and (not os.path.isfile(resolved) or not os.access(resolved, os.R_OK)):
        reader.fail(path, f"cannot read the file {resolved!r}")
    return resolved
