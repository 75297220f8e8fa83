"""The ``opendrs`` command line: its parser, each command's from the module that runs it, and
:func:`main`, which answers bad input with one line and exit status 2, and a bug with one line
and exit status 1."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from opendrs import __version__
from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import resolve_config
from opendrs.cli.process import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    UsageError,
    exit_now,
    internal_error,
    left_computing,
)
from opendrs.model.snapshot import SnapshotError

__all__ = ["COMMANDS", "build_parser", "main"]

#: The modules that add the commands' parsers, each with its function, in ``--help``'s order.
PARSER_MODULES: tuple[tuple[str, str], ...] = (
    ("cluster_command", "add_cluster_parsers"),
    ("plan_command", "add_plan_parsers"),
    ("config_command", "add_init_parser"),
    ("run_command", "add_run_parser"),
    ("status_command", "add_status_parser"),
    ("history_command", "add_history_parser"),
    ("approval_command", "add_approval_parsers"),
    ("snapshot_command", "add_snapshot_parser"),
    ("maintenance_command", "add_maintenance_parser"),
    ("headroom_command", "add_headroom_parser"),
    ("simulate_command", "add_simulate_parser"),
    ("demo_command", "add_demo_parser"),
    ("compat_command", "add_compat_parsers"),
)
#: Each command and the module (of :data:`PARSER_MODULES`) that adds it: a command line naming
#: one imports that module alone (a module imports what its commands need, which is much).
COMMANDS: dict[str, str] = {
    "validate": "cluster_command",
    "show": "cluster_command",
    "place": "cluster_command",
    "plan": "plan_command",
    "report": "plan_command",
    "strategies": "plan_command",
    "init": "config_command",
    "run": "run_command",
    "status": "status_command",
    "history": "history_command",
    "proposals": "approval_command",
    "approve": "approval_command",
    "reject": "approval_command",
    "balance-now": "approval_command",
    "snapshot": "snapshot_command",
    "maintenance": "maintenance_command",
    "headroom": "headroom_command",
    "simulate": "simulate_command",
    "demo": "demo_command",
    "proxlb": "compat_command",
    "pve": "compat_command",
}


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command``'s module's alone (see :data:`COMMANDS`)."""
    parser = _Parser(
        prog="opendrs",
        description="An open Distributed Resource Scheduler for Proxmox VE and Incus clusters.",
        epilog="SNAPSHOT is a snapshot file (YAML or JSON; 'opendrs snapshot' writes one from a "
        "live cluster), or 'demo' for the built-in example cluster. Each command's options: "
        "'opendrs COMMAND --help'; everything, with the file formats: 'man opendrs'.",
    )
    parser.add_argument("--version", action="version", version=f"opendrs {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an internal error (a bug), print its traceback as well",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module, function in PARSER_MODULES:
        if command is None or COMMANDS[command] == module:
            _add_parsers(sub, module, function)
    return parser


def _add_parsers(sub: Subcommands, module: str, function: str) -> None:
    getattr(importlib.import_module(f"opendrs.cli.{module}"), function)(sub)


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, when it is one of :data:`COMMANDS` (the first argument that
    is not an option: ``opendrs``'s own options take no value); None otherwise."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


class WatchedOutput:
    """Standard output as the commands write to it, which keeps the :class:`OSError` that
    writing or flushing it raised (:attr:`error`): that one, and no other, is the output's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            self.error = exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    stdout = sys.stdout
    watched = WatchedOutput(stdout)
    if stdout is not None:  # (None: no standard output at all, nothing to watch)
        sys.stdout = watched  # type: ignore[assignment]
    try:
        status = _run(args, watched)
    except SystemExit as exc:
        if not left_computing():
            raise
        exit_now(_exit_code(exc))
    finally:
        sys.stdout = stdout
    if left_computing():
        # The command is done, its files closed; a request cut at its server's stop still
        # computes an answer that can no longer be sent: not waited for.
        exit_now(status)
    return status


def _exit_code(exc: SystemExit) -> int:
    """The status Python gives a ``SystemExit``: ``None`` 0, a number itself, anything else
    printed on stderr and 1."""
    if exc.code is None:
        return EXIT_OK
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return EXIT_PROBLEM


def _run(args: argparse.Namespace, output: WatchedOutput) -> int:
    """Run the command ``args`` name, writing to ``output``: its exit status, every error one
    line."""
    try:
        resolve_config(args)
        status = int(args.func(args))
        sys.stdout.flush()  # what is left to write fails here, not unseen at the exit
        return status
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
    except OSError as exc:
        if exc is output.error and exc.errno in _OUTPUT_ERRNOS:
            return _output_error(exc)
        if exc.errno in _OUTPUT_ERRNOS:
            return _system_error(exc)
        return internal_error(exc, verbose=args.debug or getattr(args, "verbose", False))
    except Exception as exc:  # not bad input: a bug, said as such (exit 1, not 2)
        return internal_error(exc, verbose=args.debug or getattr(args, "verbose", False))


#: Why a write to the output fails through no fault of opendrs: the disk is full, over its
#: quota or the file's size limit, or the device failed.
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def _output_error(exc: OSError) -> int:
    """One line for an output that cannot be written (``opendrs … > file`` on a full disk):
    exit status 1, a problem that may pass. What stays buffered is dropped, so that the exit
    does not try to write it again."""
    print(f"error: cannot write the output: {exc.strerror}", file=sys.stderr)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_PROBLEM


def _system_error(exc: OSError) -> int:
    """One line for a file, not the output, that the system could not read or write (a full
    disk, a failing device): exit status 1, a problem that may pass."""
    where = f" {exc.filename}" if exc.filename is not None else " a file"
    print(f"error: cannot read or write{where}: {exc.strerror or exc}", file=sys.stderr)
    return EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())
