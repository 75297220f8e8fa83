"""``opendrs validate``, ``show`` and ``place``: a snapshot file read, checked and looked at."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from opendrs.cli.arguments import Subcommands, guest_by_name_or_id
from opendrs.cli.config_file import DEFAULT_CONFIG, existing_default_config
from opendrs.cli.output import add_format_option, add_verbose_option, dump_json, new_console
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.constraints import Constraints, movability, platform_balancer
from opendrs.engine.placement import Evacuation, evacuate, place_guest, place_new
from opendrs.engine.planner import Plan
from opendrs.engine.policy import repair, stuck_now, warn_stuck
from opendrs.engine.strategies.base import cluster_imbalance, imbalance_by_arch
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import Cluster, Guest, Move
from opendrs.model.document import DocumentError, parse, read_file
from opendrs.model.new_guest import NewGuestError, new_guest
from opendrs.model.snapshot import from_dict, load_demo
from opendrs.report.text import (
    Report,
    show_cluster,
    show_evacuation,
    show_placement,
    show_plan,
    show_stuck,
)

if TYPE_CHECKING:
    from opendrs.compat.proxlb import Scenario

__all__ = ["add_cluster_parsers", "read_cluster", "read_snapshot"]


def read_snapshot(path: str) -> tuple[Cluster, Scenario | None]:
    """A snapshot, or a proxlb-solver scenario (detected from its keys), or the demo cluster."""
    if path == "demo":
        return load_demo(), None
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data  # the bytes are not kept while the cluster is built
    if isinstance(document, Mapping) and "vms" in document:  # a snapshot has none
        # imported for such a file only: the proxlb compatibility layer is large
        from opendrs.compat.proxlb import is_proxlb_scenario, scenario_from_dict

        if is_proxlb_scenario(document):
            scenario = scenario_from_dict(document, filename=filename)
            return scenario.cluster, scenario
    return from_dict(document, filename=filename), None


def read_cluster(path: str) -> Cluster:
    return read_snapshot(path)[0]


def cmd_validate(args: argparse.Namespace) -> int:
    if args.snapshot is not None and args.config is not None:
        raise UsageError("validate: give a SNAPSHOT or --config FILE (one of them)")
    if args.snapshot is None:
        from opendrs.cli.config_command import validate_config  # the controller's reader

        return validate_config(args.config or existing_default_config(), args.format)
    try:
        cluster = read_cluster(args.snapshot)
    except DocumentError:
        if _is_configuration(args.snapshot):
            raise UsageError(
                f"{args.snapshot} is a configuration file, not a snapshot: opendrs validate "
                f"--config {args.snapshot}"
            ) from None
        raise
    cons = Constraints.build(cluster)
    # A rule ignored in favour of one of an earlier origin is a warning; a dropped one an error.
    problems = [str(p) for p in cons.problems if not p.ignored]
    warnings = [str(p) for p in cons.problems if p.ignored]
    if args.format == "json":
        dump_json(
            {
                "file": args.snapshot,
                "valid": not problems,
                "nodes": len(cluster.nodes),
                "guests": len(cluster.guests),
                "problems": problems,
                "warnings": warnings,
            }
        )
    else:
        for warning in warnings:
            print(f"{args.snapshot}: rules: warning: {warning}", file=sys.stderr)
        for problem in problems:
            print(f"{args.snapshot}: rules: {problem}", file=sys.stderr)
        if not problems:
            n_rules = len(cluster.rules.node_affinity) + len(cluster.rules.guest_affinity)
            ignored = f"; {len(warnings)} ignored" if warnings else ""
            counts = ", ".join(
                f"{count} {noun}{'' if count == 1 else 's'}"
                for count, noun in (
                    (len(cluster.nodes), "node"),
                    (len(cluster.guests), "guest"),
                    (n_rules, "rule"),
                )
            )
            print(f"{args.snapshot}: valid ({counts}{ignored})")
    return EXIT_USAGE if problems else EXIT_OK


def _is_configuration(path: str) -> bool:
    """Whether ``path`` holds a configuration (a mapping with a ``backend``), not a snapshot."""
    try:
        filename, data = read_file(path)
        document = parse(data, filename=filename)
    except DocumentError:
        return False
    return isinstance(document, Mapping) and "backend" in document


def cmd_show(args: argparse.Namespace) -> int:
    cluster = read_cluster(args.snapshot)
    stuck = stuck_now(cluster)
    if args.format == "json":
        from opendrs.controller.views import stuck_rows  # imported here: it loads the controller

        loads = LoadModel.build(cluster)
        fractions = loads.fractions()
        dump_json(
            {
                "name": cluster.name,
                "mode": cluster.settings.mode,
                "balance_source": cluster.settings.balance_source,
                "nodes": [
                    {
                        "name": n.name,
                        "online": n.online,
                        "maintenance": n.maintenance,
                        "load": {"cpu": float(fractions[i, 0]), "memory": float(fractions[i, 1])},
                        "guests": [g.id for g in cluster.guests_on(n.name)],
                    }
                    for i, n in enumerate(cluster.nodes)
                ],
                "imbalance": cluster_imbalance(cluster).as_dict(),
                "imbalance_by_arch": {
                    arch: imbalance.as_dict()
                    for arch, imbalance in imbalance_by_arch(cluster).items()
                },
                "problems": [str(p) for p in Constraints.build(cluster).problems],
                "rule_breaks": [b.as_dict() for b in rule_breaks(cluster)],
                "platform_balancer": platform_balancer(cluster),
                "stuck": stuck_rows(cluster, stuck),
            }
        )
        return EXIT_OK
    report = Report(new_console())
    show_cluster(report, cluster, guests=not args.no_guests)
    show_stuck(report, stuck)
    return EXIT_OK


def _parse_new(spec: str) -> Guest:
    """``cpu=4,memory=8GiB[,kind=ct][,arch=aarch64][,name=web9][,id=900]`` -> Guest."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UsageError(f"--new: {part!r} is not key=value (example: cpu=4,memory=8GiB)")
        key, value = (s.strip() for s in part.split("=", 1))
        if key in fields:
            raise UsageError(f"--new: {key} is given twice ({fields[key]!r} and {value!r})")
        fields[key] = value
    try:
        return new_guest(fields)
    except NewGuestError as exc:
        raise UsageError(f"--new: {exc}") from None


