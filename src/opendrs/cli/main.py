"""The ``opendrs`` command line: its parser, each command's from the module that runs it, and
:func:`main`, which answers bad input with one line and exit status 2, and a bug with one line
and exit status 1."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from opendrs import __version__
from opendrs.cli.cluster_command import add_cluster_parsers
from opendrs.cli.compat_command import add_compat_parsers
from opendrs.cli.demo_command import add_demo_parser
from opendrs.cli.history_command import add_history_parser
from opendrs.cli.maintenance_command import add_maintenance_parser
from opendrs.cli.plan_command import add_plan_parsers
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError
from opendrs.cli.run_command import add_run_parser
from opendrs.cli.simulate_command import add_simulate_parser
from opendrs.cli.snapshot_command import add_snapshot_parser
from opendrs.cli.status_command import add_status_parser
from opendrs.model.document import one_line
from opendrs.model.snapshot import SnapshotError

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opendrs",
        description="An open Distributed Resource Scheduler for Proxmox VE and Incus clusters.",
        epilog="SNAPSHOT is a snapshot file (YAML or JSON; see docs/snapshot-format.md), "
        "or 'demo' for the built-in example cluster.",
    )
    parser.add_argument("--version", action="version", version=f"opendrs {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error (a bug), print its traceback as well",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    add_cluster_parsers(sub)
    add_plan_parsers(sub)
    add_run_parser(sub)
    add_status_parser(sub)
    add_history_parser(sub)
    add_snapshot_parser(sub)
    add_maintenance_parser(sub)
    add_simulate_parser(sub)
    add_demo_parser(sub)

    add_compat_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SnapshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # not bad input: a bug, said as such (exit 1, not 2)
        return _internal_error(exc, verbose=args.debug or getattr(args, "verbose", False))


def _internal_error(exc: Exception, *, verbose: bool) -> int:
    """One line for an exception no input explains (``--debug``: its traceback first)."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    detail = one_line(" ".join(str(exc).split()))
    what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    hint = "" if verbose else " (opendrs --debug … shows the traceback)"
    print(
        f"error: internal error (a bug in opendrs, please report it): {what}{hint}",
        file=sys.stderr,
    )
    return EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())
