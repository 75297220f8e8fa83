"""A guest that does not exist yet, from its sizes as text: what ``opendrs place --new`` and the
daemon's ``POST /api/place`` take (``cpu``, ``memory`` with its unit, …).

A size without a unit is refused: Proxmox writes memory in MiB, a snapshot in bytes, so a bare
``memory=4096`` means either."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from opendrs.model.cluster import GUEST_KINDS, Guest
from opendrs.model.document import MAX_NAME, closest
from opendrs.model.snapshot import MAX_BYTES, MAX_CORES
from opendrs.model.units import UnitError, parse_bytes

__all__ = ["NEW_GUEST_KEYS", "NewGuestError", "new_guest"]

#: The keys a new guest takes.
NEW_GUEST_KEYS: Final = frozenset(
    {"cpu", "memory", "kind", "arch", "name", "id", "cpu_used", "memory_used", "priority"}
)


class NewGuestError(ValueError):
    """A new guest's field is wrong; ``str()`` is one line, without the field's source."""


def new_guest(fields: Mapping[str, str]) -> Guest:
    """The guest ``fields`` describe (``memory`` required), on no node yet."""
    unknown = sorted(set(fields) - NEW_GUEST_KEYS)
    if unknown:
        meant = closest(unknown[0], sorted(NEW_GUEST_KEYS))
        hint = (
            f"did you mean {meant!r}?" if meant else f"known: {', '.join(sorted(NEW_GUEST_KEYS))}"
        )
        raise NewGuestError(f"unknown key {unknown[0]!r} ({hint})")
    if "memory" not in fields:
        raise NewGuestError("memory is required (example: cpu=4,memory=8GiB)")
    cpu = _number(fields, "cpu", "1")
    if not 0 < cpu <= 100_000:
        raise NewGuestError("cpu: must be a positive number of vCPUs, at most 100000")
    memory = _size(fields, "memory") or 0
    if memory <= 0:
        raise NewGuestError("memory: must be greater than 0")
    cpu_used = _number(fields, "cpu_used", "0") if "cpu_used" in fields else None
    if cpu_used is not None and cpu_used > MAX_CORES:
        raise NewGuestError(f"cpu_used: must be at most {MAX_CORES} cores")
    priority = fields.get("priority", "2")
    if priority not in ("1", "2", "3"):
        raise NewGuestError("priority: must be 1, 2 or 3")
    kind = fields.get("kind", "vm")
    if kind not in GUEST_KINDS:
        raise NewGuestError(f"kind must be one of {', '.join(GUEST_KINDS)}")
    return Guest(
        id=_text(fields, "id") or "new",
        node="",
        kind=kind,  # type: ignore[arg-type]
        name=_text(fields, "name") or "",
        cpu=cpu,
        memory=memory,
        cpu_used=cpu_used,
        memory_used=_size(fields, "memory_used"),
        arch=_text(fields, "arch"),
        priority=int(priority),
    )


def _text(fields: Mapping[str, str], key: str) -> str | None:
    """A name's text as a snapshot takes it: not blank, printable, no blanks around it (an
    empty ``arch=`` would otherwise be an architecture no node has)."""
    text = fields.get(key)
    if text is None:
        return None
    if not text.strip():
        raise NewGuestError(f"{key}: must not be empty")
    if not text.isprintable() or text != text.strip():
        raise NewGuestError(f"{key}: must be printable, without blanks around it, got {text!r}")
    if len(text) > MAX_NAME:
        raise NewGuestError(f"{key}: must be at most {MAX_NAME} characters, got {len(text)}")
    return text


def _number(fields: Mapping[str, str], key: str, default: str) -> float:
    text = fields.get(key, default)
    try:
        value = float(text)
    except ValueError:
        raise NewGuestError(f"{key}: {text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise NewGuestError(f"{key}: must be a finite number ≥ 0")
    return value


def _size(fields: Mapping[str, str], key: str) -> int | None:
    if key not in fields:
        return None
    _refuse_bare_size(key, fields[key])
    try:
        value = parse_bytes(fields[key])
    except UnitError as exc:
        raise NewGuestError(f"{key}: {exc}") from None
    if value > MAX_BYTES:
        raise NewGuestError(f"{key}: size too large (at most 8 PiB)")
    return value


def _refuse_bare_size(key: str, text: str) -> None:
    """A size without a unit is refused; the hint names both readings' spellings."""
    try:
        number = float(text)
    except ValueError:
        return  # a unit, or not a size: parse_bytes says which
    if not math.isfinite(number):
        return
    larger = f"{number / 1024:g}G" if number >= 1024 else "8G"
    raise NewGuestError(
        f"{key}={text}: give a unit, e.g. {number:g}M or {larger} ({number:g}B for bytes)"
    )
