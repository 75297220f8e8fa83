"""What every ``opendrs`` command shares as a process: its exit statuses, the usage error (one
line, exit status 2) and its log lines on stderr."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from opendrs.model.document import one_line

__all__ = [
    "EXIT_LASTING",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "UsageError",
    "end_without_waiting_for",
    "exit_now",
    "internal_error",
    "left_computing",
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


#: The counts of threads the command has left computing an answer it can no longer send (the
#: requests an HTTP server cut at its stop): :func:`opendrs.cli.main.main` ends the process at
#: once while one counts any.
_LEFT: list[Callable[[], int]] = []


def end_without_waiting_for(computing: Callable[[], int]) -> None:
    """Have the process end without waiting for the threads ``computing()`` counts, once the
    command is done (its files closed) and while it counts any: the interpreter's exit would
    wait for them, or end them under code that aborts when a thread ends under it."""
    _LEFT.append(computing)


def left_computing() -> bool:
    """Whether a thread the command left (:func:`end_without_waiting_for`) still computes; the
    counts are let go, so the next command in this process starts with none."""
    counts = list(_LEFT)
    _LEFT.clear()
    return any(count() > 0 for count in counts)


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
