"""``opendrs proxlb check`` and ``opendrs pve decide``: the compatibility commands."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

from opendrs.cli.arguments import Subcommands, positive_seconds
from opendrs.cli.output import add_format_option, dump_json, new_console
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, UsageError
from opendrs.engine.strategies import get_strategy
from opendrs.report.text import Report

__all__ = ["add_compat_parsers"]


def cmd_proxlb_check(args: argparse.Namespace) -> int:
    # imported when the command runs: the proxlb compatibility layer is large
    from opendrs.compat.proxlb import check_paths, junit_xml, scenario_files

    try:
        get_strategy(args.strategy)
    except KeyError as exc:
        raise UsageError(f"--strategy: {exc.args[0]}") from None
    files = scenario_files(args.paths)
    missing = [str(p) for p in files if not p.exists()]
    if missing:
        raise UsageError(f"{missing[0]}: no such file or directory")
    if not files:
        raise UsageError(f"{', '.join(args.paths)}: no scenario files (*.yaml)")
    results = check_paths(files, strategy=args.strategy, time_limit=args.time_limit)
    if args.junit:
        try:
            Path(args.junit).write_text(junit_xml(results), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--junit: cannot write {args.junit}: {exc.strerror or exc}") from None
    if args.format == "json":
        dump_json([r.as_dict() for r in results])
    else:
        report = Report(new_console())
        for result in results:
            status = "PASS" if result.passed else "FAIL"
            report.line(
                f"{status}  {result.path}  ({result.migrations} migrations, "
                f"{result.duration * 1000:.0f} ms)",
                "green" if result.passed else "red",
            )
            for check in result.failures:
                report.line(f"      {check.name}: expected {check.expected}, {check.detail}", "red")
        passed = sum(r.passed for r in results)
        report.line(f"{passed} passed, {len(results) - passed} failed")
    return EXIT_OK if all(r.passed for r in results) else EXIT_PROBLEM


def cmd_pve_decide(args: argparse.Namespace) -> int:
    from opendrs.compat.pve import serve

    stdin: Any = sys.stdin
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        # Bytes that are not UTF-8 reach serve() as lone surrogates: that line gets an error
        # answer, instead of a UnicodeDecodeError ending the stream.
        stdin = io.TextIOWrapper(buffer, encoding="utf-8", errors="surrogateescape")
    return serve(stdin, sys.stdout)


def add_compat_parsers(sub: Subcommands) -> None:
    """``proxlb check`` and ``pve decide``."""
    p = sub.add_parser(
        "proxlb",
        help="proxlb-solver compatibility",
        description="Run proxlb-solver's scenario files through opendrs ('opendrs proxlb check "
        "--help').",
    )
    proxlb_sub = p.add_subparsers(dest="proxlb_command", metavar="COMMAND", required=True)
    q = proxlb_sub.add_parser(
        "check",
        help="run proxlb-solver scenario files and check their expect blocks",
        description="Run proxlb-solver scenario files (files, or folders searched for *.yaml) "
        "through a strategy and the planner, and check each scenario's expect block with "
        "proxlb-solver's semantics. One line per scenario (PASS/FAIL, migrations, time) and the "
        "failing checks. Exit status: 0 all passed, 1 a check failed, 2 bad input.",
    )
    q.add_argument("paths", metavar="PATH", nargs="+", help="scenario files or folders of them")
    q.add_argument("--strategy", default="optimal", help="strategy to run (default optimal)")
    q.add_argument(
        "--time-limit",
        type=positive_seconds,
        default=5.0,
        help="solver time limit per scenario (s)",
    )
    q.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML")
    add_format_option(q)
    q.set_defaults(func=cmd_proxlb_check)

    p = sub.add_parser(
        "pve",
        help="Proxmox VE compatibility",
        description="Answer Proxmox VE's cluster resource scheduler queries ('opendrs pve "
        "decide --help').",
    )
    pve_sub = p.add_subparsers(dest="pve_command", metavar="COMMAND", required=True)
    q = pve_sub.add_parser(
        "decide",
        help="answer Proxmox CRS decision queries: JSON Lines on stdin, one answer per line",
        description="Answer Proxmox CRS decision queries: JSON Lines on standard input, one "
        'answer per line on standard output, in order. A bad line gets an {"error": ...} '
        "answer naming the field at fault, and the stream goes on. Exit status 0 when the input "
        "ends.",
    )
    q.set_defaults(func=cmd_pve_decide)
