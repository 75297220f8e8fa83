"""``opendrs init``, which writes a commented starting configuration for Proxmox VE or Incus,
and ``opendrs validate --config FILE``, which checks one and says what it would do.

The starting configurations are package data (``opendrs/data/config/PLATFORM.yaml``): the file
``opendrs init`` writes, and the default ``/etc/opendrs/opendrs.yaml`` a package installs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from importlib import resources
from typing import TYPE_CHECKING, Final

from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import CONFIG_ENV, DEFAULT_CONFIG, default_config_path
from opendrs.cli.process import EXIT_OK, EXIT_USAGE, UsageError
from opendrs.model.document import DocumentError, parse, read_file
from opendrs.model.units import format_duration

if TYPE_CHECKING:
    from opendrs.controller.config import Config
    from opendrs.engine.policy import PolicyConfig

__all__ = ["add_init_parser", "config_problems", "starting_config", "validate_config"]

#: The platforms ``opendrs init`` writes a configuration for.
PLATFORMS: Final = {"proxmox": "Proxmox VE", "incus": "Incus"}
#: Most problems ``validate --config`` reports (one per section at most: see
#: :func:`config_problems`).
_MAX_PROBLEMS: Final = 20
#: A backend that reads without a check of its own: it stands in for a refused ``backend``
#: section, so that the other sections are still checked.
_STAND_IN_BACKEND: Final = {"type": "sim"}


def starting_config(platform: str) -> str:
    """The commented starting configuration for ``platform`` (a key of :data:`PLATFORMS`)."""
    return (resources.files("opendrs") / "data" / "config" / f"{platform}.yaml").read_text("utf-8")


def cmd_init(args: argparse.Namespace) -> int:
    """``opendrs init``: the starting configuration, to a new file (``--force``: over one) or to
    standard output (``-o -``)."""
    text = starting_config(args.platform)
    output = args.output if args.output is not None else default_config_path()
    if output == "-":
        sys.stdout.write(text)
        return EXIT_OK
    _write_new(output, text, force=args.force)
    print(
        f"wrote {output}: a starting configuration for {PLATFORMS[args.platform]} in shadow "
        f"mode; edit it (its comments say what each line does), then check it with 'opendrs "
        f"validate --config {output}'"
    )
    return EXIT_OK


def _write_new(path: str, text: str, *, force: bool) -> None:
    """``text`` into ``path``, a new file (its directory made when missing); an existing file is
    refused unless ``force``, and a symbolic link always."""
    if os.path.islink(path):
        raise UsageError(f"--output: {path} is a symbolic link: name the file itself")
    if os.path.exists(path) and not force:
        raise UsageError(
            f"--output: {path} exists: opendrs init leaves it alone (--force: over it)"
        )
    if os.path.isdir(path):
        raise UsageError(f"--output: {path} is a directory: name a file")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | (0 if force else os.O_EXCL)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        descriptor = os.open(path, flags, 0o644)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {path}: {exc.strerror or exc}") from None


def config_problems(path: str) -> tuple[Config | None, list[DocumentError]]:
    """The configuration in ``path`` and its problems, one per section at most, in the file's
    order (the configuration is None when there is one).

    The reader stops at the first problem; each section it refuses is then set aside (a refused
    ``backend``, which is required, is replaced by a stand-in) and the rest read again, so that
    one run names a problem in every section that has one."""
    from opendrs.controller.config import parse_config

    filename, data = read_file(path)
    document = parse(data, filename=filename)
    order = list(document) if isinstance(document, Mapping) else []
    problems: list[DocumentError] = []
    config = None
    while len(problems) < _MAX_PROBLEMS:
        try:
            config = parse_config(document, filename=filename, check_inputs=True)
            break
        except DocumentError as exc:
            problems.append(exc)
            document = _without_section(document, exc)
            if document is None:
                break
    # In the file's order: the first problem found is not the first one written.
    problems.sort(key=lambda p: order.index(p.parts[0]) if _section(p) in order else len(order))
    return (None if problems else config), problems


def _section(problem: DocumentError) -> object:
    """The top-level key ``problem`` is in, or None when it concerns the whole file."""
    return problem.parts[0] if problem.parts else None


def _without_section(document: object, problem: DocumentError) -> dict[object, object] | None:
    """``document`` without the top-level section ``problem`` is in (a stand-in for
    ``backend``), or None when the problem is not inside one section (the file as a whole)."""
    if not isinstance(document, Mapping) or not problem.parts:
        return None
    section = problem.parts[0]
    rest = {key: value for key, value in document.items() if key != section}
    if section == "backend" and document.get(section) != _STAND_IN_BACKEND:
        return {**rest, "backend": dict(_STAND_IN_BACKEND)}
    return rest if section in document and section != "backend" else None


class _Warnings(logging.Handler):
    """The warnings logged while a configuration is read (a secret file every user may read),
    each once: the reader runs again after each problem."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if line not in self.lines:
            self.lines.append(line)


def validate_config(path: str, fmt: str) -> int:
    """``opendrs validate --config FILE``: one line per problem (file, field, reason) and exit
    status 2, or a short summary of what the configuration makes opendrs do and 0; a warning
    the reader logs is a line of its own (``warning:``), once."""
    root, warnings = logging.getLogger(), _Warnings()
    root.addHandler(warnings)
    try:
        config, problems = config_problems(path)
    finally:
        root.removeHandler(warnings)
    for line in warnings.lines if fmt != "json" else ():
        print(f"warning: {path}: {line}", file=sys.stderr)
    if fmt == "json":
        from opendrs.cli.output import dump_json

        dump_json(
            {
                "file": path,
                "valid": not problems,
                "problems": [
                    {"field": p.path, "reason": p.reason, "line": str(p)} for p in problems
                ],
                "warnings": warnings.lines,
                "summary": config_summary(config) if config is not None and not problems else {},
            }
        )
    else:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        if config is not None and not problems:
            print(f"{path}: valid")
            for key, text in config_summary(config).items():
                print(f"  {key:9} {text}")
    return EXIT_USAGE if problems else EXIT_OK


