"""Readers of the Proxmox API's answers: numbers that come as numbers or strings, lists and
objects checked for their shape, text clipped to fit in a message."""

from __future__ import annotations

import math
from typing import Any

from opendrs.backends.base import BackendError


def as_number(value: object, default: float | None = None) -> float | None:
    """``value`` as a finite number (a number, a bool or a numeric string), else ``default``."""
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


def as_int(value: object, default: int = 0) -> int:
    """``value`` as a whole number (truncated), else ``default``."""
    number = as_number(value)
    return default if number is None else int(number)


def as_bool(value: object) -> bool:
    """A Proxmox flag (``1``, ``"1"``, ``true``…): true when it is a number other than 0."""
    return bool(as_number(value, 0.0))


def as_list(value: object, what: str) -> list[dict[str, Any]]:
    """An answer that must be a list: its objects (other items dropped)."""
    if not isinstance(value, list):
        raise BackendError(f"unexpected answer from the Proxmox API for {what}: not a list")
    return [item for item in value if isinstance(item, dict)]


def as_dict(value: object, what: str) -> dict[str, Any]:
    """An answer that must be an object (none is an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BackendError(f"unexpected answer from the Proxmox API for {what}: not an object")
    return value


def clip(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
