"""The Proxmox VE backend: observe a cluster through its API, migrate guests, follow the tasks.

Connection (:class:`ProxmoxConfig`, read from the ``backend:`` section by :func:`parse_proxmox`):
an API token (recommended: ``user`` + ``token_name``, the secret in ``token_file`` or in the
environment variable ``OPENDRS_PROXMOX_TOKEN``) or a password (``password_file`` or
``OPENDRS_PROXMOX_PASSWORD``). Secrets never come from the command line and are never logged, not
even inside an exception's message; a secret file others could change (writable by its group or
by every user, or owned by someone else than the user running opendrs or root) is refused. TLS
verification is on unless ``verify_tls: false`` says otherwise (which logs a warning); ``ca_file``
names the cluster's CA (``/etc/pve/pve-root-ca.pem``).

Deadlines: each try of a call — one HTTP request to one host: connect, TLS, send, the whole
answer — ends within ``timeout``, whatever the server does (it runs on a thread of its own, which
the caller stops waiting for; the try's sockets are then shut down, so the thread ends too). A
read is tried again after a timeout, a lost connection or a passing server error, on each host in
turn, ``retries`` more times with exponential backoff, so one read takes at most
``(retries + 1) × len(hosts) × timeout`` plus the backoffs (47 s with the defaults and one host).
A migration request is never sent twice unless the first surely did not reach the server; when it
may have (no answer in time, the connection broke after sending, a stop request), the
:class:`~opendrs.backends.base.BackendError` says ``uncertain``. While a call waits (for its
answer, or between tries), ``should_stop()`` is asked every 0.2 s; once it is true the call is
given up on and no new one is sent. An observation ends at its first read that fails for good
(the reads under way are given up on, those not started dropped), and an RRD read that gets no
answer makes the observation skip the other RRD reads, so an API that stops answering ends an
observation within about two reads' worst case.

:meth:`ProxmoxBackend.observe` reads, per observation:

* ``GET /cluster/resources`` once: nodes, guests (qemu and lxc, templates left out), storages;
* ``GET /storage``: which storages are shared (disks elsewhere are local :class:`Disk` s);
* ``GET /cluster/ha/resources`` and ``GET /cluster/ha/status/manager_status``: HA-managed guests,
  their HA state and migration target, nodes in HA maintenance;
* ``GET /cluster/ha/rules`` (Proxmox VE 9; ``/cluster/ha/groups`` before it) unless
  ``ha_rules: false``: node affinity and resource affinity, parsed by
  :mod:`opendrs.compat.pve` and dropped where Proxmox drops them;
* per online node, ``/nodes/{n}/status`` (CPU architecture, the memory KSM shares) and
  ``/nodes/{n}/rrddata``;
* per guest on an online node, its config (vCPUs, memory, disks, passed-through devices) and, when
  it runs, its ``rrddata`` over ``usage_window`` (averages of CPU, memory and pressure; the current
  values of ``/cluster/resources`` when the RRD has none);
* for a guest locked by a migration, the running task's log, which names the target.

ProxLB's tags keep working (``tags: true``): ``plb_affinity_*`` and ``plb_anti_affinity_*`` shared
by two or more guests are hard rules, a guest's ``plb_pin_<node>`` tags pin it to those nodes,
``plb_ignore_*`` guests are never moved.

Migrations (:meth:`ProxmoxBackend.start_migration`): a VM moves by live migration
(``online=1``, ``with-local-disks=1`` when it has local disks and the settings allow it); a
container only by restart migration, and only when ``settings.allow_restart_migration``;
HA-managed guests through the HA stack (``/cluster/ha/resources/{sid}/migrate``, ``relocate`` for
containers), so the HA manager does not fight the move. The handle's id is the task's UPID (which
names the node to poll it on); for a request to the HA stack it is
``ha:<sid>:<source>:<target>:<since>`` until :meth:`~ProxmoxBackend.poll` finds the task the HA
manager started. :meth:`~ProxmoxBackend.cancel` stops the migration's task
(``DELETE /nodes/{node}/tasks/{upid}``); a request to the HA stack can be stopped only once its
task is known.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import pwd
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Final, Literal, TypeVar

from opendrs.backends.base import DONE, RUNNING, BackendError, Handle, Progress, failed
from opendrs.compat import pve as pve_compat
from opendrs.model.cluster import (
    HA_STATES,
    Cluster,
    Disk,
    Guest,
    GuestState,
    Move,
    Node,
    Pressure,
    Settings,
)
from opendrs.model.document import MAX_BYTES, Path, Reader, describe
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.units import format_bytes, format_duration

__all__ = [
    "ENV_PASSWORD",
    "ENV_TOKEN",
    "ProxmoxBackend",
    "ProxmoxConfig",
    "parse_proxmox",
]

log = logging.getLogger(__name__)

#: Environment variables that hold the secret when no file is configured.
ENV_TOKEN: Final = "OPENDRS_PROXMOX_TOKEN"
ENV_PASSWORD: Final = "OPENDRS_PROXMOX_PASSWORD"

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
)
#: Largest secret file read (a token secret is a 36-character UUID).
_SECRET_MAX: Final = 4096
#: Calls made at once while observing (per-node and per-guest reads).
_WORKERS: Final = 4
#: Longest wait between two tries of a call, in seconds.
_BACKOFF_MAX: Final = 30.0
#: How often a call waiting for its answer (or a backoff) asks whether opendrs is stopping, s.
_STOP_POLL: Final = 0.2
#: Threads of tries given up on that may still be ending; beyond, calls fail at once.
_STRAGGLERS_MAX: Final = 16
#: The range of ``timeout``, in seconds.
_TIMEOUT_RANGE: Final = (1, 3600)
#: HTTP statuses worth asking again (a read only): the server or a proxy had a passing problem.
_RETRY_STATUS: Final = frozenset({500, 502, 503, 504, 599})
#: Proxmox's statuses for a node it cannot reach (pveproxy's proxying to another node failed).
_UNREACHABLE: Final = frozenset({595, 596})
#: Task ids remembered to tell new HA tasks from old ones.
_REMEMBERED: Final = 4096
#: A request to the HA stack with no task and no HA state change after this long has failed.
_HA_START_GRACE: Final = 300.0
#: Clock difference tolerated between opendrs and the cluster when finding an HA task, seconds.
_CLOCK_SLACK: Final = 10
#: Storage types that are shared by nature, whatever their ``shared`` flag says.
_NETWORK_STORAGE: Final = frozenset(
    {"rbd", "cephfs", "nfs", "cifs", "glusterfs", "iscsi", "iscsidirect", "pbs", "zfs"}
)
_QEMU_DISK = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate|unused)\d+")
_LXC_DISK = re.compile(r"(rootfs|mp\d+|unused\d+)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_HOST = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9][A-Za-z0-9.-]*))(?::(?P<port>\d+))?"
)
_TAG_SPLIT = re.compile(r"[;,\s]+")
_MIGRATION_TARGET = re.compile(
    r"migration of (?:VM|CT) \d+ to node '?([A-Za-z0-9][A-Za-z0-9.-]*)'?"
)
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\"()\]]+)")
_SSL_REASON = re.compile(r"certificate verify failed: ([^'\"()\]]+)")

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Configuration


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
    #: Seconds before the first retry; doubled for each further one, at most 30 s.
    backoff: float = 1.0

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("ProxmoxConfig needs at least one host")
        if self.token_file is not None and self.password_file is not None:
            raise ValueError("ProxmoxConfig takes token_file or password_file, not both")

    @property
    def auth_id(self) -> str:
        """Who logs in: ``user@realm!token`` or ``user@realm`` (never secret)."""
        return f"{self.user}!{self.token_name}" if self.token_name else self.user


def _resolve_path(reader: Reader, text: str, path: Path) -> str:
    local_path = getattr(reader, "local_path", None)
    if callable(local_path):
        return str(local_path(text, path))
    expanded = FsPath(os.path.expanduser(text))
    if expanded.is_absolute():
        return str(expanded)
    base = FsPath(reader.filename).parent if os.path.isfile(reader.filename) else FsPath.cwd()
    return str(base / expanded)


def _parse_host(text: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host[:port]`` / ``[v6]:port``, or ``None`` if it is not one."""
    match = _HOST.fullmatch(text.strip())
    if match is None:
        return None
    host = match.group("v6") or match.group("name")
    port = int(match.group("port")) if match.group("port") else DEFAULT_PORT
    if not 0 < port < 65536:
        return None
    return host, port


def _host_text(host: str, port: int) -> str:
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

    hosts_path: Path = (*path, "hosts")
    raw_hosts = reader.require(mapping, "hosts", path)
    if isinstance(raw_hosts, str):
        raw_hosts = [raw_hosts]
    items = reader.text_list(raw_hosts, hosts_path)
    if not items:
        reader.fail(hosts_path, "must name at least one API host")
    hosts: list[str] = []
    for index, item in enumerate(items):
        parsed = _parse_host(item)
        if parsed is None:
            reader.fail((*hosts_path, index), f"expected host or host:port, got {describe(item)}")
        text = _host_text(*parsed)
        if text in hosts:
            reader.fail((*hosts_path, index), f"{text} is listed twice")
        hosts.append(text)

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
                _read_secret_file(file)
            except _SecretError as exc:
                reader.fail((*path, key), str(exc))

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

    timeout = 10.0
    if "timeout" in mapping:
        seconds = reader.duration(mapping["timeout"], (*path, "timeout"))
        shortest, longest = _TIMEOUT_RANGE
        if not shortest <= seconds <= longest:
            reader.fail(
                (*path, "timeout"),
                f"must be between {format_duration(shortest)} and {format_duration(longest)}, "
                f"got {describe(mapping['timeout'])}",
            )
        timeout = float(seconds)
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
    )


