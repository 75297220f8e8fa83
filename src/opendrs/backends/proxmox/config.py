"""How to reach a Proxmox VE cluster: :class:`ProxmoxConfig`, read from a configuration file's
``backend:`` section (``type: proxmox``) by :func:`parse_proxmox`.

The login is an API token (recommended: ``user`` + ``token_name``, the secret in ``token_file`` or
in the environment variable ``OPENDRS_PROXMOX_TOKEN``) or a password (``password_file`` or
``OPENDRS_PROXMOX_PASSWORD``); :mod:`opendrs.backends.proxmox.secret` reads the secret, which the
configuration never holds. TLS verification is on unless ``verify_tls: false`` says otherwise
(which logs a warning); ``ca_file`` names the cluster's CA (``/etc/pve/pve-root-ca.pem``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Final, Literal

from opendrs.backends.proxmox.pools import PoolRule, parse_pools
from opendrs.backends.proxmox.secret import environ_secret
from opendrs.model.document import Path, Reader, describe
from opendrs.model.units import format_duration
from opendrs.secret_file import SecretError, read_secret_file

DEFAULT_PORT: Final = 8006
USAGE_WINDOWS: Final = ("hour", "day")
_KEYS: Final = (
    "type",
    "hosts",
    "user",
    "token_name",
    "token_file",
    "password_file",
    "verify_tls",
    "ca_file",
    "timeout",
    "retries",
    "usage_window",
    "tags",
    "ha_rules",
    "leader_only",
    "node",
    "respect_auto_rebalance",
    "pools",
)
#: The range of ``timeout``, in seconds.
_TIMEOUT_RANGE: Final = (1, 3600)
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_HOST = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9][A-Za-z0-9.-]*))(?::(?P<port>\d+))?"
)


@dataclass(frozen=True, slots=True)
class ProxmoxConfig:
    """How to reach a Proxmox VE cluster. It holds where the secret is, never the secret."""

    #: API endpoints as ``host:port`` (``[v6]:port``), tried in this order.
    hosts: tuple[str, ...]
    #: ``user@realm``; the token's owner when ``token_name`` is set.
    user: str
    token_name: str | None = None
    token_file: str | None = None
    password_file: str | None = None
    verify_tls: bool = True
    ca_file: str | None = None
    #: Seconds one try of an API call may take, all told (connect, send, the whole answer).
    timeout: float = 10.0
    #: Extra tries of a failed read (and of a request that surely did not arrive).
    retries: int = 3
    #: RRD timeframe whose averages are the measured usage.
    usage_window: Literal["hour", "day"] = "hour"
    #: Read ProxLB's ``plb_*`` tags as rules.
    tags: bool = True
    #: Read Proxmox HA rules (and legacy HA groups) as rules.
    ha_rules: bool = True
    #: An HA resource with ``auto-rebalance: 0`` (pve-manager 9.1.13) is ignored: its operator
    #: does not want it moved to balance the cluster.
    respect_auto_rebalance: bool = True
    #: Seconds before the first retry; doubled for each further one, at most 30 s.
    backoff: float = 1.0
    #: Act only on the node whose HA manager is the current master (a daemon on every node).
    leader_only: bool = False
    #: The node this daemon runs on, for ``leader_only``; ``None``: the host's short name, as
    #: Proxmox names its nodes.
    node: str | None = None
    #: Resource pools kept together or apart (pool id, or ``*`` for every other pool -> rule).
    pools: Mapping[str, PoolRule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("ProxmoxConfig needs at least one host")
        if self.token_file is not None and self.password_file is not None:
            raise ValueError("ProxmoxConfig takes token_file or password_file, not both")

    @property
    def auth_id(self) -> str:
        """Who logs in: ``user@realm!token`` or ``user@realm`` (never secret)."""
        return f"{self.user}!{self.token_name}" if self.token_name else self.user


def parse_host(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host[:port]`` / ``[v6]:port``, or ``None`` if it is not one."""
    match = _HOST.fullmatch(text.strip())
    if match is None:
        return None
    host = match.group("v6") or match.group("name")
    port = int(match.group("port")) if match.group("port") else DEFAULT_PORT
    if not 0 < port < 65536:
        return None
    return host, port


