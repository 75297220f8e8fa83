"""Readers of the Incus API's values: ``limits.cpu`` (a count, or a set of CPUs ``0-3,5``),
``limits.memory`` (a size ``2GiB``, ``512MB``, or a percentage ``50%`` of the member's memory),
Incus's durations (``6H``, ``1d 3H``: the format of ``cluster.rebalance.cooldown``), and answers
checked for their shape. Numbers that come as numbers or strings are read as on Proxmox."""

from __future__ import annotations

import datetime
import re
from typing import Any, Final

from opendrs.backends.base import BackendError
from opendrs.backends.proxmox.values import as_int, as_number, clip

__all__ = [
    "as_int",
    "as_number",
    "clip",
    "cpu_limit",
    "flag",
    "incus_duration",
    "memory_limit",
    "object_of",
    "objects_of",
]

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTPE]i?B|[KMGTPE]|B)?", re.IGNORECASE)
_DECIMAL: Final = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_BINARY: Final = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50, "e": 2**60}
_CPU_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_DURATION_TERM = re.compile(r"(\d+)(S|M|H|d|w|m|y)")
#: Seconds of each unit of Incus's durations (a month as 30 days, a year as 365).
_DURATION_UNITS: Final = {
    "S": 1,
    "M": 60,
    "H": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "m": 30 * 86400,
    "y": 365 * 86400,
}


def cpu_limit(value: object) -> tuple[float | None, tuple[int, ...]]:
    """``limits.cpu``: ``(vCPUs, pinned CPUs)``.

    A count (``4``) gives no pinning; a topology (``sockets=2,cores=4,threads=2``, a VM's: each
    part defaults to 1) gives the product of its parts, no pinning; a set (``0-3,5``, or a single
    ``"2,"``-style list) gives the CPUs it pins and their number. ``(None, ())`` when it is unset
    or unreadable. As Incus's ``ResourceUsage`` (``internal/server/instance/instance_utils.go``)
    and ``ParseCPUTopology`` (``shared/validate/validate.go``) read it.
    """
    if value is None:
        return None, ()
    text = str(value).strip()
    if not text:
        return None, ()
    if text.isdigit() and "," not in text:
        count = int(text)
        return (float(count), ()) if count > 0 else (None, ())
    if "=" in text:
        vcpus = _topology(text)
        return (float(vcpus), ()) if vcpus else (None, ())
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        found = _CPU_RANGE.fullmatch(part)
        if found is None:
            return None, ()
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if high < low or high - low > 65536:
            return None, ()
        cpus.update(range(low, high + 1))
    return (float(len(cpus)), tuple(sorted(cpus))) if cpus else (None, ())


def _topology(text: str) -> int | None:
    """The vCPUs of a CPU topology ``sockets=S,cores=C,threads=T`` (each part at most once,
    1 when left out), ``None`` when it is not one."""
    parts = {"sockets": 1, "cores": 1, "threads": 1}
    seen: set[str] = set()
    for chunk in text.split(","):
        if not chunk.strip():
            continue
        key, sep, number = (p.strip() for p in chunk.partition("="))
        if not sep or key not in parts or key in seen or not number.isdigit():
            return None
        seen.add(key)
        parts[key] = int(number)
        if parts[key] < 1:
            return None
    return parts["sockets"] * parts["cores"] * parts["threads"]


def memory_limit(value: object, member_memory: int) -> int | None:
    """``limits.memory`` in bytes: a size (``2GiB``, ``512MB``, ``1073741824``) or a percentage
    of ``member_memory`` (``50%``). ``None`` when unset or unreadable."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    if text.endswith("%"):
        percent = as_number(text[:-1].strip())
        if percent is None or not 0 < percent <= 100 or member_memory <= 0:
            return None
        return int(member_memory * percent / 100)
    found = _SIZE.fullmatch(text)
    if found is None:
        return None
    number = float(found.group(1))
    unit = (found.group(2) or "").lower()
    if unit.endswith("ib"):
        factor = _BINARY[unit[0]]
    elif unit in ("", "b"):
        factor = 1
    else:
        factor = _DECIMAL.get(unit[0], 10**18)
    size = int(number * factor)
    return size if size > 0 else None


def incus_duration(text: str) -> int | None:
    """Seconds of an Incus duration (``6H``, ``1d 3H``: each unit once), ``None`` when it is
    not one. Months count as 30 days and years as 365 (Incus adds calendar months)."""
    terms = text.split()
    if not terms:
        return None
    seen: set[str] = set()
    total = 0
    for term in terms:
        found = _DURATION_TERM.fullmatch(term)
        if found is None or found.group(2) in seen:
            return None
        seen.add(found.group(2))
        total += int(found.group(1)) * _DURATION_UNITS[found.group(2)]
    return total


def timestamp(value: object) -> float | None:
    """Unix seconds of an API time (``2026-11-29T07:01:02.123456789Z``); ``None`` when it is
    not one, or Go's zero time (``0001-01-01…``: never)."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    try:
        at = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=datetime.UTC)
    return at.timestamp()


def flag(value: object) -> bool:
    """An Incus boolean key (``true``, ``1``, ``yes``, ``on``)."""
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def objects_of(value: object, what: str) -> list[dict[str, Any]]:
    """An answer that must be a list: its objects (other items dropped)."""
    if not isinstance(value, list):
        raise BackendError(f"unexpected answer from the Incus API for {what}: not a list")
    return [item for item in value if isinstance(item, dict)]


def object_of(value: object, what: str) -> dict[str, Any]:
    """An answer that must be an object (none is an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BackendError(f"unexpected answer from the Incus API for {what}: not an object")
    return value