# --------------------------------------------------------------------------------------------
# Secrets


class _SecretError(Exception):
    """A secret that cannot be had; the message names the file, never the content."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_secret_file(file: str, info: os.stat_result) -> None:
    """Refuse a secret file others could change: one writable by its group or by every user,
    or one that belongs to neither the user running opendrs nor root."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user" if mode & stat.S_IWOTH else "its group"
        raise _SecretError(
            f"the secret file {file!r} is writable by {who} (mode {mode:04o}): "
            "chmod 600 (or 640) it"
        )
    euid = os.geteuid()
    if info.st_uid not in (euid, 0):
        raise _SecretError(
            f"the secret file {file!r} belongs to {_user(info.st_uid)}, not to the user running "
            f"opendrs ({_user(euid)}) or root: chown it"
        )


def _read_secret_file(file: str) -> str:
    """The secret in ``file`` (surrounding white space dropped), or :class:`_SecretError`.

    A file others could change is refused (:func:`_check_secret_file`); one every user may read
    is used, with a warning.
    """
    try:
        info = os.stat(file)
    except OSError as exc:
        raise _SecretError(f"cannot read the secret file {file!r}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise _SecretError(f"the secret file {file!r} is not a regular file")
    try:
        with open(file, "rb") as stream:
            info = os.fstat(stream.fileno())  # the file read, even if it was replaced meanwhile
            if not stat.S_ISREG(info.st_mode):
                raise _SecretError(f"the secret file {file!r} is not a regular file")
            _check_secret_file(file, info)
            data = stream.read(_SECRET_MAX + 1)
    except OSError as exc:
        raise _SecretError(f"cannot read the secret file {file!r}: {exc.strerror}") from None
    if len(data) > _SECRET_MAX:
        raise _SecretError(f"the secret file {file!r} is too large to hold only a secret")
    try:
        secret = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise _SecretError(f"the secret file {file!r} is not UTF-8 text") from None
    if not secret:
        raise _SecretError(f"the secret file {file!r} is empty")
    if not secret.isprintable() or any(c.isspace() for c in secret):
        raise _SecretError(f"the secret file {file!r} must hold only the secret, on one line")
    if info.st_mode & stat.S_IROTH:
        log.warning(
            "the secret file %s is readable by every user on this host: chmod 600 (or 640) it",
            file,
        )
    return secret


def _load_secret(config: ProxmoxConfig, environ: Mapping[str, str]) -> str:
    """The token secret or password: from its file, else from the environment."""
    file = config.token_file if config.token_name else config.password_file
    try:
        if file is not None:
            return _read_secret_file(file)
    except _SecretError as exc:
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


# --------------------------------------------------------------------------------------------
# Small readers of API values (numbers come as numbers or strings)


def _num(value: object, default: float | None = None) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else default
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return default
        return number if math.isfinite(number) else default
    return default


def _int(value: object, default: int = 0) -> int:
    number = _num(value)
    return default if number is None else int(number)


def _ksm_shared(value: object) -> int:
    """Bytes of ``ksm: {shared: BYTES}`` in a node's status; 0 when missing or not a size."""
    shared = value.get("shared") if isinstance(value, dict) else None
    if isinstance(shared, bool):
        return 0
    number = _num(shared)
    if number is None or not 0 <= number <= MAX_BYTES:
        return 0
    return int(number)


def _flag(value: object) -> bool:
    return bool(_num(value, 0.0))


def _list(value: object, what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise BackendError(f"unexpected answer from the Proxmox API for {what}: not a list")
    return [item for item in value if isinstance(item, dict)]


def _dict(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BackendError(f"unexpected answer from the Proxmox API for {what}: not an object")
    return value


def _size(text: str) -> int:
    """Bytes of a Proxmox size (``32G``, ``512M``, ``1.5T``, plain bytes)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return 0
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def _options(value: str) -> tuple[str, dict[str, str]]:
    """``('first', {key: value})`` of a property string such as ``local:vm-1-disk-0,size=8G``."""
    first = ""
    props: dict[str, str] = {}
    for index, part in enumerate(value.split(",")):
        key, eq, val = part.partition("=")
        if eq:
            props[key.strip()] = val.strip()
        elif index == 0:
            first = part.strip()
    return first, props


def _tags(value: object) -> tuple[str, ...]:
    if not isinstance(value, str):
        return ()
    return tuple(dict.fromkeys(t for t in _TAG_SPLIT.split(value) if t))


def _average(points: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [v for v in (_num(p.get(key)) for p in points) if v is not None]
    return sum(values) / len(values) if values else None


def _average_cores(points: Sequence[Mapping[str, Any]], maxcpu: float) -> float | None:
    """Average CPU use in cores of RRD points (``cpu`` is a fraction of ``maxcpu``)."""
    values = []
    for point in points:
        cpu = _num(point.get("cpu"))
        if cpu is not None:
            values.append(cpu * (_num(point.get("maxcpu")) or maxcpu))
    return sum(values) / len(values) if values else None


def _pressure(points: Sequence[Mapping[str, Any]], current: Mapping[str, Any]) -> Pressure:
    """PSI averages (percent) from RRD points, else from the current values."""

    def value(key: str) -> float:
        found = _average(points, key)
        if found is None:
            found = _num(current.get(key))
        return max(0.0, found or 0.0)

    return Pressure(
        cpu=value("pressurecpusome"),
        memory=value("pressurememorysome"),
        io=value("pressureiosome"),
        memory_full=value("pressurememoryfull"),
        io_full=value("pressureiofull"),
    )


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class _Upid:
    text: str
    node: str
    type: str
    id: str
    starttime: int


def _parse_upid(text: str) -> _Upid | None:
    """``UPID:node:pid:pstart:starttime:type:id:user:`` (pid, pstart, starttime in hex)."""
    parts = text.split(":")
    if len(parts) < 8 or parts[0] != "UPID" or not parts[1]:
        return None
    try:
        starttime = int(parts[4], 16)
    except ValueError:
        return None
    return _Upid(text, parts[1], parts[5], parts[6], starttime)


# --------------------------------------------------------------------------------------------
# The API client: hosts in turn, a deadline per try, bounded retries, errors as BackendError
#
# Each try (one HTTP request to one API host) runs on a thread of its own while the calling thread
# waits for it, at most ``timeout`` seconds and asking every 0.2 s whether opendrs is stopping.
# A try given up on (deadline passed, stop requested) has its connections shut down — the
# transport below tells each try which sockets it uses — so its thread ends soon after, and calls
# fail at once while too many such threads are still alive: they cannot pile up.


class _HttpError(BackendError):
    """An HTTP error answer of the API."""

    def __init__(self, reason: str, status: int, message: str, *, transient: bool) -> None:
        super().__init__(reason, transient=transient)
        self.status = status
        self.message = message


class _Expired(BackendError):
    """A try that did not end within its deadline (``timeout``)."""


class _Abandoned(BackendError):
    """A call given up on: opendrs is stopping, or the observation it served failed."""


#: Per thread: the try under way (on a try's thread), the abort flag of an observation's reads.
_local = threading.local()


class _Try:
    """One HTTP request to one host, on a thread of its own; :meth:`abandon` ends it early."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work = work
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._abandoned = False

    def run(self) -> None:
        _local.current = self
        try:
            self.result = self._work()
        except BaseException as exc:  # handed over to the waiting caller
            self.error = exc
        finally:
            _local.current = None
            self.done.set()

    def track(self, sock: socket.socket) -> None:
        """A socket this try uses (shut down at once when the try was given up on)."""
        with self._lock:
            if not self._abandoned:
                self._sockets.append(sock)
                return
        _shut(sock)

    def abandon(self) -> None:
        """Shut the try's connections down: whatever its thread waits for ends with an error."""
        with self._lock:
            self._abandoned = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # Not SSLSocket.shutdown (which drops its TLS state under a reading thread): the socket's own.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _track(sock: socket.socket | None) -> None:
    current: _Try | None = getattr(_local, "current", None)
    if current is not None and sock is not None:
        current.track(sock)


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
            with contextlib.suppress(OSError):
                self._opendrs_handle = sock.dup()
            _track(self._opendrs_handle)
            return sock

        def request(self, *args: Any, **kwargs: Any) -> Any:
            _track(self._opendrs_handle)  # a kept-alive connection, used by another try
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


class _Client:
    """Calls the Proxmox API through proxmoxer, one session per API host."""

    def __init__(
        self,
        config: ProxmoxConfig,
        secret: str,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self._config = config
        self._secret = secret
        self._should_stop = should_stop
        self._hosts = [p for p in (_parse_host(h) for h in config.hosts) if p is not None]
        if not self._hosts:
            raise BackendError("no usable API host in the configuration", transient=False)
        self._apis: dict[int, Any] = {}
        self._current = 0
        self._lock = threading.Lock()
        #: Threads of tries given up on that have not ended yet.
        self._stragglers: list[threading.Thread] = []
        #: Waits between rounds of tries; returns early when opendrs is stopping (replaceable
        #: in tests).
        self.sleep: Callable[[float], None] = self._pause

    def host_text(self, index: int) -> str:
        return _host_text(*self._hosts[index])

    def scrub(self, text: str) -> str:
        """``text`` without the secret, whatever put it there."""
        return text.replace(self._secret, "***") if self._secret else text

    def _connect(self, index: int) -> Any:
        """A proxmoxer API object for a host, on the tracked transport (logged in, for a
        password)."""
        from proxmoxer import ProxmoxAPI

        host, port = self._hosts[index]
        config = self._config
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
            token_value=self._secret if config.token_name else "-",
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
                    self._secret,
                    timeout=config.timeout,
                    service="PVE",
                    verify_ssl=verify,
                )
            except BaseException:
                _close_api(api)
                raise
        return api

    def _api(self, index: int) -> Any:
        with self._lock:
            api = self._apis.get(index)
        if api is not None:
            return api
        api = self._connect(index)  # outside the lock: a password login takes a request
        with self._lock:
            existing = self._apis.setdefault(index, api)
        if existing is not api:
            _close_api(api)
        return existing

    def _forget(self, index: int) -> None:
        with self._lock:
            api = self._apis.pop(index, None)
        if api is not None:
            _close_api(api)

    def close(self) -> None:
        with self._lock:
            apis, self._apis = list(self._apis.values()), {}
        for api in apis:
            _close_api(api)

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params)

    def post(self, path: str, **data: Any) -> Any:
        return self._call("POST", path, data)

    def delete(self, path: str, **params: Any) -> Any:
        return self._call("DELETE", path, params)

    def _stop_reason(self) -> str | None:
        """Why calls must end now, if they must."""
        if self._should_stop():
            return "opendrs is stopping"
        abort: threading.Event | None = getattr(_local, "abort", None)
        if abort is not None and abort.is_set():
            return "another read of the observation failed"
        return None

    def _pause(self, seconds: float) -> None:
        """Sleep, in slices: a stop request ends the wait (and the next try is not sent)."""
        end = time.monotonic() + seconds
        while self._stop_reason() is None:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, _STOP_POLL))

    def _try(self, index: int, method: str, path: str, params: dict[str, Any], what: str) -> Any:
        """One request to one host, given up on at the deadline or when opendrs is stopping."""
        where = self.host_text(index)
        reason = self._stop_reason()
        if reason is not None:
            raise _Abandoned(f"{what} on {where}: not sent: {reason}")
        with self._lock:
            self._stragglers = [t for t in self._stragglers if t.is_alive()]
            stragglers = len(self._stragglers)
        if stragglers >= _STRAGGLERS_MAX:
            raise BackendError(
                f"{what} on {where}: not sent: {stragglers} calls given up on have not ended yet"
            )

        def work() -> Any:
            resource = self._api(index)(path)
            call = {"GET": resource.get, "POST": resource.post, "DELETE": resource.delete}
            return call[method](**params)

        attempt = _Try(work)
        thread = threading.Thread(target=attempt.run, name="opendrs-pve-call", daemon=True)
        timeout = self._config.timeout
        deadline = time.monotonic() + timeout
        thread.start()
        ended = False
        try:
            while not attempt.done.wait(max(0.0, min(_STOP_POLL, deadline - time.monotonic()))):
                reason = self._stop_reason()
                if reason is None and time.monotonic() < deadline:
                    continue
                # A request that changes the cluster may have arrived and taken effect.
                uncertain = method == "POST"
                if reason is not None:
                    raise _Abandoned(f"{what} on {where}: given up: {reason}", uncertain=uncertain)
                raise _Expired(
                    f"{what} on {where}: no answer within {timeout:g}s", uncertain=uncertain
                )
            ended = True
        finally:
            if not ended:  # given up on (or the waiting thread was interrupted): let it go
                attempt.abandon()
                with self._lock:
                    self._stragglers.append(thread)
        if attempt.error is not None:
            raise attempt.error
        return attempt.result

    def _call(self, method: str, path: str, params: dict[str, Any]) -> Any:
        """One API call: each host in turn, then again after a backoff, ``retries`` more times.

        Every try has a deadline of ``timeout``. A read (or a ``DELETE``, which stops a task) is
        tried again after a timeout, a lost connection or a passing server error; a ``POST`` only
        when it surely did not reach the server (connection refused), else the error says
        ``uncertain``. A stop request ends the call at once.
        """
        import requests
        from proxmoxer import AuthenticationError, ResourceException

        config = self._config
        what = f"{method} /{path}"
        repeatable = method != "POST"
        last: BackendError | None = None
        for attempt in range(config.retries + 1):
            if attempt:
                if last is not None and not last.transient:
                    break
                delay = min(config.backoff * 2 ** (attempt - 1), _BACKOFF_MAX)
                log.debug("%s: try %d of %d in %.2fs", what, attempt + 1, config.retries + 1, delay)
                self.sleep(delay)
            start = self._current
            for index in [(start + k) % len(self._hosts) for k in range(len(self._hosts))]:
                where = self.host_text(index)
                try:
                    result = self._try(index, method, path, params, what)
                except _Abandoned:
                    raise
                except _Expired as error:
                    if not repeatable:
                        raise
                    last = error
                    self._note(error)
                    continue
                except ResourceException as exc:
                    error = self._http_error(exc, what, where)
                    if (
                        not repeatable
                        or exc.status_code not in _RETRY_STATUS
                        or not error.transient
                    ):
                        raise error from None
                    last = error
                    log.debug("%s", error)
                    continue
                except AuthenticationError as exc:
                    self._forget(index)
                    code = re.search(r"code: (\d+)", str(exc))
                    status = int(code.group(1)) if code else 401
                    if status in (401, 403):
                        raise BackendError(
                            f"authentication failed at {where} for {config.auth_id}: check the "
                            "password",
                            transient=False,
                        ) from None
                    # The login itself did not get through (a server or proxy error).
                    last = BackendError(f"{what} on {where}: login failed: HTTP {status}")
                    log.debug("%s", last)
                    continue
                except requests.exceptions.RequestException as exc:
                    if _is_tls(exc):
                        self._forget(index)
                    error, sent = self._network_error(exc, what, where)
                    if sent and not repeatable:
                        raise BackendError(
                            error.reason, transient=error.transient, uncertain=True
                        ) from None
                    last = error
                    self._note(error)
                    continue
                except (ValueError, TypeError, KeyError) as exc:
                    # A malformed answer (not JSON, not the expected shape) from proxmoxer.
                    raise BackendError(
                        self.scrub(f"{what} on {where}: unexpected answer ({type(exc).__name__})")
                    ) from None
                if index != self._current:
                    log.info("using the Proxmox API on %s", where)
                    self._current = index
                if isinstance(result, dict) and set(result) == {"errors"}:
                    raise BackendError(f"{what} on {where}: the answer is not JSON")
                return result
        assert last is not None
        if config.retries and last.transient:
            reason = f"{last.reason} (after {config.retries + 1} tries)"
            if isinstance(last, _HttpError):
                raise _HttpError(reason, last.status, last.message, transient=True)
            raise BackendError(reason, transient=True)
        raise last

    def _note(self, error: BackendError) -> None:
        if len(self._hosts) > 1:
            log.warning("%s; trying the next API host", error)
        else:
            log.debug("%s", error)

    def _http_error(self, exc: Any, what: str, where: str) -> _HttpError:
        status = int(exc.status_code)
        message = str(exc.content or exc.status_message or "").strip()
        errors = exc.errors
        if isinstance(errors, dict) and errors:
            detail = "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()))
            message = f"{message} ({detail})" if message else detail
        message = self.scrub(_clip(message or "no reason given", 240))
        if status == 401:
            hint = "the API token" if self._config.token_name else "the password"
            return _HttpError(
                f"authentication failed at {where} for {self._config.auth_id}: check {hint} "
                f"({status} {message})",
                status,
                message,
                transient=False,
            )
        if status == 403:
            return _HttpError(
                f"{what} on {where}: permission denied for {self._config.auth_id}: {message}",
                status,
                message,
                transient=False,
            )
        transient = status >= 500 and not _permanent(message)
        return _HttpError(
            f"{what} on {where}: HTTP {status}: {message}", status, message, transient=transient
        )

    def _network_error(self, exc: Exception, what: str, where: str) -> tuple[BackendError, bool]:
        """The error and whether the request may have reached the server."""
        import requests

        text = str(exc)
        timeout = self._config.timeout
        if _is_tls(exc):
            found = _SSL_REASON.search(text)
            reason = found.group(1).strip() if found else "handshake failed"
            hint = " (set ca_file to the cluster's CA)" if self._config.verify_tls else ""
            error = BackendError(
                self.scrub(f"{what} on {where}: TLS verification failed: {reason}{hint}"),
                transient=False,
            )
            return error, False
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return BackendError(
                f"{what} on {where}: no connection within {timeout:g}s", transient=True
            ), False
        if isinstance(exc, requests.exceptions.Timeout):
            return BackendError(
                f"{what} on {where}: no answer within {timeout:g}s", transient=True
            ), True
        if isinstance(exc, requests.exceptions.ConnectionError):
            found = _ERRNO.search(text)
            reason = found.group(1).strip().lower() if found else "connection lost"
            sent = "NewConnectionError" not in text and "NameResolutionError" not in text
            if not sent:
                return BackendError(
                    self.scrub(f"{what} on {where}: cannot connect: {reason}"), transient=True
                ), False
            if "BadStatusLine" in text or "InvalidHeader" in text:
                reason = "the answer is not HTTP"
            return BackendError(
                self.scrub(f"{what} on {where}: no answer: {reason}"), transient=True
            ), True
        return BackendError(
            self.scrub(f"{what} on {where}: request failed ({type(exc).__name__})"),
            transient=True,
        ), True


