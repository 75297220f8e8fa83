"""The placements the policy's guards rule out at a time: cooldown, minimum uptime, no-return,
targets avoided after a failed migration, and nodes seen running hot."""

from __future__ import annotations

from collections.abc import Mapping

from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.policy.state import PastMigrations
from opendrs.engine.usage import loaded_nodes
from opendrs.model.cluster import Cluster, Guest


def forbidden_placements(
    cluster: Cluster, now: float, config: PolicyConfig, past: PastMigrations
) -> frozenset[tuple[str, str]]:
    """The (guest, node) placements the guards rule out at ``now``.

    A guest in cooldown (``past.cooldown_until`` after ``now``) or up for less than
    ``config.min_uptime`` may go to no node but its own; a guest may not go back to a node it left
    less than ``config.no_return`` seconds ago; ``past.avoid`` entries hold until their time.
    Guests and nodes the cluster does not have are left out.
    """
    names = [n.name for n in cluster.nodes]
    out: set[tuple[str, str]] = set()
    known = cluster.guest_index
    node_known = cluster.node_index

    def pin(guest: Guest) -> None:
        out.update((guest.id, n) for n in names if n != guest.node)

    for guest_id, until in past.cooldown_until.items():
        if until > now and guest_id in known:
            pin(cluster.guests[known[guest_id]])
    if config.min_uptime > 0:
        for guest in cluster.guests:
            if loaded_nodes(guest) and guest.uptime < config.min_uptime:
                pin(guest)
    if config.no_return > 0:
        for guest_id, left in past.departures.items():
            if guest_id not in known:
                continue
            for node, when in left:
                if now - when < config.no_return and node in node_known:
                    out.add((guest_id, node))
    return frozenset(out) | failed_targets(cluster, now, past)


def hot_targets(cluster: Cluster, hot_seen: Mapping[str, float]) -> frozenset[tuple[str, str]]:
    """The placements onto a node seen running hot lately (``hot_seen``,
    :attr:`PolicyState.hot_seen`), for every guest not on it: a node that ran hot may run hot
    again — where loads take turns, the node idle now is the next to — so no plan and no relief
    fills it meanwhile (but a relief with no other target, as its last resort), and no relief of
    one turn is undone by the next."""
    names = [n for n in hot_seen if n in cluster.node_index]
    return frozenset((g.id, n) for g in cluster.guests for n in names if g.node != n)


def failed_targets(
    cluster: Cluster, now: float, past: PastMigrations
) -> frozenset[tuple[str, str]]:
    """The placements only a failed migration rules out (``past.avoid``), at ``now``."""
    known, nodes = cluster.guest_index, cluster.node_index
    return frozenset(
        (guest, node)
        for (guest, node), until in past.avoid.items()
        if until > now and guest in known and node in nodes
    )