def cmd_place(args: argparse.Namespace) -> int:
    cluster = read_cluster(args.snapshot)
    report = Report(new_console())
    if args.evacuate is not None:
        if args.evacuate not in cluster.node_index:
            raise UsageError(f"--evacuate: no node {args.evacuate!r} in {args.snapshot}")
        result = evacuate(cluster, args.evacuate, "recover" if args.failed else "evacuate")
        plan = None
        if result.stuck and not args.failed:
            result, plan = _evacuation_repair(cluster, result)
        if args.format == "json":
            data = result.as_dict()
            if plan is not None:
                data["plan"] = plan.as_dict()
            dump_json(data)
        else:
            show_evacuation(report, result, cluster)
            if plan is not None:
                show_plan(report, plan, cluster)
        return EXIT_PROBLEM if result.stuck else EXIT_OK
    if args.guest is not None:
        names = {g.id: g.name for g in cluster.guests}
        guest = guest_by_name_or_id(args.guest, names, "--guest", args.snapshot)
        placement = place_guest(cluster, guest, "recover" if args.failed else "balance")
    else:
        if args.failed:
            raise UsageError("--failed goes with --guest or --evacuate, not --new")
        new = _parse_new(args.new)
        placement = place_new(cluster, new)
        cluster = replace(cluster, guests=(*cluster.guests, new))  # to name it, and its rules
    if args.format == "json":
        dump_json(placement.as_dict())
    else:
        show_placement(report, placement, cluster, verbose=args.verbose)
    return EXIT_OK if placement.ranking else EXIT_PROBLEM