def _is_tls(exc: Exception) -> bool:
    import requests

    return isinstance(exc, requests.exceptions.SSLError)


def _close_api(api: Any) -> None:
    with contextlib.suppress(Exception):  # closing is best effort
        api._store["session"].close()


_PERMANENT = (
    "does not exist",
    "no such cluster node",
    "no such task",
    "unable to parse worker upid",
    "not implemented",
    "is local node",
    "can't migrate",
    "not defined",
    "rrd error",
)


def _permanent(message: str) -> bool:
    lowered = message.lower()
    return any(p in lowered for p in _PERMANENT)


# --------------------------------------------------------------------------------------------
# What a guest's config tells


@dataclass(frozen=True, slots=True)
class _Config:
    vcpus: float
    memory: int
    disks: tuple[Disk, ...]
    devices: tuple[str, ...]
    lock: str | None
    tags: tuple[str, ...]


def _memory_mib(value: object, default: int) -> int:
    if isinstance(value, str):
        value = value.split(",")[0].partition("=")[2] or value.split(",")[0]
    return _int(value, default)


def _is_local_device(key: str, value: str) -> bool:
    """A VM config entry that ties the VM to its node: PCI passthrough, host USB, host serial."""
    if re.fullmatch(r"hostpci\d+", key):
        return True
    if re.fullmatch(r"usb\d+", key):
        return not value.startswith("spice")
    return bool(re.fullmatch(r"(serial|parallel)\d+", key)) and value.startswith("/dev/")


