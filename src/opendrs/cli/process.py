"""What every ``opendrs`` command shares as a process: its exit statuses, the usage error (one
line, exit status 2) and its log lines on stderr."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from typing import NoReturn

from opendrs.model.document import one_line

__all__ = [
    "EXIT_LASTING",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "UsageError",
    "exit_now",
    "exit_status_of",
    "internal_error",
    "setup_logging",
]

EXIT_OK = 0
#: A problem that may pass (an API that cannot be reached, another instance running): the
#: shipped systemd unit restarts the daemon after it.
EXIT_PROBLEM = 1
#: Bad input: the command line or the configuration.
EXIT_USAGE = 2
#: A problem a restart cannot cure (a corrupt history, a schema newer than this opendrs, a
#: history of another cluster, a lock path that is a link): the systemd unit does not restart.
EXIT_LASTING = 3


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit status 2."""


def setup_logging(level: str) -> None:
    """Log lines to stderr: time, level, message — never a secret (backends make sure)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(message)s"))
    root.addHandler(handler)
    chosen = getattr(logging, level.upper(), logging.INFO)
    root.setLevel(chosen)
    # httpx (the Incus backend's client) logs every request at INFO and httpcore every step of
    # it at DEBUG: each request is shown at the debug level only, httpcore's steps never.
    logging.getLogger("httpx").setLevel(
        logging.INFO if chosen <= logging.DEBUG else logging.WARNING
    )
    logging.getLogger("httpcore").setLevel(logging.WARNING)


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` at once, its log and output flushed, without the
    interpreter's finalisation: for a daemon whose files are closed but which still has threads
    it cannot end (an HTTP request computing an answer it can no longer send). Finalising would
    wait for them, or end them under code that aborts when a thread ends under it."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing more to say
            stream.flush()
    os._exit(status)


def internal_error(exc: BaseException, *, verbose: bool) -> int:
    """One line for an exception no input explains (``--debug``: its traceback first): exit
    status 1."""
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


def exit_status_of(exc: BaseException, *, verbose: bool) -> int:
    """The exit status of a command ended by ``exc``, said as :func:`opendrs.cli.main.main`
    would (one line): for a command that must then end with :func:`exit_now`."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, SystemExit):
        return _exit_code(exc)
    return internal_error(exc, verbose=verbose)


def _exit_code(exc: SystemExit) -> int:
    """The status Python gives a ``SystemExit``: ``None`` 0, a number itself, anything else
    printed on stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return EXIT_PROBLEM
