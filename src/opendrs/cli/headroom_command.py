"""``opendrs headroom SNAPSHOT|--config FILE [--failures K] [--recovery HOW]``: the failover
headroom — if any node (any ``K`` nodes) fails, can every HA guest restart on the nodes left,
within capacity and the rules? (:mod:`opendrs.engine.headroom` says how it is checked.)

A snapshot (or ``demo``) is read as ``show`` and ``plan`` read it; ``--config FILE`` (by default,
with no snapshot, the default configuration) observes the live cluster once, as ``opendrs
snapshot`` and ``status`` do. ``--recovery`` says how the failed nodes' HA guests restart (the
values of ``policy.failover_recovery``); by default, the configuration's ``failover_recovery``
with ``--config``, else ``auto`` (the snapshot's ``ha_scheduler``, ``best-fit`` without one).

Exit status: 0 the cluster has the headroom (every HA guest restarts in every case); 1 it has not
(or the cluster could not be observed); 2 bad input.
"""

from __future__ import annotations

import argparse
import sys

from opendrs.backends.base import BackendError
from opendrs.cli.arguments import Subcommands, at_least_one
from opendrs.cli.config_file import DEFAULT_CONFIG, existing_default_config
from opendrs.cli.output import add_format_option, dump_json, new_console
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, UsageError, setup_logging
from opendrs.engine.headroom import MAX_CASES, failover_headroom
from opendrs.engine.policy.config import FAILOVER_RECOVERIES
from opendrs.engine.policy.failover import recovery_for
from opendrs.model.cluster import Cluster

__all__ = ["add_headroom_parser", "cmd_headroom"]


def _cluster(args: argparse.Namespace) -> tuple[Cluster, str]:
    """The cluster, and the ``failover_recovery`` setting to judge it by."""
    if args.snapshot is not None and args.config is not None:
        raise UsageError("headroom: give a SNAPSHOT or --config FILE (one of them)")
    if args.snapshot is not None:
        from opendrs.cli.cluster_command import read_cluster

        return read_cluster(args.snapshot), args.recovery or "auto"
    from opendrs.cli.snapshot_command import observe_once
    from opendrs.controller.config import load_config

    config = load_config(args.config or existing_default_config())
    setup_logging(config.log_level)
    return observe_once(config), args.recovery or config.policy.failover_recovery


def cmd_headroom(args: argparse.Namespace) -> int:
    try:
        cluster, setting = _cluster(args)
    except BackendError as exc:
        print(f"error: cannot observe the cluster: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    online = sum(1 for n in cluster.nodes if n.online)
    if args.failures >= online:
        raise UsageError(
            f"--failures {args.failures}: the cluster has {online} online node"
            f"{'' if online == 1 else 's'}: at most {max(online - 1, 0)} can fail with one left"
        )
    recovery = recovery_for(setting, cluster)
    headroom = failover_headroom(cluster, args.failures, recovery)
    if args.format == "json":
        dump_json({"cluster": cluster.name, "recovery": recovery, **headroom.as_dict()})
    else:
        from opendrs.report.headroom import headroom_lines

        lines = headroom_lines(cluster, headroom, width=new_console().width)
        sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_OK if headroom.ok else EXIT_PROBLEM


def add_headroom_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "headroom",
        help="failover headroom: can every HA guest restart if any node (any K nodes) fails?",
        description="For each online node (each K nodes with --failures K) failing, restart "
        "its HA guests that run on the other nodes, biggest first (configured memory), each on "
        "the best node capacity and the rules allow (anti-affinity, node affinity, pins, local "
        "disks), or as Proxmox VE's HA manager places them (--recovery), and say which cannot "
        "restart. HA guests are those "
        "the platform manages (Proxmox VE's HA resources); a cluster with none counts every "
        "running guest. Every combination of K nodes is checked up to "
        f"{MAX_CASES}; beyond, the {MAX_CASES} whose nodes carry the most HA memory. "
        "Exit status: 0 every HA guest restarts in every case, 1 not (or the cluster could "
        "not be observed), 2 bad input.",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT", nargs="?", help="a snapshot, or 'demo'")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a configuration: observe its live cluster (with no SNAPSHOT, the default "
        f"configuration: {DEFAULT_CONFIG}, or $OPENDRS_CONFIG)",
    )
    p.add_argument(
        "--failures",
        type=at_least_one,
        default=1,
        metavar="K",
        help="nodes failing at once (default 1)",
    )
    p.add_argument(
        "--recovery",
        choices=FAILOVER_RECOVERIES,
        help="how the HA guests restart: best-fit (the best node with room, biggest first), "
        "pve-basic or pve-static (Proxmox VE's HA manager in that scheduler mode), auto (the "
        "mode the Proxmox cluster's crs option sets, or the snapshot's ha_scheduler, else "
        "best-fit); default: the "
        "configuration's policy.failover_recovery, auto for a snapshot",
    )
    add_format_option(p)
    p.set_defaults(func=cmd_headroom)
