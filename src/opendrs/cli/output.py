"""How the snapshot commands write: JSON on standard output (never ``inf`` or ``nan``), rich
text on a console, and their ``--format`` option."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from opendrs.json_data import json_text

__all__ = ["add_format_option", "add_verbose_option", "dump_json", "new_console"]


def dump_json(data: Any) -> None:
    """``data`` as JSON on standard output."""
    sys.stdout.write(json_text(data))


def new_console() -> Console:
    """The console rich text is written on: standard output, no highlighting, no wrapping, and
    no emoji (a name with ``:fire:`` in it is written as it is)."""
    return Console(highlight=False, soft_wrap=False, emoji=False)


def add_format_option(p: argparse.ArgumentParser) -> None:
    """``--format text|json`` (default text)."""
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="output format (default text)",
    )


def add_verbose_option(p: argparse.ArgumentParser, extra: str = "") -> None:
    """``-v/--verbose``: the engine's figures beside the words of the text output."""
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="text output: the engine's figures too (metric, score, cost units, full imbalance)"
        + extra,
    )
