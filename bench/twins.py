"""Cheaper twins left behind: local-disk guests a plan moves where a guest that balances alike,
with no local disk, could have gone instead (#30).

``python -m bench.twins --generator mixed --sizes L XL --seeds 1 2 [--rules no|yes|both]``

prints one JSON line per cluster: the default strategy's (``balance``) moves, migration cost and
spreads, and :func:`twin_figures` of its placement.

A moved guest ``u`` (with a local disk, moving alone: no hard affinity partner) has a *cheaper
twin left behind* when a guest ``v``

- sat on ``u``'s source node and does not move,
- balances alike: the same balance load as ``u`` in every resource, exactly
  (:class:`~opendrs.engine.usage.LoadModel`, none for a guest that is not running; in the
  generated clusters' ``static`` mode, the same configured memory and vCPUs), so the loads after
  the plan are the same with ``v`` moved in ``u``'s place,
- costs less to move (:func:`~opendrs.engine.strategies.migration_cost`: no local disk to copy),
- is in no rule (no node or guest affinity, hard or soft) and may move (not held),
- and could take ``u``'s place: ``v`` allowed on ``u``'s target, ``u`` allowed where it is, no
  hard anti-affinity partner of ``u`` on its source after the plan, and both nodes within
  capacity with ``u`` and ``v`` exchanged.

Each twin stands in for one move only: the local-disk moves are taken most expensive first, each
matched with its cheapest twin, and the exchange is kept (capacity included) for the next one.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.clusters import GENERATORS, generated
from bench.generate import SIZES
from opendrs.engine.constraints import Constraints, committed_for, current_assign, movability
from opendrs.engine.strategies import get_strategy, migration_cost
from opendrs.engine.usage import LoadModel, loaded_nodes
from opendrs.model.cluster import Cluster


@dataclass(frozen=True)
class TwinFigures:
    """Local-disk moves of a plan and those with a cheaper twin left behind."""

    local_disk_moves: int
    with_twin: int
    #: ``with_twin`` over ``local_disk_moves`` (0 when there are none).
    with_twin_share: float
    #: The migration cost of the moves with a twin, over the plan's.
    twin_cost_share: float
    #: What moving the twins instead would save, over the plan's migration cost.
    avoidable_cost_share: float


def twin_figures(
    cluster: Cluster, placement: Mapping[str, str], constraints: Constraints | None = None
) -> TwinFigures:
    """:class:`TwinFigures` of moving ``cluster``'s guests to ``placement`` (guest id → node)."""
    cons = constraints if constraints is not None else Constraints.build(cluster)
    start = current_assign(cluster)
    assign = start.copy()
    for guest, node in placement.items():
        assign[cluster.guest_index[guest]] = cluster.node_index[node]
    cost = np.array([migration_cost(g, cluster.settings) for g in cluster.guests])
    moved = assign != start
    total = float(cost[moved].sum())
    local = np.array([g.local_disk_bytes > 0 for g in cluster.guests], dtype=bool)
    moves = np.flatnonzero(moved & local)
    matched = _matched(cluster, cons, start, assign, cost, moves)
    saved = sum(float(cost[u] - cost[v]) for u, v in matched)
    spent = sum(float(cost[u]) for u, _ in matched)
    return TwinFigures(
        local_disk_moves=int(moves.size),
        with_twin=len(matched),
        with_twin_share=len(matched) / moves.size if moves.size else 0.0,
        twin_cost_share=spent / total if total else 0.0,
        avoidable_cost_share=saved / total if total else 0.0,
    )


def _matched(
    cluster: Cluster,
    cons: Constraints,
    start: np.ndarray,
    assign: np.ndarray,
    cost: np.ndarray,
    moves: np.ndarray,
) -> list[tuple[int, int]]:
    """(moved guest, its twin) for each of ``moves`` that has one, most expensive first, each
    exchange kept in ``assign`` (a copy) for the next."""
    assign = assign.copy()
    running = np.array([bool(loaded_nodes(g)) for g in cluster.guests], dtype=bool)
    demand = np.where(running[:, None], LoadModel.build(cluster).demand, 0.0)
    ruled = _ruled(cons)
    free = np.array(
        [movability(g, cluster, "balance") is None and g.id not in ruled for g in cluster.guests]
    )
    candidate = free & (assign == start)
    committed = committed_for(cons, assign)
    static = cons.static_ok()
    ids = [g.id for g in cluster.guests]
    out: list[tuple[int, int]] = []
    for u in sorted(moves.tolist(), key=lambda j: (-cost[j], ids[j])):
        s, t = int(start[u]), int(assign[u])
        if cons.hard_pos[u].size or np.any(assign[cons.hard_neg[u]] == s) or not static[u, s]:
            continue
        alike = np.all(demand == demand[u], axis=1) & (cost < cost[u])
        twins = np.flatnonzero(candidate & alike & (assign == s))
        for v in sorted(twins.tolist(), key=lambda j: (cost[j], ids[j])):
            after = committed.copy()
            shift = cons.capacity.moving[u] - cons.capacity.moving[v]
            after[s] += shift
            after[t] -= shift
            if static[v, t] and not cons.capacity.over(after)[[s, t]].any():
                assign[u], assign[v] = s, t
                committed = after
                candidate[v] = False
                out.append((u, v))
                break
    return out


def _ruled(cons: Constraints) -> set[str]:
    """The guests any rule names (node or guest affinity, hard or soft)."""
    rules = cons.rules
    return {g for r in (*rules.node_affinity, *rules.guest_affinity) for g in r.guests}


def measure(generator: str, size: str, seed: int, rules: bool) -> dict[str, Any]:
    """``balance``'s plan of one generated cluster and its :class:`TwinFigures`."""
    cluster = generated(generator, size, seed=seed, rules=rules)
    wall = time.perf_counter()
    proposal = get_strategy("balance").propose(cluster, options={})
    seconds = time.perf_counter() - wall
    placement = {m.guest: m.target for m in proposal.net_moves()}
    moved = [cluster.guests[cluster.guest_index[g]] for g in placement]
    after = proposal.after.resources
    return {
        "generator": generator,
        "size": size,
        "seed": seed,
        "rules": rules,
        "moves": len(placement),
        "cost": sum(migration_cost(g, cluster.settings) for g in moved),
        "memory_spread_pp": round(after["memory"].spread * 100, 3),
        "cpu_spread_pp": round(after["cpu"].spread * 100, 3),
        "seconds": round(seconds, 2),
        **{
            k: round(v, 4) if isinstance(v, float) else v
            for k, v in asdict(twin_figures(cluster, placement)).items()
        },
    }


def _rules_variants(choice: str) -> Iterable[bool]:
    return {"no": (False,), "yes": (True,), "both": (False, True)}[choice]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.twins", description=__doc__)
    parser.add_argument("--generator", nargs="+", default=["mixed"], choices=tuple(GENERATORS))
    parser.add_argument("--sizes", nargs="+", default=["L"], choices=tuple(SIZES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--rules", default="both", choices=("no", "yes", "both"))
    args = parser.parse_args(argv)
    for generator in args.generator:
        for size in args.sizes:
            for seed in args.seeds:
                for rules in _rules_variants(args.rules):
                    print(json.dumps(measure(generator, size, seed, rules)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
