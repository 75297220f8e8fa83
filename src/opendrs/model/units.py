"""Parsing and formatting of sizes and durations, as people write them in snapshot files."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

_BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    # Single letters are binary, as Proxmox and QEMU write them (``size=32G`` is 32 GiB).
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "p": 1024**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

_DURATION_UNITS: dict[str, int] = {
    "s": 1,
    "m": 60,
    "min": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
}
_DURATION_TERM = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(s|min|m|h|d|w)", re.IGNORECASE)


class UnitError(ValueError):
    """A size or duration that cannot be understood."""


def _shown(value: object) -> str:
    """A value for a message, kept short: a long text is cut, a huge number not written out."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return "a very large number"
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:39] + "…"


def parse_bytes(value: object) -> int:
    """Return a byte count from an int/float (bytes) or a string such as ``8GiB`` or ``1.5 TB``.

    Binary units (KiB, MiB, GiB, TiB, PiB, and the single letters K, M, G, T, P as Proxmox writes
    them) are powers of 1024; SI units (kB, MB, GB, TB, PB) powers of 1000. A bare number is
    bytes. The arithmetic is exact (decimal), and the result is rounded down to a whole byte.
    """
    if isinstance(value, bool):
        raise UnitError("expected a size such as 8GiB or a number of bytes, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"size must not be negative, got {_shown(value)}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise UnitError(f"size must be a finite non-negative number, got {_shown(value)}")
        return int(value)
    if isinstance(value, str):
        return _bytes_from_text(value)
    raise UnitError(
        f"expected a size such as 8GiB or a number of bytes, got {type(value).__name__}"
    )


@lru_cache(maxsize=4096)
def _bytes_from_text(value: str) -> int:
    """:func:`parse_bytes` of a string (a snapshot repeats a few sizes many times)."""
    match = _SIZE_RE.match(value)
    if not match:
        raise UnitError(f"cannot read {_shown(value)} as a size (examples: 512MiB, 8GiB, 2TB)")
    number, unit = match.groups()
    factor = _BYTE_UNITS.get(unit.lower())
    if factor is None:
        raise UnitError(
            f"unknown size unit {_shown(unit)} in {_shown(value)} "
            "(use B, KiB, MiB, GiB, TiB or K, M, G, T; kB, MB, GB, TB)"
        )
    if len(number.replace(".", "")) > 30:
        raise UnitError(f"size too large: {value[:24]!r}…")
    try:
        return int(Decimal(number) * factor)
    except (InvalidOperation, OverflowError, ValueError):
        raise UnitError(f"cannot read {_shown(value)} as a size") from None


def parse_duration(value: object) -> int:
    """Return seconds from a number (seconds) or a string: ``300s``, ``5m``, ``6h``, ``1d 6h``."""
    if isinstance(value, bool):
        raise UnitError("expected a duration such as 5m or a number of seconds, got a boolean")
    if isinstance(value, int):  # of any size: math.isfinite() would overflow on a huge one
        if value < 0:
            raise UnitError(f"duration must be a finite non-negative number, got {_shown(value)}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise UnitError(f"duration must be a finite non-negative number, got {_shown(value)}")
        return int(value)
    if isinstance(value, str):
        return _duration_from_text(value)
    raise UnitError(
        f"expected a duration such as 5m or a number of seconds, got {type(value).__name__}"
    )


@lru_cache(maxsize=4096)
def _duration_from_text(value: str) -> int:
    """:func:`parse_duration` of a string (a snapshot repeats a few durations many times)."""
    text = value.strip()
    if len(text) > 100:
        raise UnitError(f"duration too long: {value[:24]!r}…")
    if re.fullmatch(r"[0-9]+", text):
        return int(text)
    pos = 0
    total = Decimal(0)
    seen = False
    for match in _DURATION_TERM.finditer(text):
        if text[pos : match.start()].strip():
            break
        total += Decimal(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
        pos = match.end()
        seen = True
    if not seen or text[pos:].strip():
        raise UnitError(
            f"cannot read {_shown(value)} as a duration (examples: 300s, 5m, 6h, 1d 6h)"
        )
    return int(total)


def format_bytes(value: float) -> str:
    """Human-readable binary size: ``8.0 GiB``."""
    size = float(value)
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    index = 0
    while abs(size) >= 1024 and index < len(units) - 1:
        size /= 1024
        index += 1
    return f"{size:.0f} B" if index == 0 else f"{size:.1f} {units[index]}"


def format_duration(seconds: float) -> str:
    """Compact duration: ``1d 6h``, ``5m``, ``42s``."""
    secs = int(seconds)
    if secs == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if secs >= size:
            parts.append(f"{secs // size}{unit}")
            secs %= size
    return " ".join(parts)


class Share(float):
    """A share already read as a fraction by :func:`parse_fraction`: read again (a strategy's
    options are read by the command line or the policy, then by the strategy), it is taken as
    it is — ``150%`` read once is 1.5, which written bare would be refused."""

    __slots__ = ()


def parse_fraction(value: object, maximum: float = 1.0) -> float:
    """A share written as a fraction (``0.15``) or a percentage (``15%``, ``"15 %"``): the
    fraction, from 0 to ``maximum`` (a percentage may say more than 100 % when ``maximum`` is
    above 1; a bare number never more than 1).

    A bare number above 1 is refused with the percentage it probably meant — ``15`` is 1500 %,
    not 15 % —, so that a threshold written in percent never silently stops acting."""
    if isinstance(value, Share):
        if value > maximum:
            raise UnitError(f"must not be more than {maximum * 100:g}%, got {value * 100:g}%")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            return _percentage(value, text[:-1].strip(), maximum)
        try:
            value = float(text)
        except ValueError:
            raise UnitError(
                f"cannot read {_shown(value)} as a fraction or a percentage (examples: 0.15, 15%)"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnitError(
            f"expected a fraction such as 0.15 or a percentage such as 15%, got {_shown(value)}"
        )
    if value < 0 or value > 1e6 or not math.isfinite(value):  # no share is a million times
        raise UnitError(f"must be a fraction from 0 to 1 or a percentage, got {_shown(value)}")
    if 1 < value < 2:  # no percentage is likelier than another: 1.5 % or 150 %
        raise UnitError(
            f"{value:g} is more than 1 (100 %): write a fraction from 0 to 1, or a percentage "
            "such as 15%"
        )
    if value > 1:
        raise UnitError(
            f"{value:g} as a fraction is {value * 100:g} %: did you mean {value:g} %? "
            f"(write {value:g}% or {value / 100:g})"
        )
    if value > maximum:
        raise UnitError(f"must not be more than {maximum:g} ({maximum * 100:g}%), got {value:g}")
    return Share(value)


def _percentage(value: str, number: str, maximum: float) -> float:
    """:func:`parse_fraction` of a text ending in ``%`` (``number`` is what precedes it)."""
    try:
        percent = float(number)
    except ValueError:
        raise UnitError(f"cannot read {_shown(value)} as a percentage (example: 15%)") from None
    if not math.isfinite(percent) or percent < 0:
        raise UnitError(f"must be a finite percentage ≥ 0, got {_shown(value)}")
    if percent / 100 > maximum:
        raise UnitError(f"must not be more than {maximum * 100:g}%, got {_shown(value)}")
    return Share(percent / 100)