def _evacuation_repair(cluster: Cluster, greedy: Evacuation) -> tuple[Evacuation, Plan | None]:
    """When placing the guests one by one leaves some behind: the daemon's repair of the
    cluster with the node in maintenance — other guests moved to make room (the exact model),
    ordered in steps with parking moves. Kept when it leaves fewer guests on the node."""
    node = greedy.node
    nodes = tuple(replace(n, maintenance=True) if n.name == node else n for n in cluster.nodes)
    drained = replace(cluster, nodes=nodes)
    fixed = repair(drained)
    on_node = [g for g in drained.guests if g.node == node]
    stuck = dict(fixed.stuck)
    final = {m.guest: m.target for m in fixed.plan.moves} if fixed.plan is not None else {}
    left = [g for g in on_node if final.get(g.id, node) == node]
    if fixed.plan is None or len(left) >= len(greedy.stuck):
        # The placements one by one are kept: the warnings name what they leave, in the
        # repair's words where it has them (not the guests it would leave and they move).
        warn_stuck(tuple((g, stuck.get(g, f"{g}: {why}")) for g, why in greedy.stuck))
        return greedy, None
    warn_stuck(tuple((g.id, stuck[g.id]) for g in left if g.id in stuck))
    reasons = tuple(
        (g.id, stuck.get(g.id) or str(movability(g, drained, "balance") or "the repair leaves it"))
        for g in left
    )
    moves = tuple(Move(m.guest, m.source, m.target) for m in fixed.plan.moves)
    return Evacuation(node, moves, reasons), fixed.plan


def add_cluster_parsers(sub: Subcommands) -> None:
    """``validate``, ``show`` and ``place``."""
    p = sub.add_parser(
        "validate",
        help="check a snapshot file and its rules, or a configuration file",
        description="SNAPSHOT: read a snapshot file and check its rules as Proxmox's HA rule "
        "checks do (contradictions, rules no placement can keep); a rule ignored in favour of "
        "one of an earlier origin is a warning. --config FILE: check a configuration as "
        "'opendrs run' reads it, a problem in each section it has one in, and say what it would "
        f"make opendrs do; with neither, the default configuration ({DEFAULT_CONFIG}, or "
        "$OPENDRS_CONFIG). One line per problem: file, field, reason. Exit status: 0 valid, 2 "
        "unreadable, invalid, or rules dropped.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT", nargs="?", help="a snapshot, or 'demo'")
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"a configuration file to check instead (default {DEFAULT_CONFIG} when no "
        "SNAPSHOT is given, or $OPENDRS_CONFIG)",
    )
    add_format_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "show",
        help="nodes with load bars, guests per node, imbalance figures, rules broken now",
        description="Show a snapshot: each node's load per resource as a bar (as wide as the "
        "terminal lets it be) and its size, the imbalance of the usable nodes, the guests per "
        "node as name (id), the rules dropped and broken now, the nodes over capacity and what "
        "a repair would leave stuck. Exit status: 0 shown, 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    p.add_argument("--no-guests", action="store_true", help="leave out the guest table")
    add_format_option(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "place",
        help="rank the nodes for a guest, a new guest, or every guest of a node to evacuate",
        description="Rank the nodes that can take a guest (by name or id), a new guest, or "
        "each guest of a node to evacuate: the hard constraints filter the nodes, each rejected "
        "node says why, and the others rank by how even the loads would be, each soft rule "
        "broken (named) counting against a node. -v adds the engine's score. Exit status: 0 "
        "placed, 1 no node can take it or guests stay on the node, 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--guest", metavar="GUEST", help="an existing guest, by name or id: where should it be?"
    )
    what.add_argument(
        "--new",
        metavar="SPEC",
        help="a new guest: cpu=N,memory=SIZE[,kind=vm|ct][,arch=A][,name=N][,cpu_used=C]"
        "[,memory_used=SIZE][,priority=1-3]",
    )
    what.add_argument("--evacuate", metavar="NODE", help="place every guest of NODE elsewhere")
    p.add_argument(
        "--failed",
        action="store_true",
        help="the guest's node (or NODE) has failed: recovery rules (restart elsewhere)",
    )
    add_format_option(p)
    add_verbose_option(p)
    p.set_defaults(func=cmd_place)
