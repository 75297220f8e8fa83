"""Data written as JSON: every command's ``--format json`` goes through :func:`json_text`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["finite", "iso_time", "json_text"]


def finite(data: Any) -> Any:
    """``data`` with every float that is not finite (``inf``, ``nan``) replaced by ``None``:
    JSON has no such numbers, and a figure without a value is written ``null``."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        return {key: finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [finite(value) for value in data]
    return data


def json_text(data: Any, *, sort_keys: bool = True) -> str:
    """``data`` as indented JSON text with a final newline, never ``NaN`` or ``Infinity``."""
    return (
        json.dumps(finite(data), indent=2, sort_keys=sort_keys, allow_nan=False, default=str) + "\n"
    )


def iso_time(at: float) -> str:
    """``at`` (seconds since the epoch) in ISO 8601, UTC, to the second:
    ``2025-11-26T16:00:00Z``; empty for a time no calendar holds."""
    if not math.isfinite(at):
        return ""
    try:
        moment = datetime.fromtimestamp(at, UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
