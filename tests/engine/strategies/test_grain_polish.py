"""balance's last phase: a spread below one step on the smallest node (``grain_polish``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import assert_moves_safe, clusters
from opendrs.engine.constraints import current_assign
from opendrs.engine.imbalance import balance_objective, resource_weights
from opendrs.engine.strategies.balance.options import BalanceOptions
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.usage import RESOURCES, LoadModel
from opendrs.model.cluster import Cluster, Guest, Node, Settings
from opendrs.model.rules import NodeAffinity, Rules

GiB = 1024**3
BOTH = Settings(mode="static", cpu_overcommit=8.0)
MEMORY_ONLY = Settings(mode="static", weight_cpu=0.0, weight_memory=1.0, cpu_overcommit=8.0)
#: The vCPU commitments' goal one vCPU on the smallest node (not the default 100 pp): what the
#: polish below the grain is for.
TIGHT = BalanceOptions(cpu_commit_spread=0.0)


def _cluster(
    *, extra_on_d: int = 0, settings: Settings = BOTH, rules: Rules | None = None
) -> Cluster:
    """Two 4-core nodes at 4 vCPUs, two 8-core ones at 9 and 7: a CPU spread of 25 pp, one vCPU
    on the smallest node (the goal of the search: it makes no move), memory even (50 % each).
    Within 1 pp, every node must carry one vCPU per core: c must give d one vCPU — not by a
    move (2 GiB would leave the memory 12.5 pp apart) but by exchanging its 2-vCPU guest for
    d's 1-vCPU guest of the same memory."""
    nodes = (
        Node("a", 4, 16 * GiB),
        Node("b", 4, 16 * GiB),
        Node("c", 8, 32 * GiB),
        Node("d", 8, 32 * GiB),
    )
    guests = [Guest(f"a{i}", "a", cpu=1, memory=2 * GiB) for i in range(4)]
    guests += [Guest(f"b{i}", "b", cpu=1, memory=2 * GiB) for i in range(4)]
    guests += [Guest("c-two", "c", cpu=2, memory=2 * GiB)]
    guests += [Guest(f"c{i}", "c", cpu=1, memory=2 * GiB) for i in range(7)]
    guests += [Guest("d-two-gib", "d", cpu=1, memory=2 * GiB)]
    guests += [Guest(f"d{i}", "d", cpu=1, memory=9 * GiB // 4) for i in range(5)]
    guests += [Guest("d-last", "d", cpu=1 + extra_on_d, memory=11 * GiB // 4)]
    return Cluster(nodes, tuple(guests), rules or Rules(), settings)


def _objective(cluster: Cluster, assign: np.ndarray) -> float:
    loads = LoadModel.build(cluster)
    group = np.zeros(len(cluster.nodes), dtype=np.intp)
    weights = resource_weights(cluster.settings)
    return float(balance_objective(loads.loads(assign), loads.capacity, weights, group))


def test_an_exchange_of_one_vcpu_brings_the_cpu_within_the_target() -> None:
    cluster = _cluster()
    proposal = propose_balance(cluster, TIGHT)
    moves = sorted((m.guest, m.target) for m in proposal.net_moves())
    assert moves == [("c-two", "d"), ("d-two-gib", "c")]
    assert {m.reason for m in proposal.moves} == {"balance (below the grain)"}
    assert proposal.after.resources["cpu"].spread == 0.0
    assert proposal.after.resources["memory"].spread == 0.0
    assert proposal.stopped.startswith("balanced")
    assert "cpu below one step on the smallest node (1.00 pp): within it" in proposal.stopped
    assign = assert_moves_safe(cluster, proposal.net_moves())
    assert _objective(cluster, assign) <= _objective(cluster, current_assign(cluster))
    assert proposal.as_dict() == propose_balance(cluster, TIGHT).as_dict()


def test_without_a_window_the_grain_stays_the_goal() -> None:
    # One vCPU more on d: 25 vCPUs, and within 1 pp the nodes would need 6k of them.
    proposal = propose_balance(_cluster(extra_on_d=1), TIGHT)
    assert proposal.moves == ()
    assert proposal.stopped.startswith("balanced")
    assert "no window where whole steps per node add up to the total" in proposal.stopped
    assert "its goal stays one step (25.00 pp)" in proposal.stopped


def test_a_hard_rule_that_blocks_every_step_leaves_the_plan_as_it_was() -> None:
    # The 2-vCPU guest may not leave c: no move or exchange keeps the memory within 1 pp.
    rules = Rules(node_affinity=(NodeAffinity("pin", ("c-two",), {"c": 1}, strict=True),))
    proposal = propose_balance(_cluster(rules=rules), TIGHT)
    assert proposal.moves == ()
    assert proposal.stopped.startswith("balanced")
    assert "the window was not reached (2 nodes left outside it" in proposal.stopped
    assert proposal.after.resources["cpu"].spread == 0.25


def test_without_exchanges_only_moves_are_tried() -> None:
    proposal = propose_balance(_cluster(), BalanceOptions(swaps=False, cpu_commit_spread=0.0))
    assert proposal.moves == ()
    assert "the window was not reached" in proposal.stopped


def test_a_memory_only_balance_leaves_the_cpu_alone() -> None:
    proposal = propose_balance(_cluster(settings=MEMORY_ONLY), TIGHT)
    assert proposal.moves == ()
    assert "below one step" not in proposal.stopped


def test_max_moves_caps_the_polish() -> None:
    # The exchange needs two migrations: with one allowed it is not made.
    proposal = propose_balance(_cluster(), BalanceOptions(max_moves=1, cpu_commit_spread=0.0))
    assert proposal.moves == ()
    assert "the window was not reached" in proposal.stopped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(max_nodes=6, max_guests=30), st.sampled_from(["static", "basic"]))
def test_a_polished_resource_is_within_the_target_and_every_step_safe(
    cluster: Cluster, mode: str
) -> None:
    cluster = replace(cluster, settings=replace(cluster.settings, mode=mode))
    proposal = propose_balance(cluster, TIGHT)
    assign = assert_moves_safe(cluster, proposal.net_moves())
    loads = LoadModel.build(cluster)
    f = loads.fractions(assign)
    usable = np.array([n.usable for n in cluster.nodes]) & np.all(loads.capacity > 0, axis=1)
    for r, name in enumerate(RESOURCES):
        if (
            f"{name} below one step on the smallest node (1.00 pp): within it"
            not in proposal.stopped
        ):
            continue
        for arch in {n.arch for n in cluster.nodes}:
            group = usable & np.array([n.arch == arch for n in cluster.nodes])
            if group.sum() >= 2:
                assert np.ptp(f[group, r]) <= 0.01 + 1e-9