def host_text(host: str, port: int) -> str:
    """``host:port``, or ``[v6]:port`` for an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_proxmox(reader: Reader, value: object, path: Path) -> ProxmoxConfig:
    """The ``backend:`` section of a configuration file, ``type: proxmox``.

    Problems are :class:`~opendrs.model.document.DocumentError` s, one line each. A secret file
    is checked here (present, readable, not empty) and read again when the backend connects; a
    file every user may read is accepted with a warning.
    """
    mapping = reader.mapping(value, path)
    reader.check_keys(mapping, path, _KEYS)
    reader.choice(reader.require(mapping, "type", path), (*path, "type"), ("proxmox",))
    hosts = _parse_hosts(reader, mapping, path)
    user, token_name = _parse_user(reader, mapping, path)
    token_file, password_file = _parse_secret_files(reader, mapping, path, token_name)
    verify_tls, ca_file = _parse_tls(reader, mapping, path)
    timeout = _parse_timeout(reader, mapping, path)
    retries = 3
    if "retries" in mapping:
        retries = reader.integer(mapping["retries"], (*path, "retries"), minimum=0, maximum=10)
    window = "hour"
    if "usage_window" in mapping:
        window = reader.choice(mapping["usage_window"], (*path, "usage_window"), USAGE_WINDOWS)
    tags = reader.boolean(mapping["tags"], (*path, "tags")) if "tags" in mapping else True
    ha_rules = True
    if "ha_rules" in mapping:
        ha_rules = reader.boolean(mapping["ha_rules"], (*path, "ha_rules"))
    leader_only = False
    if "leader_only" in mapping:
        leader_only = reader.boolean(mapping["leader_only"], (*path, "leader_only"))
    node = None
    if "node" in mapping:
        node = reader.text(mapping["node"], (*path, "node"), allow_int=True)
        if not _NODE_NAME.fullmatch(node):
            reader.fail((*path, "node"), f"not a Proxmox node name: {describe(node)}")
    respect_auto_rebalance = True
    if "respect_auto_rebalance" in mapping:
        respect_auto_rebalance = reader.boolean(
            mapping["respect_auto_rebalance"], (*path, "respect_auto_rebalance")
        )
    pools = parse_pools(reader, mapping["pools"], (*path, "pools")) if "pools" in mapping else {}
    return ProxmoxConfig(
        hosts=tuple(hosts),
        user=user,
        token_name=token_name,
        token_file=token_file,
        password_file=password_file,
        verify_tls=verify_tls,
        ca_file=ca_file,
        timeout=timeout,
        retries=retries,
        usage_window=window,  # type: ignore[arg-type]
        tags=tags,
        ha_rules=ha_rules,
        leader_only=leader_only,
        node=node,
        respect_auto_rebalance=respect_auto_rebalance,
        pools=pools,
    )


def _parse_hosts(reader: Reader, mapping: Mapping[str, Any], path: Path) -> list[str]:
    """``hosts``: one API host or a list of them, each as ``host:port`` and listed once."""
    hosts_path: Path = (*path, "hosts")
    raw_hosts = reader.require(mapping, "hosts", path)
    if isinstance(raw_hosts, str):
        raw_hosts = [raw_hosts]
    items = reader.text_list(raw_hosts, hosts_path)
    if not items:
        reader.fail(hosts_path, "must name at least one API host")
    hosts: list[str] = []
    for index, item in enumerate(items):
        parsed = parse_host(item)
        if parsed is None:
            reader.fail((*hosts_path, index), f"expected host or host:port, got {describe(item)}")
        text = host_text(*parsed)
        if text in hosts:
            reader.fail((*hosts_path, index), f"{text} is listed twice")
        hosts.append(text)
    return hosts


def _parse_user(reader: Reader, mapping: Mapping[str, Any], path: Path) -> tuple[str, str | None]:
    """``user`` (``user@realm``, or ``user@realm!token``) and ``token_name``."""
    user = reader.text(reader.require(mapping, "user", path), (*path, "user"))
    token_name: str | None = None
    if "!" in user:
        user, _, token_name = user.partition("!")
        if "token_name" in mapping:
            reader.fail(
                (*path, "user"), "give the token's name in token_name or after '!', not both"
            )
    if "token_name" in mapping:
        token_name = reader.text(mapping["token_name"], (*path, "token_name"))
    if not re.fullmatch(r"[^\s@!:]+@[A-Za-z][A-Za-z0-9._-]*", user):
        reader.fail(
            (*path, "user"), f"expected user@realm (e.g. opendrs@pve), got {describe(user)}"
        )
    if token_name is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9._-]*", token_name):
        reader.fail((*path, "token_name"), f"not a valid token name: {describe(token_name)}")
    return user, token_name


def _parse_secret_files(
    reader: Reader, mapping: Mapping[str, Any], path: Path, token_name: str | None
) -> tuple[str | None, str | None]:
    """``token_file`` and ``password_file``, each checked by reading it (the secret is not
    kept)."""
    token_file = password_file = None
    if "token_file" in mapping:
        if token_name is None:
            reader.fail(
                (*path, "token_file"), "a token needs token_name (or user: user@realm!name)"
            )
        token_file = _resolve_path(
            reader, reader.text(mapping["token_file"], (*path, "token_file")), (*path, "token_file")
        )
    if "password_file" in mapping:
        if token_name is not None:
            reader.fail(
                (*path, "password_file"), "with token_name, the secret is the token's: token_file"
            )
        password_file = _resolve_path(
            reader,
            reader.text(mapping["password_file"], (*path, "password_file")),
            (*path, "password_file"),
        )
    for key, file in (("token_file", token_file), ("password_file", password_file)):
        if file is not None:
            try:
                read_secret_file(file, header=key == "token_file")
            except SecretError as exc:
                reader.fail((*path, key), str(exc))
    if token_file is None and password_file is None:
        # A secret from the environment is held to the same rules, when it is read here.
        try:
            environ_secret(os.environ, token=token_name is not None)
        except SecretError as exc:
            reader.fail(path, str(exc))
    return token_file, password_file


def _parse_tls(reader: Reader, mapping: Mapping[str, Any], path: Path) -> tuple[bool, str | None]:
    """``verify_tls`` and ``ca_file`` (which must be readable)."""
    verify_tls = True
    if "verify_tls" in mapping:
        verify_tls = reader.boolean(mapping["verify_tls"], (*path, "verify_tls"))
    ca_file = None
    if "ca_file" in mapping:
        if not verify_tls:
            reader.fail((*path, "ca_file"), "has no use with verify_tls: false")
        ca_file = _resolve_path(
            reader, reader.text(mapping["ca_file"], (*path, "ca_file")), (*path, "ca_file")
        )
        if not os.access(ca_file, os.R_OK) or not os.path.isfile(ca_file):
            reader.fail((*path, "ca_file"), f"cannot read the CA file {ca_file!r}")
    return verify_tls, ca_file


def _parse_timeout(reader: Reader, mapping: Mapping[str, Any], path: Path) -> float:
    """``timeout``: a duration within :data:`_TIMEOUT_RANGE`."""
    if "timeout" not in mapping:
        return 10.0
    seconds = reader.duration(mapping["timeout"], (*path, "timeout"))
    shortest, longest = _TIMEOUT_RANGE
    if not shortest <= seconds <= longest:
        reader.fail(
            (*path, "timeout"),
            f"must be between {format_duration(shortest)} and {format_duration(longest)}, "
            f"got {describe(mapping['timeout'])}",
        )
    return float(seconds)


def _resolve_path(reader: Reader, text: str, path: Path) -> str:
    """A file named in the configuration: ``~`` expanded, relative to the configuration file."""
    local_path = getattr(reader, "local_path", None)
    if callable(local_path):
        return str(local_path(text, path))
    expanded = FsPath(os.path.expanduser(text))
    if expanded.is_absolute():
        return str(expanded)
    base = FsPath(reader.filename).parent if os.path.isfile(reader.filename) else FsPath.cwd()
    return str(base / expanded)
