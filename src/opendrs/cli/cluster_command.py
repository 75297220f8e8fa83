"""``opendrs validate``, ``show`` and ``place``: a snapshot file read, checked and looked at."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from opendrs.cli.arguments import Subcommands
from opendrs.cli.output import add_format_option, dump_json, new_console
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, UsageError
from opendrs.engine.breaks import rule_breaks
from opendrs.engine.constraints import Constraints, movability, platform_balancer
from opendrs.engine.placement import Evacuation, evacuate, place_guest, place_new
from opendrs.engine.planner import Plan
from opendrs.engine.policy import repair, stuck_now, warn_stuck
from opendrs.engine.strategies.base import cluster_imbalance, imbalance_by_arch
from opendrs.engine.usage import LoadModel
from opendrs.model.cluster import GUEST_KINDS, Cluster, Guest, Move
from opendrs.model.document import DocumentError, closest, parse, read_file
from opendrs.model.snapshot import MAX_BYTES, MAX_CORES, from_dict, load_demo
from opendrs.model.units import UnitError, parse_bytes
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
    if (args.snapshot is None) == (args.config is None):
        raise UsageError("validate: give a SNAPSHOT or --config FILE (one of them)")
    if args.config is not None:
        from opendrs.cli.config_command import validate_config  # the controller's reader

        return validate_config(args.config, args.format)
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
            print(
                f"{args.snapshot}: valid ({len(cluster.nodes)} nodes, "
                f"{len(cluster.guests)} guests, {n_rules} rules{ignored})"
            )
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


#: The keys of ``place --new``'s SPEC.
_NEW_GUEST_KEYS = (
    "arch",
    "cpu",
    "cpu_used",
    "id",
    "kind",
    "memory",
    "memory_used",
    "name",
    "priority",
)


def _new_guest_fields(spec: str) -> dict[str, str]:
    """``place --new``'s SPEC as key → value: each key known (else "did you mean") and given
    once."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UsageError(f"--new: {part!r} is not key=value (example: cpu=4,memory=8GiB)")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in _NEW_GUEST_KEYS:
            meant = closest(key, _NEW_GUEST_KEYS)
            hint = f"did you mean {meant!r}?" if meant else f"known: {', '.join(_NEW_GUEST_KEYS)}"
            raise UsageError(f"--new: unknown key {key!r} ({hint})")
        if key in fields:
            raise UsageError(f"--new: {key} is given twice ({fields[key]!r} and {value!r})")
        fields[key] = value
    return fields


def _parse_new(spec: str) -> Guest:
    """``cpu=4,memory=8GiB[,kind=ct][,arch=aarch64][,name=web9][,id=900]`` -> Guest."""
    fields = _new_guest_fields(spec)
    if "memory" not in fields:
        raise UsageError("--new: memory is required (example: cpu=4,memory=8GiB)")

    def number(key: str, default: str) -> float:
        text = fields.get(key, default)
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"--new: {key}: {text!r} is not a number") from None
        if not 0 <= value < float("inf"):
            raise UsageError(f"--new: {key}: must be a finite number ≥ 0")
        return value

    def size(key: str) -> int | None:
        if key not in fields:
            return None
        _refuse_bare_size(key, fields[key])
        try:
            value = parse_bytes(fields[key])
        except UnitError as exc:
            raise UsageError(f"--new: {key}: {exc}") from None
        if value > MAX_BYTES:
            raise UsageError(f"--new: {key}: size too large (at most 8 PiB)")
        return value

    cpu = number("cpu", "1")
    if not 0 < cpu <= 100_000:
        raise UsageError("--new: cpu: must be a positive number of vCPUs, at most 100000")
    memory = size("memory") or 0
    if memory <= 0:
        raise UsageError("--new: memory: must be greater than 0")
    cpu_used = number("cpu_used", "0") if "cpu_used" in fields else None
    if cpu_used is not None and cpu_used > MAX_CORES:
        raise UsageError(f"--new: cpu_used: must be at most {MAX_CORES} cores")
    memory_used = size("memory_used")
    priority = fields.get("priority", "2")
    if priority not in ("1", "2", "3"):
        raise UsageError("--new: priority: must be 1, 2 or 3")
    kind = fields.get("kind", "vm")
    if kind not in GUEST_KINDS:
        raise UsageError(f"--new: kind must be one of {', '.join(GUEST_KINDS)}")
    return Guest(
        id=fields.get("id", "new"),
        node="",
        kind=kind,  # type: ignore[arg-type]
        name=fields.get("name", ""),
        cpu=cpu,
        memory=memory,
        cpu_used=cpu_used,
        memory_used=memory_used,
        arch=fields.get("arch"),
        priority=int(priority),
    )


