"""``opendrs maintenance enter|leave NODE --config FILE``: a node into the platform's maintenance,
or out of it, through the configured backend.

The platform does the work: on Incus (and LXD) ``enter`` is the member's evacuation — Incus moves
its instances to other members (or stops them, as each instance's ``cluster.evacuate`` says) —
and ``leave`` its restore, which brings them back; the command returns when the platform has
finished. It needs a backend with the hook :class:`~opendrs.backends.base.PlatformMaintenance`;
for any other (Proxmox VE, whose API has no call for it; the simulator; a file) it says so in one
line.

It acts whatever the configuration's ``mode`` says: an evacuation is an explicit request, not a
decision of the policy. The daemon, if it runs, sees the node in maintenance at its next
observation and plans around it.

The cluster is observed before and after: a node the cluster does not have is refused before
anything is asked, a node already in the state asked for is left alone, and the report lists the
guests that changed node meanwhile and those still on the node.

Exit status: 0 done (or nothing to do); 1 the cluster could not be observed or the platform
failed (one line, ``error: …``); 2 a bad configuration, an unknown node or a backend without the
hook.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opendrs.backends.base import Backend, BackendError, PlatformMaintenance
from opendrs.cli.arguments import Subcommands
from opendrs.cli.config_file import add_config_option
from opendrs.cli.process import EXIT_OK, EXIT_PROBLEM, UsageError, setup_logging
from opendrs.json_data import json_text
from opendrs.model.cluster import Cluster

__all__ = ["add_maintenance_parser", "cmd_maintenance"]

#: What to do instead, for backends without the hook.
_ELSEWHERE: Final = {
    "proxmox": "Proxmox VE's API has no call for node maintenance: run "
    "'ha-manager crm-command node-maintenance {verb} {node}' on a cluster node",
    "sim": "the simulator's maintenance comes from its scenario",
    "file": "a snapshot file is read-only",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``maintenance enter|leave`` did."""

    node: str
    action: str
    #: False when the node already was in the state asked for.
    changed: bool
    maintenance: bool
    seconds: float
    #: (guest, from, to) of each guest that changed node, by guest id.
    moved: tuple[tuple[str, str, str], ...]
    #: Guests on the node afterwards.
    on_node: tuple[str, ...]
    #: How an operator knows each guest above (``name (id)``), by guest id; JSON keeps the ids.
    labels: Mapping[str, str] = field(default_factory=dict)

    def label(self, guest_id: str) -> str:
        return self.labels.get(guest_id, guest_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "action": self.action,
            "changed": self.changed,
            "maintenance": self.maintenance,
            "seconds": round(self.seconds, 3),
            "moved": [{"guest": g, "from": a, "to": b} for g, a, b in self.moved],
            "on_node": list(self.on_node),
        }


def _hook(backend: Backend, config_path: str, node: str, enter: bool) -> PlatformMaintenance:
    if isinstance(backend, PlatformMaintenance):
        return backend
    hint = _ELSEWHERE.get(backend.name, "")
    hint = hint.format(verb="enable" if enter else "disable", node=node)
    raise UsageError(
        f"{config_path}: backend {backend.name}: opendrs cannot put a node into maintenance "
        f"through it (the incus backend can){f': {hint}' if hint else ''}"
    )


def _check_node(cluster: Cluster, node: str) -> None:
    if node not in cluster.node_index:
        names = ", ".join(n.name for n in cluster.nodes)
        raise UsageError(f"NODE: no node {node!r} in the cluster (its nodes: {names})")


def _observe(backend: Backend, when: str = "") -> Cluster:
    try:
        return backend.observe()
    except BackendError as exc:
        raise BackendError(f"{when}cannot observe the cluster: {exc}") from None


def _moved(before: Cluster, after: Cluster) -> tuple[tuple[str, str, str], ...]:
    was = {g.id: g.node for g in before.guests}
    return tuple(
        (g.id, was[g.id], g.node) for g in after.guests if g.id in was and was[g.id] != g.node
    )


def _labels(cluster: Cluster) -> dict[str, str]:
    return {g.id: g.label for g in cluster.guests}


