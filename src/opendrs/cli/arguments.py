"""The argparse value types of the commands' options: numbers, whole numbers, shares (a
fraction or a percentage), seconds; and a guest given by name or id."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Protocol

from opendrs.cli.process import UsageError
from opendrs.model.cluster import guest_label
from opendrs.model.units import UnitError, parse_fraction

__all__ = [
    "Subcommands",
    "at_least_one",
    "guest_by_name_or_id",
    "non_negative",
    "number_or_percentage",
    "parse_number",
    "positive_seconds",
    "share",
    "simulated_days",
    "whole_number",
]


class Subcommands(Protocol):
    """What a command module adds its parser to: the ``opendrs`` parser's subcommands (what
    :meth:`argparse.ArgumentParser.add_subparsers` returns)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def parse_number(text: str) -> float:
    """An argparse number: a clear message for what is not one."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def whole_number(text: str) -> int:
    """A whole number ≥ 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def at_least_one(text: str) -> int:
    """A whole number ≥ 1."""
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds > 0."""
    value = non_negative(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def non_negative(text: str) -> float:
    """A finite number ≥ 0."""
    value = parse_number(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be a finite number ≥ 0")
    return value


def number_or_percentage(text: str) -> float | str:
    """A finite number ≥ 0, or a percentage as written (``"15%"``), for the option it is given
    to to read (a share as a fraction: :func:`opendrs.model.units.parse_fraction`)."""
    if text.strip().endswith("%"):
        return text.strip()
    return non_negative(text)


def share(text: str) -> float:
    """A share of a whole: a fraction from 0 to 1 (``0.15``) or a percentage (``15%``); a bare
    number above 1 is refused with the percentage it probably meant."""
    try:
        return parse_fraction(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def simulated_days(text: str) -> float:
    """A number of simulated days: more than 0, at most 3660 (ten years)."""
    value = parse_number(text)
    if not 0 < value <= 3660:
        raise argparse.ArgumentTypeError("must be more than 0 and at most 3660")
    return value


def guest_by_name_or_id(text: str, names: Mapping[str, str], option: str, where: str) -> str:
    """The id of the guest ``text`` names, an id or a name (``names``: each id's name) — as
    ``--guest`` takes it. None there, or a name several guests have, is a usage error."""
    if text in names:
        return text
    matches = sorted(gid for gid, name in names.items() if name == text)
    if len(matches) == 1:
        return matches[0]
    if matches:
        listed = ", ".join(guest_label(gid, names[gid]) for gid in matches)
        raise UsageError(
            f"{option}: {len(matches)} guests are named {text!r} ({listed}): give an id"
        )
    raise UsageError(f"{option}: no guest {text!r} (by id or name) in {where}")