def _refuse_bare_size(key: str, text: str) -> None:
    """A size without a unit is refused: Proxmox writes memory in MiB, a snapshot in bytes, so a
    bare ``memory=4096`` means either; the hint names both readings' spellings."""
    try:
        number = float(text)
    except ValueError:
        return  # a unit, or not a size: parse_bytes says which
    if not math.isfinite(number):
        return
    larger = f"{number / 1024:g}G" if number >= 1024 else "8G"
    raise UsageError(
        f"--new: {key}={text}: give a unit, e.g. {number:g}M or {larger} ({number:g}B for bytes)"
    )


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
            show_evacuation(report, result)
            if plan is not None:
                show_plan(report, plan)
        return EXIT_PROBLEM if result.stuck else EXIT_OK
    if args.guest is not None:
        if args.guest not in cluster.guest_index:
            raise UsageError(f"--guest: no guest {args.guest!r} in {args.snapshot}")
        placement = place_guest(cluster, args.guest, "recover" if args.failed else "balance")
    else:
        if args.failed:
            raise UsageError("--failed goes with --guest or --evacuate, not --new")
        placement = place_new(cluster, _parse_new(args.new))
    if args.format == "json":
        dump_json(placement.as_dict())
    else:
        show_placement(report, placement)
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
    warn_stuck(tuple((g.id, stuck[g.id]) for g in on_node if g.id in stuck))
    if fixed.plan is None:
        return greedy, None
    final = {m.guest: m.target for m in fixed.plan.moves}
    left = [g for g in on_node if final.get(g.id, node) == node]
    if len(left) >= len(greedy.stuck):
        return greedy, None
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
        description="SNAPSHOT: check the snapshot and its rules (a rule set aside for another "
        "is a warning). --config FILE: check a configuration as 'opendrs run' reads it, a "
        "problem in each section it has one in, and say what it would make opendrs do. One "
        "line per problem: file, field, reason. Exit status: 0 valid, 2 a problem.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT", nargs="?", help="a snapshot, or 'demo'")
    p.add_argument("--config", metavar="FILE", help="a configuration file to check instead")
    add_format_option(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "show",
        help="nodes with load bars, guests per node, imbalance figures, rules broken now",
        description="Show a snapshot: each node's CPU and memory load as bars, the guests on "
        "each node, the spread and other imbalance figures, and the rules broken now. Nothing "
        "is planned or moved. Exit status: 0 shown, 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    p.add_argument("--no-guests", action="store_true", help="leave out the guest table")
    add_format_option(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "place",
        help="rank the nodes for a guest, a new guest, or every guest of a node to evacuate",
        description="Rank the nodes that could take a guest (an existing one, a new one "
        "described by --new, or every guest of a node to evacuate), best first, each with the "
        "cluster's balance after it and the soft rules it would break, then the nodes that "
        "capacity or a hard rule excludes, each with why. A memory size needs a unit (4G, "
        "4096M). Exit status: 0 placed, 1 no node takes the guest (or a guest of NODE), 2 bad "
        "input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--guest", metavar="ID", help="an existing guest: where should it be?")
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
    p.set_defaults(func=cmd_place)