def run_maintenance(backend: Backend, config_path: str, node: str, enter: bool) -> Outcome:
    """Put ``node`` into maintenance (``enter``) or take it out, through ``backend``'s hook.

    Raises :class:`UsageError` (an unknown node, a backend without the hook) or
    :class:`BackendError`.
    """
    hook = _hook(backend, config_path, node, enter)
    action, verb = ("enter", "evacuation") if enter else ("leave", "restore")
    before = _observe(backend)
    _check_node(before, node)
    if before.node(node).maintenance == enter:
        on_node = tuple(g.id for g in before.guests if g.node == node)
        return Outcome(node, action, False, enter, 0.0, (), on_node, _labels(before))
    started = time.monotonic()
    try:
        if enter:
            hook.evacuate(node)
        else:
            hook.restore(node)
    except BackendError as exc:
        raise BackendError(f"the platform's {verb} failed: {exc}") from None
    seconds = time.monotonic() - started
    after = _observe(backend, f"the {verb} is done, but afterwards ")
    on_node = tuple(g.id for g in after.guests if g.node == node)
    labels = _labels(before) | _labels(after)
    moved = _moved(before, after)
    return Outcome(
        node, action, True, after.node(node).maintenance, seconds, moved, on_node, labels
    )


def show_outcome(outcome: Outcome) -> str:
    """The text report."""
    state = "in maintenance" if outcome.maintenance else "out of maintenance"
    if not outcome.changed:
        already = "already in maintenance" if outcome.maintenance else "not in maintenance"
        return f"node {outcome.node} is {already}: nothing done\n"
    verb = "evacuated" if outcome.action == "enter" else "restored"
    lines = [f"node {outcome.node}: {state} ({verb} by the platform in {outcome.seconds:.1f} s)"]
    moved = [(outcome.label(g), a, b) for g, a, b in outcome.moved]
    width = max((len(g) for g, _, _ in moved), default=0)
    lines += [f"  {g:<{width}}  {a} → {b}" for g, a, b in moved]
    if not outcome.moved:
        lines.append("  no guest changed node")
    if outcome.action == "enter" and outcome.on_node:
        # Instances the platform stops rather than moves (Incus: cluster.evacuate=stop).
        left = ", ".join(outcome.label(g) for g in outcome.on_node)
        lines.append(f"  left on {outcome.node}: {left}")
    return "\n".join(lines) + "\n"


def cmd_maintenance(args: argparse.Namespace) -> int:
    # imported when the command runs: the controller is large
    from opendrs.controller.config import load_config

    config = load_config(args.config)
    setup_logging(config.log_level)
    enter = args.action == "enter"
    backend, _ = config.make_backend()
    try:
        outcome = run_maintenance(backend, args.config, args.node, enter)
    except BackendError as exc:
        print(f"error: node {args.node}: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    finally:
        backend.close()
    if args.format == "json":
        sys.stdout.write(json_text(outcome.as_dict()) + "\n")
    else:
        sys.stdout.write(show_outcome(outcome))
    return EXIT_OK


def add_maintenance_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "maintenance",
        help="put a node into the platform's maintenance (evacuate it) or take it out (restore)",
        description="Put NODE into maintenance or take it out through the configured backend, "
        "which must be one whose platform does it (incus: Incus's and LXD's evacuate and "
        "restore; not proxmox). 'enter' evacuates the node: the platform moves its guests "
        "elsewhere; 'leave' restores it and the platform brings them back. It acts whatever "
        "the configuration's mode (shadow or active) says: this is an explicit request, not a "
        "decision of the policy. It waits until the platform has finished and lists the guests "
        "that changed node. Exit status: 0 done or nothing to do, 1 the cluster could not be "
        "observed or the platform failed, 2 a bad configuration, an unknown node or a backend "
        "that cannot.",
    )
    p.add_argument("action", choices=("enter", "leave"), help="enter or leave maintenance")
    p.add_argument("node", metavar="NODE", help="the node (an Incus member)")
    add_config_option(p)
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    p.set_defaults(func=cmd_maintenance)
