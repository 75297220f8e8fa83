"""Data written as JSON: every command's ``--format json`` goes through :func:`json_text`."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Final

__all__ = ["finite", "iso_time", "json_text"]

#: Spaces per level of :func:`json_text`'s indentation.
INDENT: Final = 2
#: Values written as they are: a container holding only these (floats finite) is flat.
_PLAIN: Final = frozenset({str, int, bool, type(None)})


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
    """``data`` as indented JSON text with a final newline, never ``NaN`` or ``Infinity``.

    The text ``json.dumps(finite(data), indent=2, sort_keys=sort_keys, allow_nan=False,
    default=str)`` gives, written faster: a list or mapping of plain values (a plan's move, say)
    in one call of the C encoder, whose separators carry the line breaks and indentation."""
    chunks: list[str] = []
    _write(data, 0, sort_keys, chunks)
    chunks.append("\n")
    return "".join(chunks)


@lru_cache(maxsize=64)
def _encoder(level: int, sort_keys: bool) -> json.JSONEncoder:
    """The C encoder that writes a flat container's members at ``level`` of indentation."""
    return json.JSONEncoder(
        sort_keys=sort_keys,
        allow_nan=False,
        default=str,
        separators=(",\n" + " " * (INDENT * level), ": "),
    )


def _is_flat(values: Any) -> bool:
    """Whether every value is a plain one (a float: a finite one)."""
    plain = _PLAIN
    for value in values:
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                return False
        elif kind not in plain:
            return False
    return True


def _write(data: Any, level: int, sort_keys: bool, out: list[str]) -> None:
    """Append ``data`` at ``level`` of indentation to ``out``, as :func:`json_text` writes it."""
    if isinstance(data, float):
        data = data if math.isfinite(data) else None
    if isinstance(data, Mapping):
        if not isinstance(data, dict):
            data = dict(data)
        flat = _is_flat(data.values())
    elif isinstance(data, list | tuple):
        flat = _is_flat(data)
    else:  # a plain value, or one written as its str()
        out.append(_encoder(0, sort_keys).encode(data))
        return
    if not data:
        out.append("{}" if isinstance(data, dict) else "[]")
        return
    inner = "\n" + " " * (INDENT * (level + 1))
    if flat:
        text = _encoder(level + 1, sort_keys).encode(data)
        out.append(f"{text[0]}{inner}{text[1:-1]}\n{' ' * (INDENT * level)}{text[-1]}")
    elif isinstance(data, dict):
        _write_mapping(data, level, sort_keys, out)
    else:
        _write_list(data, level, sort_keys, out)


def _write_list(
    data: list[Any] | tuple[Any, ...], level: int, sort_keys: bool, out: list[str]
) -> None:
    inner = ",\n" + " " * (INDENT * (level + 1))
    out.append("[")
    separator = inner[1:]
    for value in data:
        out.append(separator)
        separator = inner
        _write(value, level + 1, sort_keys, out)
    out.append("\n" + " " * (INDENT * level) + "]")


def _write_mapping(data: dict[Any, Any], level: int, sort_keys: bool, out: list[str]) -> None:
    inner = ",\n" + " " * (INDENT * (level + 1))
    key_encoder = _encoder(0, sort_keys)
    items = sorted(data.items()) if sort_keys else data.items()
    out.append("{")
    separator = inner[1:]
    for key, value in items:
        out.append(separator)
        separator = inner
        out.append(key_encoder.encode({key: None})[1:-7])
        out.append(": ")
        _write(value, level + 1, sort_keys, out)
    out.append("\n" + " " * (INDENT * level) + "}")


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
