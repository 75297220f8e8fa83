"""Reading a guest of the commonest shape without building a path per field.

A snapshot of a large cluster holds a hundred thousand guests, nearly all of them an ``id``, a
``node``, a ``memory`` size, and perhaps ``cpu``, ``usage``, ``uptime``, ``disks`` and ``tags``,
every value well formed. :func:`quick_guest` builds such a guest with the checks of
:class:`~opendrs.model.snapshot.read_guests.GuestReader` and none of its bookkeeping; for any
other guest, or any value those checks would refuse, it gives ``None``, and the full reading
then builds the guest or words the problem, exactly as it always did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from opendrs.model.cluster import Disk, Guest, Node
from opendrs.model.document import (
    MAX_BYTES,
    MAX_ID,
    MAX_NAME,
    MAX_SECONDS,
    bare_memory,
    sound_mapping,
)
from opendrs.model.snapshot.schema import MAX_CORES
from opendrs.model.units import UnitError, parse_bytes, parse_duration

#: The keys of a guest :func:`quick_guest` reads; a guest with any other is read in full.
QUICK_KEYS: Final = frozenset({"id", "node", "cpu", "memory", "usage", "uptime", "disks", "tags"})
_USAGE_KEYS: Final = frozenset({"cpu", "memory"})
_DISK_KEYS: Final = frozenset({"pool", "size"})


def quick_guest(value: object, nodes: Mapping[str, Node], shared: frozenset[str]) -> Guest | None:
    """The guest ``value`` describes, when it has the common shape and every value is sound;
    else ``None``."""
    if not sound_mapping(value) or not value.keys() <= QUICK_KEYS:  # type: ignore[attr-defined]
        return None
    mapping: Mapping[str, Any] = value  # type: ignore[assignment]
    guest_id = _name(mapping.get("id"))
    node = mapping.get("node")
    memory = _size(mapping.get("memory"))
    if guest_id is None or type(node) is not str or node not in nodes or not memory:
        return None
    if bare_memory(mapping["memory"]) is not None:
        return None
    fields: dict[str, Any] = {"id": guest_id, "node": node, "memory": memory, "ha": False}
    if "cpu" in mapping:
        cpu = _cores(mapping["cpu"])
        if not cpu:
            return None
        fields["cpu"] = cpu
    if "usage" in mapping and not _quick_usage(mapping["usage"], fields):
        return None
    if "uptime" in mapping:
        fields["uptime"] = _duration(mapping["uptime"])
        if fields["uptime"] is None:
            return None
    if "disks" in mapping:
        fields["disks"] = _disks(mapping["disks"], shared)
        if fields["disks"] is None:
            return None
    if "tags" in mapping:
        fields["tags"] = _texts(mapping["tags"])
        if fields["tags"] is None:
            return None
    return Guest(**fields)


def _quick_usage(value: object, fields: dict[str, Any]) -> bool:
    """Put a sound ``usage`` mapping's cpu and memory in ``fields``; whether it was sound."""
    if not sound_mapping(value) or not value.keys() <= _USAGE_KEYS:  # type: ignore[attr-defined]
        return False
    usage: Mapping[str, Any] = value  # type: ignore[assignment]
    cpu, memory = usage.get("cpu"), usage.get("memory")
    if cpu is not None:
        cpu = _cores(cpu, positive=False)
        if cpu is None:
            return False
    if memory is not None:
        memory = _size(memory)
        if memory is None:
            return False
    fields["cpu_used"] = cpu
    fields["memory_used"] = memory
    return True


def _name(value: object) -> str | None:
    """A guest id as :meth:`~opendrs.model.document.Reader.plain_name` takes it (a number or a
    name without surrounding blanks)."""
    kind = type(value)
    if kind is int:
        return str(value) if 0 <= value <= MAX_ID else None  # type: ignore[operator]
    if kind is str and value and value.strip() == value and value.isprintable():  # type: ignore[union-attr]
        return value if len(value) <= MAX_NAME else None  # type: ignore[arg-type, return-value]
    return None


def _cores(value: object, *, positive: bool = True) -> float | None:
    """A number of cores within the snapshot's range (above 0 when ``positive``)."""
    kind = type(value)
    if kind is not int and kind is not float:
        return None
    if not (0 <= value <= MAX_CORES) or (positive and not value > 0):  # type: ignore[operator]
        return None
    return float(value)  # type: ignore[arg-type]


def _size(value: object) -> int | None:
    """A size in bytes, at most :data:`MAX_BYTES`."""
    kind = type(value)
    if kind is not int and kind is not str and kind is not float:
        return None
    try:
        size = parse_bytes(value)
    except UnitError:
        return None
    return size if size <= MAX_BYTES else None


def _duration(value: object) -> int | None:
    """A duration in seconds, at most :data:`MAX_SECONDS`."""
    kind = type(value)
    if kind is not int and kind is not str and not (kind is float and math.isfinite(value)):  # type: ignore[arg-type]
        return None
    try:
        seconds = parse_duration(value)
    except UnitError:
        return None
    return seconds if 0 <= seconds <= MAX_SECONDS else None


def _disks(value: object, shared: frozenset[str]) -> tuple[Disk, ...] | None:
    """A guest's disks, each a pool name and a size."""
    if type(value) is not list:
        return None
    disks: list[Disk] = []
    for item in value:  # type: ignore[attr-defined]
        if not sound_mapping(item) or item.keys() != _DISK_KEYS:
            return None
        pool, size = item["pool"], _size(item["size"])
        if type(pool) is not str or not pool.strip() or not pool.isprintable() or size is None:
            return None
        disks.append(Disk(pool, size, pool in shared))
    return tuple(disks)


def _texts(value: object) -> tuple[str, ...] | None:
    """A list of printable, non-blank strings."""
    if type(value) is not list:
        return None
    for item in value:  # type: ignore[attr-defined]
        if type(item) is not str or not item.strip() or not item.isprintable():
            return None
    return tuple(value)  # type: ignore[arg-type]