def _mode(config: Config) -> str:
    if config.mode == "manual":
        return f"manual: {config.manual_words()}"
    if config.active:
        return "active: migrates guests"
    return "shadow: watches and records what it would migrate, migrates nothing"


def config_summary(config: Config) -> dict[str, str]:
    """What ``config`` makes ``opendrs run`` do, a line per subject, in an operator's words."""
    summary = {
        "platform": _platform(config),
        "mode": _mode(config),
        "policy": _policy(config.policy),
        "moves": _moves(config),
        "history": config.history,
    }
    schedule = config.policy.schedule
    if schedule is not None and not schedule.empty:
        summary["windows"] = schedule.summary()
    if config.policy.keep_failover > 0:
        summary["failover"] = _failover(
            config.policy.keep_failover, config.policy.failover_recovery
        )
    if config.http is not None:
        where = "this host only" if config.http.loopback else "reachable from other hosts"
        summary["dashboard"] = f"http://{config.http.address} ({where})"
    if config.decision_log is not None:
        summary["decisions"] = config.decision_log
    return summary


#: ``policy.failover_recovery`` in words.
_RESTARTS = {
    "auto": "as the Proxmox cluster's HA scheduler mode would restart them, else best fit",
    "best-fit": "each restarted on the best node with room",
    "pve-basic": "as Proxmox VE's HA manager restarts them in basic mode",
    "pve-static": "as Proxmox VE's HA manager restarts them in static mode",
}


def _failover(failures: int, recovery: str) -> str:
    """``policy.keep_failover`` and ``failover_recovery`` in words."""
    nodes = "any one node fails" if failures == 1 else f"any {failures} nodes fail"
    return (
        f"keeps every HA guest restartable if {nodes} (keep_failover {failures}; "
        f"{_RESTARTS[recovery]}): refuses a balancing plan that would lose it, repairs toward it "
        "where it is lacking"
    )


def _platform(config: Config) -> str:
    """The cluster the configuration drives, and how it is reached."""
    backend = config.backend
    if backend.proxmox is not None:
        proxmox = backend.proxmox
        tls = "TLS verified" if proxmox.verify_tls else "TLS NOT verified"
        if proxmox.ca_file is not None:
            tls += f" with {proxmox.ca_file}"
        return f"Proxmox VE at {', '.join(proxmox.hosts)} as {proxmox.auth_id} ({tls})"
    if backend.incus is not None:
        incus = backend.incus
        where = incus.socket if incus.socket is not None else ", ".join(incus.addresses)
        projects = "every project" if incus.all_projects else f"project {incus.project}"
        return f"{'LXD' if incus.flavour == 'lxd' else 'Incus'} at {where} ({projects})"
    if backend.type == "file":
        return f"the snapshot file {backend.path} (read-only: every migration fails)"
    scenario = backend.scenario or f"builtin:{backend.builtin}"
    return f"the simulator, scenario {scenario}"


def _moves(config: Config) -> str:
    """How many migrations run at once, and how long a migrated guest stays put."""
    executor, settings = config.executor, config.settings
    parallel = executor.max_parallel or (settings.max_parallel if settings else None)
    inflow = executor.max_node_inflow or (settings.max_node_inflow if settings else None)
    by_cluster = "the cluster's setting ({} by default)"
    return (
        f"migrations: {parallel or by_cluster.format(4)} at once, "
        f"{inflow or by_cluster.format(1)} into any one node; "
        f"a migrated guest stays put {format_duration(executor.cooldown)}"
    )


def _policy(policy: PolicyConfig) -> str:
    """When the policy acts, in words."""
    from opendrs.engine.policy.config import metric_text

    every = format_duration(policy.interval)
    if policy.metric == "none":
        return f"{policy.name}: looks every {every}; repairs only (metric none), never balances"
    hold = max(policy.hold, 1)
    held = format_duration(hold * policy.interval)
    return (
        f"{policy.name}: looks every {every}; balances when the {policy.metric} stays above "
        f"{metric_text(policy.threshold, policy.metric)} for {hold} looks ({held}), down to a "
        f"spread of {metric_text(policy.target, 'spread')}, with the {policy.strategy} strategy"
    )


def add_init_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "init",
        help="write a commented starting configuration for Proxmox VE or Incus (shadow mode)",
        description="Write a starting configuration for a Proxmox VE or Incus cluster: shadow "
        "mode (nothing migrates), the API token's secret in a file of its own (Proxmox) or the "
        "local socket (Incus), TLS verified, the dashboard on 127.0.0.1, each line explained. "
        f"By default it is written to {DEFAULT_CONFIG} (or ${CONFIG_ENV}), the file run, "
        "status, history, snapshot and maintenance read without --config; an existing file is "
        "left alone unless --force. Exit status: 0 written, 2 the file exists or cannot be "
        "written.",
    )
    p.add_argument(
        "--platform", choices=tuple(PLATFORMS), required=True, help="the cluster's platform"
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help=f"where to write it ('-': standard output; default {DEFAULT_CONFIG}, or "
        f"${CONFIG_ENV})",
    )
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_init)
