"""``opendrs run``: its parser, and the command, which runs the daemon of :mod:`.daemon`."""

from __future__ import annotations

import argparse
import sys

from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import add_config_option
from opendrs.cli.daemon_signals import DaemonSignals
from opendrs.cli.process import end_without_waiting_for, setup_logging

__all__ = ["add_run_parser"]


def cmd_run(args: argparse.Namespace) -> int:
    """``opendrs run``: catch the signals, read the configuration, open the files, serve, run:
    the exit status."""
    signals = DaemonSignals(args.config)
    signals.install()
    try:
        return _start_and_run(args, signals)
    finally:
        signals.restore()


def _start_and_run(args: argparse.Namespace, signals: DaemonSignals) -> int:
    # imported when the daemon runs: the controller, its server and the backends are large
    from opendrs.cli.daemon import CannotStart, DaemonRun, open_files, start_serving
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    setup_logging("debug" if args.verbose else config.log_level)
    try:
        files = open_files(config)
        published = start_serving(config, files)
    except CannotStart as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    daemon = DaemonRun(
        config,
        signals,
        files,
        published,
        once=args.once,
        shadow=args.shadow,
        verbose=args.verbose,
    )
    if published.server is not None:
        # Requests its stop cuts that still compute are left: main() ends the process at once.
        end_without_waiting_for(published.server.computing)
    return daemon.run()


def add_run_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "run",
        help="the daemon: observe, decide and (in active mode, or once approved in manual mode) "
        "migrate, every interval",
        description="Run the controller with a configuration file (its keys: 'man opendrs'). "
        "Shadow mode, the default, only records and logs what it would do; migrations happen "
        "only with 'mode: active' in the file, or with 'mode: manual' once an operator approves "
        "them (opendrs approve). SIGHUP reloads the file (and opens the decision log again), "
        "SIGUSR1 runs a cycle now, SIGTERM stops cleanly. Exit status: 0 stopped, 1 a problem "
        "that may pass (retry), 2 bad configuration (or a decision log that cannot be "
        "opened), 3 a problem a restart cannot cure (corrupt or foreign history).",
    )
    add_config_option(p)
    p.add_argument(
        "--once",
        action="store_true",
        help="one cycle (no hold), then follow its migrations to the end and exit; exit status 1 "
        "when the cluster could not be observed",
    )
    p.add_argument(
        "--shadow",
        action="store_true",
        help="never migrate, whatever the file says, through every reload",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging, whatever the file says, through every reload",
    )
    p.set_defaults(func=cmd_run)
