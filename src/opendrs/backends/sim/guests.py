"""Every guest's state in the simulator: where it is, whether it runs, what it loads
(:class:`GuestBooks`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from opendrs.engine.usage import loaded_nodes
from opendrs.model.cluster import Cluster, Guest

from .migration import Migration

__all__ = ["GuestBooks"]


class GuestBooks:
    """The simulator's books of the guests, by index in the snapshot: what changes (node, state,
    HA state, the migration in flight, being down) and what never does (size, local disks per
    pool of ``pools``, devices, kind, architecture). Mutable."""

    def __init__(self, cluster: Cluster, pools: list[str], node_index: Mapping[str, int]) -> None:
        guests = cluster.guests
        n_guests = len(guests)
        self.node_index = node_index
        self.ids = [g.id for g in guests]
        self.index = dict(cluster.guest_index)
        self.ha = [g.ha for g in guests]
        self.ha_state0 = [g.ha_state for g in guests]
        self.ha_state = list(self.ha_state0)
        self.state = [g.state for g in guests]
        self.node = np.array([node_index[g.node] for g in guests], dtype=np.int64)
        self.node_names = [g.node for g in guests]
        #: The node each guest is migrating to, and its migration.
        self.targets: list[str | None] = [None] * n_guests
        self.migration_of: list[Migration | None] = [None] * n_guests
        self.down = np.zeros(n_guests, dtype=bool)
        #: Who put it where it is: the controller (by a migration), or the platform (restarted
        #: there by HA recovery, moved there by a failback or a migration in flight in the
        #: snapshot); neither: it was there at the start.
        self.by_controller = np.zeros(n_guests, dtype=bool)
        self.by_platform = np.zeros(n_guests, dtype=bool)
        #: When it got there by a migration (-inf: it has not moved).
        self.arrived = np.full(n_guests, -np.inf)
        self.uptime_offset = np.array([float(g.uptime) for g in guests])
        self.up = np.zeros(n_guests)
        #: Nodes each guest loads (``loaded_nodes``), and nodes its local disks occupy.
        self.load_nodes: list[tuple[int, ...]] = [()] * n_guests
        self.hold_nodes: list[tuple[int, ...]] = [()] * n_guests
        self.cfg = np.array([[g.cpu, float(g.memory)] for g in guests], dtype=np.float64).reshape(
            n_guests, 2
        )
        pool_col = {p: i for i, p in enumerate(pools)}
        self.disks = np.zeros((n_guests, len(pools)))
        for j, g in enumerate(guests):
            for d in g.disks:
                if d.local:
                    self.disks[j, pool_col[d.pool]] += float(d.size)
        self.local_bytes = [g.local_disk_bytes for g in guests]
        self.devices = [g.devices for g in guests]
        self.kind = [g.kind for g in guests]
        #: The architecture each guest needs (its own, else its node's at the start): it never
        #: moves to a node of another.
        self.arch = [cluster.guest_arch(g) for g in guests]
        #: Guests down with their failed node, waiting for HA recovery, and since when.
        self.pending: set[int] = set()
        self.down_at = np.zeros(n_guests)
        #: Bumped when a guest's state changes; with its use, what decides rebuilding it.
        self.stamp = np.zeros(n_guests, dtype=np.int64)

    def refresh(self, j: int) -> None:
        """Recompute which nodes guest ``j`` loads, after its state changed."""
        status = Guest(
            self.ids[j],
            self.node_names[j],
            state=self.state[j],  # type: ignore[arg-type]
            ha=self.ha[j],
            ha_state=self.ha_state[j],
            migrating_to=self.targets[j],
        )
        loaded = loaded_nodes(status)
        index = self.node_index
        self.load_nodes[j] = tuple(index[name] for name in loaded)
        self.hold_nodes[j] = tuple(index[name] for name in dict.fromkeys((status.node, *loaded)))
        self.up[j] = 0.0 if self.state[j] == "stopped" else 1.0
        self.stamp[j] += 1

    def take_down(self, j: int, now: float) -> None:
        """Guest ``j`` stops at ``now`` because its node failed."""
        self.down[j] = True
        self.down_at[j] = now
        self.state[j] = "stopped"
        if self.ha[j]:
            self.pending.add(j)
            if self.ha_state0[j] is not None:
                self.ha_state[j] = "fence"
        self.refresh(j)

    def restart(self, j: int, n: int, node_name: str, now: float) -> None:
        """Guest ``j`` starts (again) at ``now`` on node ``n`` (``node_name``), with uptime 0."""
        self.down[j] = False
        self.pending.discard(j)
        self.state[j] = "running"
        self.ha_state[j] = self.ha_state0[j]
        self.node[j] = n
        self.node_names[j] = node_name
        self.uptime_offset[j] = -now
        self.refresh(j)
