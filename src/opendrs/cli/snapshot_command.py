"""``opendrs snapshot --config FILE``: the live cluster, as the daemon observes it, as a snapshot.

The configured backend is observed once, through the daemon's own code
(:func:`opendrs.controller.loop.observe_as_configured`, which the daemon observes with): the
configuration's ``settings`` replace the backend's, its ``cluster`` names the cluster, and a
reserve that leaves a node no capacity is refused. The usage is what the daemon's smoothing makes
of one observation — the observation itself. The result is written in the snapshot format
(:func:`opendrs.model.snapshot.dumps`), so that ``show``, ``plan``, ``place`` and ``simulate`` (a
scenario naming the file) work on the live cluster.

Standard output without ``-o``. ``-o FILE`` writes a temporary file next to ``FILE`` and renames
it over ``FILE``: a reader sees the old snapshot or the new one, never half of one, and an
existing file keeps its mode. A ``FILE`` that is a symbolic link is refused (opendrs neither
writes through it nor replaces it), as is anything but a regular file. The format follows
``--format``, else ``FILE``'s suffix (``.json``), else YAML; YAML in a ``.json`` file — which
every command would read as JSON — is refused.

A snapshot holds what the cluster is, never how to reach it: no host, user or secret.

Exit status: 0 written; 1 the cluster could not be observed, or what was observed cannot be
written as a snapshot (one line, ``error: …``); 2 a bad configuration or option.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from opendrs.backends.base import BackendError
from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import add_config_option
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, UsageError, setup_logging
from opendrs.engine.constraints import platform_balancer
from opendrs.engine.policy import UsageWindow
from opendrs.model import snapshot
from opendrs.model.cluster import Cluster
from opendrs.model.document import one_line

if TYPE_CHECKING:
    from opendrs.controller.config import Config


__all__ = ["add_snapshot_parser", "cmd_snapshot", "observe_once", "render", "write_atomically"]

FORMATS = ("yaml", "json")


class SnapshotProblem(Exception):
    """What was observed cannot be written as a snapshot: one line, exit status 1."""


def observe_once(
    config: Config, *, should_stop: Any = None, then: Callable[[Any], None] | None = None
) -> Cluster:
    """The cluster as ``opendrs run`` with ``config`` would see it in one observation;
    ``then`` is given the backend after the observation, before it is closed.

    Raises :class:`BackendError` when it cannot be observed (or a configured reserve leaves a
    node no capacity).
    """
    # imported when the command runs: the controller is large
    from opendrs.controller.loop import observe_as_configured

    backend, clock = config.make_backend(should_stop=should_stop)
    try:
        cluster = observe_as_configured(backend, config)
        if then is not None:
            then(backend)
        # What the daemon's smoothing makes of it (for one observation, the observation).
        window = UsageWindow().add(clock.now(), cluster, config.policy.smoothing)
        return window.smoothed(cluster)
    finally:
        backend.close()


def render(cluster: Cluster, fmt: str) -> str:
    """The snapshot text of ``cluster``, checked to load back.

    Raises :class:`SnapshotProblem` for a cluster the format cannot hold (a node whose size is
    not known, a value out of the format's ranges).
    """
    for node in cluster.nodes:
        if node.cpu > 0 and node.memory > 0:
            continue
        if not node.online:
            raise SnapshotProblem(
                f"node {node.name} is offline and the API reports no size for it: take the "
                "snapshot while it is online"
            )
        raise SnapshotProblem(
            f"node {node.name} reports no size ({node.cpu:g} cores, {node.memory} bytes of memory)"
        )
    try:
        text = snapshot.dumps(cluster, fmt)
        # It must load back: validate, show, plan and place will read it.
        snapshot.loads(text, filename=f"snapshot.{fmt}", fmt=fmt)
    except snapshot.SnapshotError as exc:
        where = f"{exc.path}: " if exc.path else ""
        raise SnapshotProblem(f"{where}{exc.reason}") from None
    except ValueError as exc:
        raise SnapshotProblem(one_line(str(exc))) from None
    return text


def _output_format(requested: str | None, output: str | None) -> str:
    suffix_json = output is not None and output.lower().endswith(".json")
    if requested is None:
        return "json" if suffix_json else "yaml"
    if requested == "yaml" and suffix_json:
        raise UsageError(
            f"--format yaml: {output} ends in .json, and every command reads such a file as "
            "JSON: use --format json, or a name ending in .yaml"
        )
    return requested


def _check_target(path: str) -> os.stat_result | None:
    """The target's status when it exists; a usage error for anything but a regular file or a
    missing one in an existing folder."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder):
            raise UsageError(f"-o {path}: the folder {folder} does not exist") from None
        return None
    except OSError as exc:
        raise UsageError(f"-o {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(status.st_mode):
        raise UsageError(
            f"-o {path}: a symbolic link: refused (remove it, or name the file it points to)"
        )
    if not stat.S_ISREG(status.st_mode):
        raise UsageError(f"-o {path}: not a regular file")
    return status


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file renamed over it.

    The rename replaces the directory entry: a symbolic link put there meanwhile is replaced, not
    followed. An existing file keeps its mode; a new one gets the usual ``0666 & ~umask``. Raises
    :class:`UsageError` (one line) when the file cannot be written.
    """
    existing = _check_target(path)
    mode = stat.S_IMODE(existing.st_mode) if existing is not None else 0o666 & ~_umask()
    folder = os.path.dirname(path) or "."
    name = os.path.basename(path)
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"-o {path}: cannot write in {folder}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise UsageError(f"-o {path}: cannot write it: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class _Stop:
    """SIGTERM/SIGINT give an API call under way up within about a second."""

    def __init__(self) -> None:
        self.asked = False
        self._previous: dict[int, Any] = {}

    def _on(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True

    def __enter__(self) -> _Stop:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def cmd_snapshot(args: argparse.Namespace) -> int:
    # imported when the command runs: the controller is large
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    fmt = _output_format(args.format, args.output)
    if args.output is not None:
        _check_target(args.output)  # before the cluster is asked anything
    setup_logging(config.log_level)
    try:
        with _Stop() as stop:
            cluster = observe_once(config, should_stop=lambda: stop.asked)
    except BackendError as exc:
        print(f"error: cannot observe the cluster: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    try:
        text = render(cluster, fmt)
    except SnapshotProblem as exc:
        print(f"error: cannot write the cluster as a snapshot: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomically(args.output, text)
    balancer = platform_balancer(cluster)
    if balancer is not None:
        # The snapshot says so too (``ha_auto_rebalance: true``), for show, plan and place.
        print(f"note: {balancer}", file=sys.stderr)
    return EXIT_OK


def add_snapshot_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "snapshot",
        help="write the live cluster, as the configured backend observes it, as a snapshot file",
        description="Observe the cluster of a configuration file once, as 'opendrs run' would "
        "(the file's settings and cluster name apply), and write it as a snapshot (its format: "
        "'man opendrs') for show, plan, place and simulate. It holds no secret. "
        "Exit status: 0 written, 1 the cluster could not be observed, 2 a bad configuration or "
        "option.",
    )
    add_config_option(p)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE (atomically: a temporary file renamed over it; a symbolic link is "
        "refused) instead of standard output",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="yaml or json (default: json for a FILE ending in .json, else yaml)",
    )
    p.set_defaults(func=cmd_snapshot)
