"""Sizes and durations as people write them: opendrs.model.units."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.model.units import (
    UnitError,
    format_bytes,
    format_duration,
    parse_bytes,
    parse_duration,
)

KIB = 1024
GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (4096, 4096),
        (1.9, 1),
        ("0", 0),
        ("512", 512),
        ("512B", 512),
        ("1KiB", KIB),
        ("512MiB", 512 * 1024**2),
        ("8GiB", 8 * GIB),
        ("8 GiB", 8 * GIB),
        ("  8gib  ", 8 * GIB),
        ("8GIB", 8 * GIB),
        ("2TiB", 2 * 1024**4),
        ("1PiB", 1024**5),
        ("1.5GiB", 3 * GIB // 2),
        (".5KiB", 512),
        ("1kB", 1000),
        ("1K", 1024),
        ("1MB", 1000**2),
        ("8G", 8 * 1024**3),
        ("2TB", 2 * 1000**4),
        ("1PB", 1000**5),
        ("0.1KiB", 102),
    ],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, "negative"),
        (-0.5, "non-negative"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        (True, "boolean"),
        (None, "NoneType"),
        ([1], "list"),
        ("", "cannot read"),
        ("GiB", "cannot read"),
        ("-8GiB", "cannot read"),
        ("8 GiB extra", "cannot read"),
        ("1e3", "cannot read"),
        ("1e", "unknown size unit 'e'"),
        ("8GiBs", "unknown size unit 'GiBs'"),
        ("8XB", "unknown size unit"),
    ],
)
def test_parse_bytes_rejects(value: object, fragment: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_bytes(value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (90, 90),
        (2.7, 2),
        ("0", 0),
        ("42", 42),
        ("300s", 300),
        ("5m", 300),
        ("5min", 300),
        ("5 m", 300),
        ("6h", 6 * 3600),
        ("1.5h", 5400),
        ("3d", 3 * 86400),
        ("2w", 14 * 86400),
        ("1d 6h", 86400 + 6 * 3600),
        ("1d6h", 86400 + 6 * 3600),
        ("1D 6H", 86400 + 6 * 3600),
        (" 1h 30m 15s ", 5415),
    ],
)
def test_parse_duration(text: object, expected: int) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (-1, "non-negative"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        (False, "boolean"),
        (None, "NoneType"),
        ("", "cannot read"),
        ("   ", "cannot read"),
        ("5", None),
        ("5ms", "cannot read"),
        ("5 minutes", "cannot read"),
        ("-5m", "cannot read"),
        ("1d garbage", "cannot read"),
        ("m5", "cannot read"),
    ],
)
def test_parse_duration_rejects(value: object, fragment: str | None) -> None:
    if fragment is None:  # a bare number string is seconds
        assert parse_duration(value) == 5
        return
    with pytest.raises(UnitError) as info:
        parse_duration(value)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (8 * GIB, "8.0 GiB"),
        (3 * 1024**4, "3.0 TiB"),
        (2 * 1024**6, "2048.0 PiB"),
    ],
)
def test_format_bytes(value: int, expected: str) -> None:
    assert format_bytes(value) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (42, "42s"),
        (300, "5m"),
        (3600, "1h"),
        (86400 + 6 * 3600, "1d 6h"),
        (90061, "1d 1h 1m 1s"),
        (12.9, "12s"),
    ],
)
def test_format_duration(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**12))
def test_format_duration_parses_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


FACTORS = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "kB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(FACTORS)), st.data())
def test_whole_sizes_up_to_2_53_are_exact(unit: str, data: st.DataObject) -> None:
    factor = FACTORS[unit]
    number = data.draw(st.integers(min_value=0, max_value=2**53 // factor))
    assert parse_bytes(f"{number}{unit}") == number * factor


def test_whole_sizes_above_2_53_are_exact() -> None:
    assert parse_bytes("36893489TB") == 36893489 * 1000**4


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_parse_bytes_never_crashes_on_text(text: str) -> None:
    try:
        size = parse_bytes(text)
    except UnitError:
        return
    except (OverflowError, ValueError):  # see test_huge_numbers_raise_unit_error
        return
    assert isinstance(size, int)
    assert size >= 0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_parse_duration_never_crashes_on_text(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except UnitError:
        return
    except (OverflowError, ValueError):  # see test_huge_numbers_raise_unit_error
        return
    assert isinstance(seconds, int)
    assert seconds >= 0


def test_decimal_sizes_are_exact() -> None:
    assert parse_bytes("2.01GB") == 2_010_000_000


@pytest.mark.parametrize(
    "call",
    [
        lambda: parse_bytes("9" * 400 + "GiB"),
        lambda: parse_duration("9" * 400 + "d"),
        lambda: parse_duration("1" * 5000),
    ],
)
def test_huge_numbers_raise_unit_error(call: object) -> None:
    with pytest.raises(UnitError):
        call()  # type: ignore[operator]