def _qemu_config(config: Mapping[str, Any], maxcpu: float, shared: frozenset[str]) -> _Config:
    vcpus = _num(config.get("vcpus"))
    if not vcpus:
        vcpus = float(_int(config.get("cores"), 1) * _int(config.get("sockets"), 1))
    memory = _memory_mib(config.get("memory"), 512) * 1024**2
    disks: list[Disk] = []
    devices: list[str] = []
    for key in sorted(config):
        value = config[key]
        if not isinstance(value, str):
            continue
        if _QEMU_DISK.fullmatch(key):
            volume, props = _options(value)
            if props.get("media") == "cdrom":
                if volume in ("", "none") or "cloudinit" in volume:
                    continue
                storage = volume.partition(":")[0] if ":" in volume else None
                if storage is None or storage not in shared:
                    devices.append(f"{key} (local CD/DVD)")
                continue
            if volume.startswith("/") or ":" not in volume:
                devices.append(f"{key} (host disk)")
                continue
            storage = volume.partition(":")[0]
            disks.append(Disk(storage, _size(props.get("size", "0")), storage in shared))
        elif _is_local_device(key, value):
            devices.append(key)
    return _Config(
        vcpus=float(vcpus or maxcpu or 1),
        memory=memory,
        disks=tuple(disks),
        devices=tuple(devices),
        lock=config.get("lock") if isinstance(config.get("lock"), str) else None,
        tags=_tags(config.get("tags")),
    )


def _lxc_config(config: Mapping[str, Any], maxcpu: float, shared: frozenset[str]) -> _Config:
    vcpus = _num(config.get("cores")) or maxcpu or 1.0
    memory = _memory_mib(config.get("memory"), 512) * 1024**2
    disks: list[Disk] = []
    devices: list[str] = []
    for key in sorted(config):
        value = config[key]
        if not isinstance(value, str):
            continue
        if _LXC_DISK.fullmatch(key):
            volume, props = _options(value)
            if volume.startswith("/"):
                if not _flag(props.get("shared", "0")):
                    devices.append(f"{key} (bind mount)")
                continue
            if ":" not in volume:
                continue
            storage = volume.partition(":")[0]
            disks.append(Disk(storage, _size(props.get("size", "0")), storage in shared))
        elif re.fullmatch(r"dev\d+", key):
            devices.append(key)
    return _Config(
        vcpus=float(vcpus),
        memory=memory,
        disks=tuple(disks),
        devices=tuple(devices),
        lock=config.get("lock") if isinstance(config.get("lock"), str) else None,
        tags=_tags(config.get("tags")),
    )


# --------------------------------------------------------------------------------------------
# HA


@dataclass(frozen=True, slots=True)
class _HaService:
    sid: str
    #: The requested state (``started``, ``stopped``, ``disabled``, ``ignored``).
    request: str | None
    #: The manager's state (``started``, ``migrate``, ``error``…), if the manager reports it.
    state: str | None
    node: str | None
    target: str | None
    group: str | None


@dataclass(frozen=True, slots=True)
class _HaView:
    services: Mapping[str, _HaService]
    maintenance: frozenset[str]


def _sid_guest(sid: str) -> str | None:
    """``vm:100`` → ``100``."""
    kind, _, vmid = sid.partition(":")
    if not vmid:
        kind, vmid = "vm", kind
    return vmid if kind in ("vm", "ct") and vmid.isdigit() else None


def _section(kind: str, name: str, props: Mapping[str, Any]) -> str:
    """One section of a Proxmox section-config file, for :mod:`opendrs.compat.pve` to parse."""
    lines = [f"{kind}: {name}"]
    for key, value in props.items():
        if value is None or value == "":
            continue
        text = " ".join(str(value).split())
        if text:
            lines.append(f"\t{key} {text}")
    return "\n".join(lines) + "\n\n"


# --------------------------------------------------------------------------------------------
# The backend


@dataclass(slots=True)
class _Known:
    """What the last observation knew about a guest (to start its migration)."""

    kind: Literal["qemu", "lxc"]
    node: str
    #: Its HA service, when the HA stack manages it.
    ha: _HaService | None


@dataclass(slots=True)
class _GuestRead:
    config: _Config | None = None
    rrd: list[dict[str, Any]] = field(default_factory=list)
    target: str | None = None
    #: Its config could not be read (gone, moved meanwhile, or its node unreachable).
    unreadable: bool = False


@dataclass(slots=True)
class _NodeRead:
    arch: str | None = None
    rrd: list[dict[str, Any]] = field(default_factory=list)
    reachable: bool = True
    #: Bytes KSM shares on the node (``ksm.shared`` of its status); 0 when not known.
    ksm_shared: int = 0


