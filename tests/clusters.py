"""Hypothesis strategies for random clusters, shared by the property tests."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from hypothesis import strategies as st

from opendrs.engine.constraints import Constraints, committed_for, current_assign
from opendrs.engine.strategies.base import ProposedMove
from opendrs.model.cluster import Cluster, Disk, Guest, Move, Node, Settings
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

GiB = 1024**3


@st.composite
def clusters(draw: st.DrawFn, max_nodes: int = 6, max_guests: int = 24) -> Cluster:
    """A random cluster: mixed node sizes and states, guests of any kind, random rules."""
    n_nodes = draw(st.integers(2, max_nodes))
    nodes = []
    for i in range(n_nodes):
        nodes.append(
            Node(
                f"n{i}",
                cpu=draw(st.sampled_from([2, 4, 8, 16, 32])),
                memory=draw(st.sampled_from([4, 8, 16, 32, 64])) * GiB,
                storage={"local": draw(st.sampled_from([0, 50, 200])) * GiB},
                arch=draw(st.sampled_from(["x86_64", "x86_64", "x86_64", "aarch64"])),
                online=draw(st.booleans() | st.just(True)),
                maintenance=draw(st.sampled_from([False, False, False, True])),
                reserve_memory=draw(st.sampled_from([None, GiB])),
            )
        )
    n_guests = draw(st.integers(1, max_guests))
    guests = []
    for j in range(n_guests):
        node = draw(st.sampled_from(nodes))
        cpu = draw(st.sampled_from([1, 2, 4, 8]))
        memory = draw(st.sampled_from([1, 2, 4, 8, 16])) * GiB
        guests.append(
            Guest(
                str(100 + j),
                node.name,
                kind=draw(st.sampled_from(["vm", "vm", "ct"])),
                state=draw(st.sampled_from(["running", "running", "running", "stopped"])),
                cpu=cpu,
                memory=memory,
                cpu_used=draw(st.none() | st.floats(0, cpu)),
                memory_used=draw(st.none() | st.integers(0, memory)),
                disks=draw(st.sampled_from([(), (), (Disk("local", 10 * GiB),)])),
                uptime=3600,
                lock=draw(st.sampled_from([None, None, None, "backup"])),
            )
        )
    ids = [g.id for g in guests]
    names = [n.name for n in nodes]
    guest_rules = []
    for k in range(draw(st.integers(0, 3)) if len(ids) >= 2 else 0):
        members = draw(st.lists(st.sampled_from(ids), min_size=2, max_size=4, unique=True))
        if len(members) >= 2:
            guest_rules.append(
                GuestAffinity(
                    f"g{k}", tuple(members), positive=draw(st.booleans()), hard=draw(st.booleans())
                )
            )
    node_rules = []
    for k in range(draw(st.integers(0, 2))):
        members = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True))
        allowed = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        node_rules.append(
            NodeAffinity(
                f"na{k}",
                tuple(members),
                {n: draw(st.integers(0, 2)) for n in allowed},
                strict=draw(st.booleans()),
            )
        )
    ignored = frozenset(draw(st.lists(st.sampled_from(ids), max_size=2)))
    settings = Settings(
        mode=draw(st.sampled_from(["basic", "static", "dynamic"])),
        cpu_overcommit=draw(st.sampled_from([1.0, 2.0, 4.0])),
        allow_restart_migration=draw(st.booleans()),
        allow_local_disks=draw(st.booleans()),
    )
    return Cluster(
        tuple(nodes),
        tuple(guests),
        Rules(tuple(node_rules), tuple(guest_rules), ignored),
        settings,
    )


def assert_moves_safe(cluster: Cluster, moves: Iterable[Move | ProposedMove]) -> np.ndarray:
    """Apply ``moves`` in order and check the result; return the final node index per guest.

    No node may end over a capacity limit it was not over before, every target must pass the
    static constraints (usable node, architecture, strict node affinity), and no guest may end on
    a node with a hard anti-affinity partner (a guest moved twice is judged where it ends).
    """
    moves = list(moves)
    cons = Constraints.build(cluster)
    assign = current_assign(cluster)
    over_before = cons.capacity.over(committed_for(cons, assign)).any(axis=1)
    for move in moves:
        assign[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    over_after = cons.capacity.over(committed_for(cons, assign)).any(axis=1)
    assert not (over_after & ~over_before).any()
    for move in moves:
        assert cons.static_ok()[cluster.guest_index[move.guest], cluster.node_index[move.target]]
    final = {move.guest: move.target for move in moves}  # a guest moved twice ends at its last
    for guest, target in final.items():
        j, n = cluster.guest_index[guest], cluster.node_index[target]
        assert not (assign[cons.hard_neg[j]] == n).any()
    return assign