class ProxmoxBackend:
    """A Proxmox VE cluster, through its API (see the module documentation)."""

    name = "proxmox"
    read_only = False

    def __init__(
        self,
        config: ProxmoxConfig,
        settings: Settings,
        *,
        cluster_name: str | None = None,
        environ: Mapping[str, str] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.config = config
        #: Asked while a call waits for its answer: once true, the call is abandoned.
        self.should_stop: Callable[[], bool] = should_stop or (lambda: False)
        self.settings = settings
        self._cluster_name = cluster_name
        if not config.verify_tls:
            log.warning(
                "TLS verification of the Proxmox API is off (verify_tls: false): anyone on the "
                "network path can read the credentials; set ca_file instead"
            )
        secret = _load_secret(config, os.environ if environ is None else environ)
        self._client = _Client(config, secret, lambda: self.should_stop())
        self._known: dict[str, _Known] = {}
        self._shared: frozenset[str] | None = None
        self._seen_storages: frozenset[str] = frozenset()
        self._capacity: dict[str, tuple[float, int]] = {}
        self._resolved: dict[str, str] = {}
        self._followed: dict[str, None] = {}
        self._warned: set[str] = set()
        #: Set when an RRD read of the observation under way failed: the others are skipped.
        self._rrd_failed = threading.Event()

    @contextlib.contextmanager
    def _only_backend_errors(self, what: str) -> Iterator[None]:
        """Nothing but :class:`BackendError` may escape a backend method: anything else becomes
        one, ``what`` first, without the secret."""
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(self._client.scrub(f"{what}: {type(exc).__name__}: {exc}")) from None

    def __repr__(self) -> str:
        return f"ProxmoxBackend({', '.join(self.config.hosts)} as {self.config.auth_id})"

    # -- small helpers ---------------------------------------------------------------------

    def _get(self, path: str, **params: Any) -> Any:
        return self._client.get(path, **params)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    def _rrd(self, path: str) -> list[dict[str, Any]]:
        """RRD points over the usage window; none when the RRD cannot be read (the current
        values stand in), unless the credentials are the problem.

        Once an RRD read of an observation got no answer (after its retries), the observation's
        other RRD reads are skipped: a node whose RRD hangs costs one call's worst case, not one
        per guest.
        """
        if self._rrd_failed.is_set():
            return []
        try:
            return _list(
                self._get(path, timeframe=self.config.usage_window, cf="AVERAGE"), f"/{path}"
            )
        except _HttpError as exc:
            if exc.status in (401, 403):
                raise
            log.debug("no RRD data: %s", exc)
        except _Abandoned:
            raise
        except BackendError as exc:
            if not self._rrd_failed.is_set():
                self._rrd_failed.set()
                log.info("no RRD data: %s; the current values stand in this time", exc)
                self._warn_once(
                    "RRD data cannot be read (no answer): the current values stand in for the "
                    "measured usage while it cannot"
                )
        return []

    def _remember(self, key: str, upid: str | None = None) -> None:
        """Note a task as followed (and, with ``key``, as the task of that handle)."""
        self._followed[upid or key] = None
        if upid is not None:
            self._resolved[key] = upid
        for table in (self._followed, self._resolved):
            while len(table) > _REMEMBERED:
                del table[next(iter(table))]

    def _gather(self, jobs: Sequence[Callable[[], T]]) -> list[T]:
        """Run the reads ``jobs`` a few at a time; the first error is raised.

        Once a read failed, the reads not started are dropped and those under way given up on
        (their calls end within a fraction of a second): a failing API ends an observation after
        one call's worst case, not one per guest.
        """
        if len(jobs) <= 1:
            return [job() for job in jobs]
        abort = threading.Event()

        def run(job: Callable[[], T]) -> T:
            _local.abort = abort
            try:
                return job()
            finally:
                _local.abort = None

        with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="opendrs-pve") as pool:
            futures = [pool.submit(run, job) for job in jobs]
            wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                abort.set()
                for future in futures:
                    future.cancel()
        errors = [f.exception() for f in futures if not f.cancelled()]
        failures = [e for e in errors if e is not None]
        if failures:
            # The read that failed first in the list, rather than one given up on because of it.
            raise next((e for e in failures if not isinstance(e, _Abandoned)), failures[0])
        return [f.result() for f in futures]

    # -- observe -----------------------------------------------------------------------------

    def observe(self) -> Cluster:
        with self._only_backend_errors("cannot read the cluster"):
            return self._observe()

    def _observe(self) -> Cluster:
        self._rrd_failed = threading.Event()
        resources = _list(self._get("cluster/resources"), "/cluster/resources")
        node_rows = {
            str(r["node"]): r for r in resources if r.get("type") == "node" and r.get("node")
        }
        guest_rows = [
            r
            for r in resources
            if r.get("type") in ("qemu", "lxc")
            and not _flag(r.get("template"))
            and r.get("vmid") is not None
            and r.get("node") in node_rows
        ]
        shared = self._shared_storages(resources)
        ha = self._ha_view()
        online = {n for n, r in node_rows.items() if r.get("status") == "online"}

        def read_node(name: str) -> _NodeRead:
            try:
                status = _dict(self._get(f"nodes/{name}/status"), f"/nodes/{name}/status")
            except _HttpError as exc:
                if exc.status not in _UNREACHABLE:
                    raise
                self._warn_once(f"node {name} is unreachable: {exc.message}")
                return _NodeRead(reachable=False)
            kernel = status.get("current-kernel")
            arch = kernel.get("machine") if isinstance(kernel, dict) else None
            rrd = self._rrd(f"nodes/{name}/rrddata")
            return _NodeRead(
                arch if isinstance(arch, str) and arch else None,
                rrd,
                ksm_shared=_ksm_shared(status.get("ksm")),
            )

        def read_guest(row: Mapping[str, Any]) -> _GuestRead:
            node, vmid, kind = row["node"], row["vmid"], row["type"]
            base = f"nodes/{node}/{kind}/{vmid}"
            try:
                raw = _dict(self._get(f"{base}/config"), f"/{base}/config")
            except _HttpError as exc:
                # Gone or moved since /cluster/resources was read, or its node just went away.
                if exc.status not in _UNREACHABLE and "does not exist" not in exc.message:
                    raise
                log.debug("guest %s: %s", vmid, exc)
                return _GuestRead(unreadable=True)
            maxcpu = _num(row.get("maxcpu")) or 0.0
            parse = _qemu_config if kind == "qemu" else _lxc_config
            read = _GuestRead(config=parse(raw, maxcpu, shared))
            if row.get("status") == "running":
                read.rrd = self._rrd(f"{base}/rrddata")
            if row.get("lock") == "migrate":
                read.target = self._migration_target(str(node), str(vmid), kind)
            return read

        online_nodes = sorted(online)
        reachable = [r for r in guest_rows if r["node"] in online]
        jobs: list[Callable[[], Any]] = [lambda n=n: read_node(n) for n in online_nodes]
        jobs += [lambda r=r: read_guest(r) for r in reachable]
        results = self._gather(jobs)
        node_reads: dict[str, _NodeRead] = dict(
            zip(online_nodes, results[: len(online_nodes)], strict=True)
        )
        guest_reads: dict[str, _GuestRead] = {
            str(r["vmid"]): g for r, g in zip(reachable, results[len(online_nodes) :], strict=True)
        }

        guests, known = self._guests(guest_rows, guest_reads, ha)
        self._unseen_storages(guests)
        nodes = self._nodes(node_rows, node_reads, resources, shared, ha, guests)
        node_names = {n.name for n in nodes}
        rules = self._rules(guests, node_names, ha)
        self._known = known
        name = self._cluster_name or self._name_of_cluster(node_names)
        return Cluster(tuple(nodes), tuple(guests), rules, self.settings, name)

    def _name_of_cluster(self, nodes: Iterable[str]) -> str:
        try:
            status = _list(self._get("cluster/status"), "/cluster/status")
        except BackendError as exc:
            if exc.transient:
                raise
            self._warn_once(f"cannot read the cluster's name: {exc}")
            status = []
        for item in status:
            if item.get("type") == "cluster" and isinstance(item.get("name"), str):
                self._cluster_name = item["name"]
                return self._cluster_name
        self._cluster_name = min(nodes, default="proxmox")
        return self._cluster_name

    def _shared_storages(self, resources: Sequence[Mapping[str, Any]]) -> frozenset[str]:
        """Storages whose volumes every node sees: ``/storage`` (storage.cfg), together with the
        storage entries of ``/cluster/resources``; network storage types are shared by nature.

        Both list only the storages the user may audit (``Datastore.Audit``): a disk on a storage
        seen in neither counts as local, and :meth:`_unseen_storages` says so once.
        """
        try:
            storages = _list(self._get("storage"), "/storage")
        except _HttpError as exc:
            if exc.transient:
                raise
            self._warn_once(f"{exc}; the shared flags come from /cluster/resources instead")
            storages = []
        storages += [
            {"storage": r.get("storage"), "shared": r.get("shared"), "type": r.get("plugintype")}
            for r in resources
            if r.get("type") == "storage"
        ]
        shared: set[str] = set()
        seen: set[str] = set()
        for item in storages:
            name = item.get("storage")
            if not isinstance(name, str):
                continue
            seen.add(name)
            if _flag(item.get("shared")) or item.get("type") in _NETWORK_STORAGE:
                shared.add(name)
        self._shared = frozenset(shared)
        self._seen_storages = frozenset(seen)
        return self._shared

    def _unseen_storages(self, guests: Sequence[Guest]) -> None:
        """Warn (once) about storages that guests use but that no listing showed."""
        unseen = sorted(
            {d.pool for g in guests for d in g.disks} - self._seen_storages - self._shared
        )
        if unseen:
            what = "storage {} is" if len(unseen) == 1 else "storages {} are"
            self._warn_once(
                f"{what.format(', '.join(unseen))} not listed for {self.config.auth_id} (is "
                "Datastore.Audit on /storage missing?): disks there count as local"
            )

    def _ha_view(self) -> _HaView:
        resources = _list(self._get("cluster/ha/resources"), "/cluster/ha/resources")
        status = _dict(
            self._get("cluster/ha/status/manager_status"), "/cluster/ha/status/manager_status"
        )
        manager = status.get("manager_status")
        manager = manager if isinstance(manager, dict) else {}
        service_status = manager.get("service_status")
        service_status = service_status if isinstance(service_status, dict) else {}
        services: dict[str, _HaService] = {}
        sids = {str(r["sid"]) for r in resources if r.get("sid")} | {str(s) for s in service_status}
        requested = {str(r["sid"]): r for r in resources if r.get("sid")}
        for sid in sids:
            vmid = _sid_guest(sid)
            if vmid is None:
                continue
            config = requested.get(sid, {})
            current = service_status.get(sid)
            current = current if isinstance(current, dict) else {}
            services[vmid] = _HaService(
                sid=sid,
                request=config.get("state") if isinstance(config.get("state"), str) else None,
                state=current.get("state") if isinstance(current.get("state"), str) else None,
                node=current.get("node") if isinstance(current.get("node"), str) else None,
                target=current.get("target") if isinstance(current.get("target"), str) else None,
                group=config.get("group") if isinstance(config.get("group"), str) else None,
            )
        maintenance: set[str] = set()
        node_status = manager.get("node_status")
        if isinstance(node_status, dict):
            maintenance |= {str(n) for n, s in node_status.items() if s == "maintenance"}
        lrm_status = status.get("lrm_status")
        if isinstance(lrm_status, dict):
            maintenance |= {
                str(n)
                for n, s in lrm_status.items()
                if isinstance(s, dict) and s.get("mode") == "maintenance"
            }
        return _HaView(services, frozenset(maintenance))

    def _migration_target(self, node: str, vmid: str, kind: str) -> str | None:
        """The target of the migration task running for a guest, from the task's log; ``None``
        when it cannot be told (the guest then stays locked and is not moved)."""
        try:
            return self._read_migration_target(node, vmid, kind)
        except _HttpError as exc:
            if exc.status in (401, 403):
                raise
            log.debug("guest %s: no migration target: %s", vmid, exc)
            return None

    def _read_migration_target(self, node: str, vmid: str, kind: str) -> str | None:
        tasks = _list(
            self._get(f"nodes/{node}/tasks", vmid=vmid, source="active", limit=50),
            f"/nodes/{node}/tasks",
        )
        task_type = "qmigrate" if kind == "qemu" else "vzmigrate"
        for task in tasks:
            upid = task.get("upid")
            if (
                not isinstance(upid, str)
                or task.get("type") != task_type
                or str(task.get("id")) != vmid
                or task.get("endtime")
            ):
                continue
            lines = _list(
                self._get(f"nodes/{node}/tasks/{upid}/log", start=0, limit=20),
                f"/nodes/{node}/tasks/…/log",
            )
            for line in lines:
                found = _MIGRATION_TARGET.search(str(line.get("t", "")))
                if found and found.group(1) != node:
                    return found.group(1)
        return None

    def _guests(
        self,
        rows: Sequence[Mapping[str, Any]],
        reads: Mapping[str, _GuestRead],
        ha: _HaView,
    ) -> tuple[list[Guest], dict[str, _Known]]:
        guests: list[Guest] = []
        known: dict[str, _Known] = {}
        for row in sorted(rows, key=lambda r: _int(r.get("vmid"))):
            vmid = str(row["vmid"])
            node = str(row["node"])
            kind: Literal["qemu", "lxc"] = "qemu" if row["type"] == "qemu" else "lxc"
            read = reads.get(vmid, _GuestRead())
            config = read.config
            maxcpu = _num(row.get("maxcpu")) or 1.0
            status = row.get("status")
            state: GuestState = "running" if status == "running" else "stopped"
            if status == "paused" or row.get("qmpstatus") == "paused":
                state = "paused"
            service = ha.services.get(vmid)
            managed = service is not None and service.request != "ignored"
            if service is None and row.get("hastate"):
                # Listed by /cluster/resources as HA-managed although the HA views missed it.
                service = _HaService(
                    sid=f"{'vm' if kind == 'qemu' else 'ct'}:{vmid}",
                    request=None,
                    state=str(row["hastate"]),
                    node=node,
                    target=None,
                    group=None,
                )
                managed = True
            ha_state = None
            if managed and service is not None:
                ha_state = service.state or (
                    row.get("hastate") if isinstance(row.get("hastate"), str) else None
                )
            cpu_used: float
            memory_used: int
            pressure = Pressure()
            if state == "stopped":
                cpu_used, memory_used = 0.0, 0
            else:
                # RRD averages over the window; the current values when the RRD has none.
                cpu_used = _average_cores(read.rrd, maxcpu)
                if cpu_used is None:
                    cpu_used = (_num(row.get("cpu")) or 0.0) * maxcpu
                mem = _average(read.rrd, "mem")
                memory_used = int(mem if mem is not None else (_num(row.get("mem")) or 0))
                pressure = _pressure(read.rrd, row)
            lock = row.get("lock") if isinstance(row.get("lock"), str) else None
            if lock is None and config is not None:
                lock = config.lock
            if lock is None and read.unreadable:
                lock = "config-unreadable"  # not moved on what may be stale knowledge
            target = read.target
            if (
                target is None
                and managed
                and service is not None
                and service.target not in (None, node)
                and service.state in ("migrate", "relocate")
            ):
                target = service.target
            tags = _tags(row.get("tags")) or (config.tags if config else ())
            guest = Guest(
                id=vmid,
                node=node,
                kind="vm" if kind == "qemu" else "ct",
                name=str(row.get("name") or vmid),
                state=state,
                cpu=config.vcpus if config else maxcpu,
                memory=config.memory if config else _int(row.get("maxmem")),
                disks=config.disks if config else (),
                cpu_used=cpu_used,
                memory_used=memory_used,
                pressure=pressure,
                devices=config.devices if config else (),
                uptime=_int(row.get("uptime")),
                lock=lock,
                ha=managed,
                ha_state=ha_state if ha_state in HA_STATES else None,
                tags=tags,
                migrating_to=target,
            )
            guests.append(guest)
            known[vmid] = _Known(kind, node, service if managed else None)
        return guests, known

    def _nodes(
        self,
        rows: Mapping[str, Mapping[str, Any]],
        reads: Mapping[str, _NodeRead],
        resources: Sequence[Mapping[str, Any]],
        shared: frozenset[str],
        ha: _HaView,
        guests: Sequence[Guest],
    ) -> list[Node]:
        storage: dict[str, dict[str, int]] = {}
        for item in resources:
            if item.get("type") != "storage" or item.get("storage") in shared:
                continue
            if item.get("status") not in (None, "available"):
                continue
            content = item.get("content")
            if isinstance(content, str) and not {"images", "rootdir"} & set(content.split(",")):
                continue  # holds no guest disks (ISO images, templates, backups)
            name, pool = item.get("node"), item.get("storage")
            if isinstance(name, str) and isinstance(pool, str):
                storage.setdefault(name, {})[pool] = _int(item.get("maxdisk"))
        nodes: list[Node] = []
        for name in sorted(rows):
            row = rows[name]
            read = reads.get(name, _NodeRead())
            online = row.get("status") == "online" and read.reachable
            cpu = _num(row.get("maxcpu"))
            memory = _int(row.get("maxmem"))
            if cpu and memory:
                self._capacity[name] = (cpu, memory)
            else:
                cpu, memory = self._capacity.get(name, (0.0, 0))
            base_cpu = base_memory = 0
            pressure = Pressure()
            if online:
                used_cpu = _average_cores(read.rrd, cpu)
                if used_cpu is None:
                    used_cpu = (_num(row.get("cpu")) or 0.0) * cpu
                used_mem = _average(read.rrd, "memused")
                if used_mem is None:
                    used_mem = _num(row.get("mem")) or 0.0
                on_node = [g for g in guests if g.node == name and g.state != "stopped"]
                guest_cpu = sum(g.cpu_used or 0.0 for g in on_node)
                guest_mem = sum(g.memory_used or 0 for g in on_node)
                base_cpu = max(0.0, used_cpu - guest_cpu)
                base_memory = max(0, int(used_mem) - guest_mem)
                pressure = _pressure(read.rrd, {})
            nodes.append(
                Node(
                    name=name,
                    cpu=float(cpu),
                    memory=int(memory),
                    storage=storage.get(name, {}),
                    arch=read.arch or "x86_64",
                    online=online,
                    maintenance=name in ha.maintenance,
                    base_cpu=base_cpu,
                    base_memory=base_memory,
                    pressure=pressure,
                    ksm_shared=read.ksm_shared if online else 0,
                )
            )
        return nodes

    # -- rules ---------------------------------------------------------------------------------

    def _rules(self, guests: Sequence[Guest], nodes: set[str], ha: _HaView) -> Rules:
        ids = {g.id for g in guests}
        node_rules: list[NodeAffinity] = []
        guest_rules: list[GuestAffinity] = []
        ignored: set[str] = set()
        if self.config.ha_rules:
            node_rules, guest_rules = self._ha_rules(ids, nodes, ha)
        if self.config.tags:
            tag_nodes, tag_guests, ignored = self._tag_rules(guests, nodes)
            node_rules += tag_nodes
            guest_rules += tag_guests
        # An HA resource an operator set to ``ignored`` is theirs to handle: opendrs moves it
        # no more than the HA manager does.
        ignored |= {
            vmid for vmid, s in ha.services.items() if s.request == "ignored" and vmid in ids
        }
        return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored))

    def _ha_rules(
        self, ids: set[str], nodes: set[str], ha: _HaView
    ) -> tuple[list[NodeAffinity], list[GuestAffinity]]:
        """HA rules (Proxmox VE 9) or legacy HA groups, as Proxmox itself would keep them."""
        try:
            raw = _list(self._get("cluster/ha/rules"), "/cluster/ha/rules")
            legacy = False
        except _HttpError as exc:
            if exc.status not in (400, 404, 501):
                raise
            raw, legacy = [], True
        text = "".join(
            _section(
                str(r.get("type")),
                str(r.get("rule")),
                {
                    "resources": r.get("resources"),
                    "nodes": r.get("nodes"),
                    "strict": 1 if _flag(r.get("strict")) else None,
                    "affinity": r.get("affinity"),
                    "disable": 1 if _flag(r.get("disable")) else None,
                },
            )
            for r in raw
            if r.get("rule") and r.get("type")
        )
        rules, warnings = pve_compat.parse_rules(text)
        if legacy:
            groups_raw = _list(self._get("cluster/ha/groups"), "/cluster/ha/groups")
            groups_text = "".join(
                _section(
                    "group",
                    str(g.get("group")),
                    {
                        "nodes": g.get("nodes"),
                        "restricted": 1 if _flag(g.get("restricted")) else 0,
                        "nofailback": 1 if _flag(g.get("nofailback")) else 0,
                    },
                )
                for g in groups_raw
                if g.get("group")
            )
            groups, group_warnings = pve_compat.parse_groups(groups_text)
            warnings += group_warnings
            services = {
                s.sid: pve_compat.Service(sid=s.sid, node=s.node or "", group=s.group)
                for s in ha.services.values()
            }
            rules += pve_compat.groups_to_rules(groups, services, first_order=len(rules) + 1)
        errors = pve_compat.check_feasibility({r.ruleid: r for r in rules}, sorted(nodes))
        for ruleid in sorted(errors):
            for messages in errors[ruleid].values():
                for message in messages:
                    self._warn_once(f"HA rule '{ruleid}' is not used, because {message}")
        for warning in warnings:
            self._warn_once(f"HA rules: {warning}")
        node_rules: list[NodeAffinity] = []
        guest_rules: list[GuestAffinity] = []
        for rule in rules:
            if rule.disabled or rule.ruleid in errors:
                continue
            members = tuple(
                sorted(
                    {g for g in (_sid_guest(s) for s in rule.resources) if g in ids},
                    key=lambda g: int(g),
                )
            )
            if rule.type == "node-affinity":
                priorities = {n: p for n, p in rule.nodes.items() if n in nodes}
                if not members:
                    continue
                if not priorities:
                    self._warn_once(f"HA rule '{rule.ruleid}' names no node of the cluster")
                    continue
                node_rules.append(NodeAffinity(rule.ruleid, members, priorities, rule.strict))
            elif len(members) >= 2:
                guest_rules.append(
                    GuestAffinity(rule.ruleid, members, rule.affinity == "positive", hard=True)
                )
        return node_rules, guest_rules

    def _tag_rules(
        self, guests: Sequence[Guest], nodes: set[str]
    ) -> tuple[list[NodeAffinity], list[GuestAffinity], set[str]]:
        """ProxLB's tags: ``plb_affinity*``, ``plb_anti_affinity*``, ``plb_pin_<node>``,
        ``plb_ignore*``."""
        together: dict[str, list[str]] = {}
        apart: dict[str, list[str]] = {}
        pins: dict[str, set[str]] = {}
        ignored: set[str] = set()
        lowered = {n.lower(): n for n in nodes}
        for guest in guests:
            for tag in guest.tags:
                if tag.startswith("plb_anti_affinity"):
                    apart.setdefault(tag, []).append(guest.id)
                elif tag.startswith("plb_affinity"):
                    together.setdefault(tag, []).append(guest.id)
                elif tag.startswith("plb_ignore"):
                    ignored.add(guest.id)
                elif tag.startswith("plb_pin_"):
                    wanted = tag.removeprefix("plb_pin_")
                    node = wanted if wanted in nodes else lowered.get(wanted.lower())
                    if node is None:
                        self._warn_once(
                            f"guest {guest.id}: tag {tag} names no node of the cluster: skipped"
                        )
                        continue
                    pins.setdefault(guest.id, set()).add(node)
        guest_rules = [
            GuestAffinity(tag, tuple(members), positive, hard=True)
            for rules, positive in ((together, True), (apart, False))
            for tag, members in sorted(rules.items())
            if len(members) >= 2
        ]
        node_rules = [
            NodeAffinity(f"plb_pin {gid}", (gid,), dict.fromkeys(sorted(pinned), 0), strict=True)
            for gid, pinned in sorted(pins.items(), key=lambda item: int(item[0]))
        ]
        return node_rules, guest_rules, ignored

    # -- migrations ----------------------------------------------------------------------------

    def start_migration(self, move: Move) -> Handle:
        with self._only_backend_errors(f"cannot migrate {move.guest}"):
            return self._start(move)

    def _locate(self, vmid: str) -> _Known:
        """Where a guest is and what it is: from the last observation, else the API."""
        known = self._known.get(vmid)
        if known is not None:
            return known
        rows = _list(self._get("cluster/resources", type="vm"), "/cluster/resources")
        for row in rows:
            if str(row.get("vmid")) == vmid and row.get("type") in ("qemu", "lxc"):
                kind: Literal["qemu", "lxc"] = "qemu" if row["type"] == "qemu" else "lxc"
                ha = None
                if row.get("hastate"):
                    sid = f"{'vm' if kind == 'qemu' else 'ct'}:{vmid}"
                    ha = _HaService(
                        sid=sid,
                        request=None,
                        state=str(row["hastate"]),
                        node=None,
                        target=None,
                        group=None,
                    )
                return _Known(kind, str(row.get("node")), ha)
        raise BackendError(f"guest {vmid} does not exist", transient=False)

    def _start(self, move: Move) -> Handle:
        vmid, source, target = move.guest, move.source, move.target
        label = f"guest {vmid}"
        if source == target:
            raise BackendError(f"{label} is already on {target}", transient=False)
        if not vmid.isdigit():
            raise BackendError(f"{label}: not a Proxmox guest id", transient=False)
        known = self._locate(vmid)
        base = f"nodes/{source}/{known.kind}/{vmid}"
        try:
            status = _dict(self._get(f"{base}/status/current"), f"/{base}/status/current")
            raw = _dict(self._get(f"{base}/config"), f"/{base}/config")
        except _HttpError as exc:
            if "does not exist" in exc.message:
                raise BackendError(
                    f"{label} is not on {source} (any more)", transient=False
                ) from None
            raise
        shared = self._shared if self._shared is not None else self._shared_storages([])
        parse = _qemu_config if known.kind == "qemu" else _lxc_config
        config = parse(raw, _num(status.get("cpus")) or 1.0, shared)
        lock = status.get("lock") if isinstance(status.get("lock"), str) else config.lock
        if lock:
            raise BackendError(f"{label} is locked ({lock})", transient=True)
        if config.devices:
            raise BackendError(
                f"{label} uses local devices ({', '.join(config.devices)}): it cannot move",
                transient=False,
            )
        local = sum(d.size for d in config.disks if d.local)
        local_disks = any(d.local for d in config.disks)
        if local_disks and not self.settings.allow_local_disks:
            raise BackendError(
                f"{label} has disks on local storage ({format_bytes(local)}) and "
                "settings.allow_local_disks is off",
                transient=False,
            )
        running = status.get("status") == "running"
        if known.kind == "lxc" and running and not self.settings.allow_restart_migration:
            raise BackendError(
                f"{label} is a running container: it can only move by a restart migration, "
                "which settings.allow_restart_migration does not allow",
                transient=False,
            )
        ha_status = status.get("ha")
        managed = isinstance(ha_status, dict) and _flag(ha_status.get("managed"))
        if known.ha is not None and known.ha.request == "ignored":
            managed = False
        if known.kind == "qemu":
            self._precheck(base, label, target)
        if managed:
            return self._start_ha(move, known)
        params: dict[str, Any] = {"target": target}
        if known.kind == "qemu":
            if running:
                params["online"] = 1
            if local_disks:
                params["with-local-disks"] = 1
        elif running:
            params["restart"] = 1
        upid = self._client.post(f"{base}/migrate", **params)
        if not isinstance(upid, str) or _parse_upid(upid) is None:
            raise BackendError(f"{label}: the API answered the migration with no task")
        log.info("migrating %s from %s to %s: task %s", label, source, target, upid)
        self._remember(upid)
        return Handle(upid, move, time.time())

    def _precheck(self, base: str, label: str, target: str) -> None:
        """Proxmox's own check of a VM migration to ``target`` (storages, HA resources)."""
        try:
            check = _dict(self._get(f"{base}/migrate", target=target), f"/{base}/migrate")
        except _HttpError as exc:
            if exc.transient or exc.status in (401, 403):
                raise
            log.debug("%s: no migration precheck: %s", label, exc)
            return
        refused = check.get("not_allowed_nodes")
        if isinstance(refused, dict) and isinstance(refused.get(target), dict):
            why = refused[target]
            parts = []
            storages = why.get("unavailable_storages")
            if storages:
                parts.append(f"storage {', '.join(map(str, storages))} is not available there")
            blocking = why.get("blocking-ha-resources")
            if blocking:
                names = [str(b.get("sid", b)) if isinstance(b, dict) else str(b) for b in blocking]
                parts.append(f"HA resources {', '.join(names)} block it")
            reason = "; ".join(parts) or "Proxmox does not allow it"
            raise BackendError(f"{label} cannot move to {target}: {reason}", transient=False)
        resources = check.get("local_resources")
        if isinstance(resources, list) and resources:
            raise BackendError(
                f"{label} uses local resources ({', '.join(map(str, resources))}): it cannot move",
                transient=False,
            )

    def _start_ha(self, move: Move, known: _Known) -> Handle:
        vmid, target = move.guest, move.target
        sid = f"{'vm' if known.kind == 'qemu' else 'ct'}:{vmid}"
        action = "migrate" if known.kind == "qemu" else "relocate"
        since = int(time.time())
        answer = self._client.post(f"cluster/ha/resources/{sid}/{action}", node=target)
        if isinstance(answer, dict):
            blocking = answer.get("blocking-resources")
            if isinstance(blocking, list) and blocking:
                names = [
                    f"{b.get('sid')} ({b.get('cause')})" if isinstance(b, dict) else str(b)
                    for b in blocking
                ]
                raise BackendError(
                    f"the HA manager will not {action} {sid} to {target}: blocked by "
                    f"{', '.join(names)}",
                    transient=False,
                )
            comigrated = answer.get("comigrated-resources")
            if isinstance(comigrated, list) and comigrated:
                log.warning(
                    "the HA manager moves %s along with %s (positive affinity)",
                    ", ".join(map(str, comigrated)),
                    sid,
                )
        log.info("asked the HA manager to %s %s from %s to %s", action, sid, move.source, target)
        return Handle(f"ha:{sid}:{move.source}:{target}:{since}", move, time.time())

    def poll(self, handle: Handle) -> Progress:
        with self._only_backend_errors(f"cannot follow {handle.id}"):
            if handle.id.startswith("ha:"):
                return self._poll_ha(handle.id, handle.id)
            return self._poll_task(self._resolved.get(handle.id, handle.id), handle)

    def _poll_task(self, upid: str, handle: Handle | None) -> Progress:
        task = _parse_upid(upid)
        if task is None:
            raise BackendError(f"not a Proxmox task id: {upid!r}", transient=False)
        path = f"nodes/{task.node}/tasks/{upid}"
        try:
            status = _dict(self._get(f"{path}/status"), f"/nodes/{task.node}/tasks/…/status")
        except _HttpError as exc:
            lowered = exc.message.lower()
            if "no such task" in lowered or "unable to parse worker upid" in lowered:
                return failed(f"task {task.type} on {task.node} is gone: {exc.message}")
            raise
        if status.get("status") == "running":
            return RUNNING
        exitstatus = str(status.get("exitstatus") or "unknown").strip()
        if task.type == "hamigrate" and handle is not None and upid == handle.id:
            # A plain migration request for a guest that the HA stack manages: the HA manager
            # starts the real migration later, as for a request to the HA stack.
            if exitstatus != "OK":
                return failed(f"the HA manager refused the migration: {exitstatus}")
            known = self._known.get(task.id)
            kind = "ct" if known is not None and known.kind == "lxc" else "vm"
            ha_id = f"ha:{kind}:{task.id}:{task.node}:{handle.move.target}:{task.starttime}"
            return self._poll_ha(ha_id, handle.id)
        if exitstatus == "OK" or exitstatus.startswith("WARNINGS"):
            return DONE
        return failed(
            f"{task.type} task on {task.node} failed: {self._task_error(path, exitstatus)}"
        )

    def _task_error(self, path: str, exitstatus: str) -> str:
        """The task's exit status, with the first error line of its log when it says more."""
        try:
            lines = _list(self._get(f"{path}/log", start=0, limit=100000), "task log")
        except BackendError:
            return _clip(exitstatus)
        texts = [str(line.get("t", "")).strip() for line in lines]
        errors = [t for t in texts if "error" in t.lower() and not t.startswith("TASK ERROR:")]
        if not errors:
            return _clip(exitstatus)
        detail = re.sub(r"^(\S+ \S+ )?ERROR:\s*", "", errors[0])
        return _clip(detail if exitstatus in detail else f"{exitstatus} ({detail})")

    def _poll_ha(self, handle_id: str, key: str) -> Progress:
        """A migration asked of the HA stack: the task it started, else the HA manager's view.

        ``key`` is the handle's id, under which the task found is remembered.
        """
        upid = self._resolved.get(key)
        if upid is not None:
            return self._poll_task(upid, None)
        parts = handle_id.split(":")
        if len(parts) != 6 or not parts[2].isdigit():
            raise BackendError(f"not an opendrs HA handle: {handle_id!r}", transient=False)
        _, kind, vmid, source, target, since_text = parts
        sid = f"{kind}:{vmid}"
        since = _int(since_text)
        task = self._migration_task(source, vmid, "qemu" if kind == "vm" else "lxc", since)
        if task is not None:
            upid = task[0]
            self._remember(key, upid)
            log.info("%s: the HA manager's migration task is %s", sid, upid)
            return self._poll_task(upid, None)
        status = _dict(
            self._get("cluster/ha/status/manager_status"), "/cluster/ha/status/manager_status"
        )
        manager = status.get("manager_status")
        services = manager.get("service_status") if isinstance(manager, dict) else None
        service = services.get(sid) if isinstance(services, dict) else None
        if not isinstance(service, dict):
            return failed(f"{sid} is not HA-managed any more")
        state = service.get("state")
        if state in ("migrate", "relocate"):
            return RUNNING
        if state == "error":
            return failed(f"the HA manager put {sid} in the error state")
        if target and service.get("node") == target:
            return DONE
        if time.time() - since > _HA_START_GRACE:
            return failed(
                f"the HA manager did not start moving {sid} to {target or 'its target'} "
                f"within {_HA_START_GRACE:g}s (see 'ha-manager status')"
            )
        return RUNNING

    def _migration_task(
        self, source: str, vmid: str, kind: Literal["qemu", "lxc"], since: float
    ) -> tuple[str, int] | None:
        """The first migration task of ``vmid`` on ``source`` started at ``since`` or later (with
        some clock slack) that nothing follows yet: its UPID and start time."""
        task_type = "qmigrate" if kind == "qemu" else "vzmigrate"
        tasks = _list(
            self._get(
                f"nodes/{source}/tasks",
                vmid=vmid,
                typefilter=task_type,
                source="all",
                since=max(0, int(since) - _CLOCK_SLACK),
                limit=50,
            ),
            f"/nodes/{source}/tasks",
        )
        found = sorted(
            (
                (t["upid"], _int(t.get("starttime")))
                for t in tasks
                if t.get("type") == task_type
                and str(t.get("id")) == vmid
                and isinstance(t.get("upid"), str)
                and _int(t.get("starttime")) >= int(since) - _CLOCK_SLACK
                and t["upid"] not in self._followed
            ),
            key=lambda found: found[1],
        )
        return found[0] if found else None

    def find_migration(self, move: Move, since: float) -> Handle | None:
        """The migration task of ``move`` on its source node started at ``since`` or later (a
        request whose answer was lost; for an HA-managed guest, the HA manager's task)."""
        with self._only_backend_errors(f"cannot look for the migration of {move.guest}"):
            if not move.guest.isdigit():
                return None
            known = self._locate(move.guest)
            task = self._migration_task(move.source, move.guest, known.kind, since)
            if task is None:
                return None
            upid, started = task
            self._remember(upid)
            log.info("the migration of guest %s to %s is task %s", move.guest, move.target, upid)
            return Handle(upid, move, float(started))

    def cancel(self, handle: Handle) -> bool:
        """Stop the migration's task (``DELETE /nodes/{node}/tasks/{upid}``).

        False when there is no task to stop: a request to the HA stack whose task the HA manager
        has not started yet (the HA stack has no way to take a request back), or a task the node
        does not know. The owner of a task may stop it; the HA manager's tasks belong to
        ``root@pam``, and stopping them takes ``Sys.Modify`` on the node.
        """
        with self._only_backend_errors(f"cannot stop {handle.id}"):
            return self._cancel(handle)

    def _cancel(self, handle: Handle) -> bool:
        upid = self._resolved.get(handle.id)
        if upid is None:
            own = None if handle.id.startswith("ha:") else _parse_upid(handle.id)
            if own is not None and own.type != "hamigrate":
                upid = handle.id
            else:
                # A request to the HA stack: its migration task, if the HA manager started it.
                self.poll(handle)
                upid = self._resolved.get(handle.id)
                if upid is None:
                    log.info("%s: no task to stop yet (the HA stack cannot cancel)", handle.id)
                    return False
        task = _parse_upid(upid)
        if task is None:
            raise BackendError(f"not a Proxmox task id: {upid!r}", transient=False)
        try:
            self._client.delete(f"nodes/{task.node}/tasks/{upid}")
        except _HttpError as exc:
            lowered = exc.message.lower()
            if "no such task" in lowered or "unable to parse worker upid" in lowered:
                log.info("task %s on %s is unknown there: nothing to stop", task.type, task.node)
                return False
            raise
        move = handle.move
        log.info(
            "asked %s to stop the %s task of guest %s (%s to %s): %s",
            task.node,
            task.type,
            move.guest,
            move.source,
            move.target,
            upid,
        )
        return True

    def set_maintenance(self, node: str, enabled: bool) -> None:
        # Proxmox VE (up to 9.0) has no API call for HA node maintenance: only the CLI does it.
        action = "enable" if enabled else "disable"
        raise BackendError(
            "not supported: the Proxmox VE API has no call for HA node maintenance; run "
            f"'ha-manager crm-command node-maintenance {action} {node}' on a cluster node",
            transient=False,
        )

    def close(self) -> None:
        self._client.close()
