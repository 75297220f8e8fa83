"""Why ``optimal``'s problem has no placement: its hard constraints alone, each group behind an
assumption literal named for what it is, so that CP-SAT's infeasible core names them."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendrs.engine.constraints import RejectionCode

from ..cpsat import new_solver
from .problem import Problem
from .units import phrase, rejection


class _Explainer:
    """The hard constraints of a problem alone, on one Boolean per (guest, node) and each group
    of them behind an assumption literal named for what it is: an infeasible core names them."""

    def __init__(self, p: Problem) -> None:
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.p = p
        self.m = cp_model.CpModel()
        self.labels: dict[int, str] = {}
        self.lits: dict[str, Any] = {}
        self.n_nodes = len(p.cluster.nodes)
        self.present = np.nonzero(p.present)[0].tolist()
        self.x = {
            g: [self.m.new_bool_var(f"x{g}_{n}") for n in range(self.n_nodes)] for g in self.present
        }
        for g in self.present:
            self.m.add_exactly_one(self.x[g])

    def lit(self, label: str) -> Any:
        """The assumption literal of the constraints called ``label``."""
        if label not in self.lits:
            var = self.m.new_bool_var(f"a{len(self.lits)}")
            self.lits[label] = var
            self.labels[var.index] = label
        return self.lits[label]

    def add_units(self) -> None:
        """Each guest held on its node or kept off the nodes it may not use; a unit's guests
        on one node."""
        p, x = self.p, self.x
        guests, nodes = p.cluster.guests, p.cluster.nodes
        for members in p.units:
            for g in members.tolist():
                if p.held[g]:
                    why = p.why_fixed[g] or "kept in place"
                    label = f"guest {guests[g].label} stays on {nodes[p.cur[g]].name} ({why})"
                    self.m.add(x[g][int(p.cur[g])] == 1).only_enforce_if(self.lit(label))
                    continue
                self._rejections(g)
            if len(members) > 1:
                label = "hard affinity " + ", ".join(guests[g].label for g in members.tolist())
                first = int(members[0])
                for g in members[1:].tolist():
                    for n in range(self.n_nodes):
                        self.m.add(x[first][n] == x[g][n]).only_enforce_if(self.lit(label))

    def _rejections(self, g: int) -> None:
        """Guest ``g`` off each node the static constraints refuse it, labelled by why."""
        guests, nodes = self.p.cluster.guests, self.p.cluster.nodes
        for n in range(self.n_nodes):
            refused = rejection(self.p.cons, g, n)
            if refused is None:
                continue
            if refused.code in (RejectionCode.OFFLINE, RejectionCode.MAINTENANCE):
                label = f"node {nodes[n].name} is {refused.code.value}"
            elif refused.code is RejectionCode.FORBIDDEN:
                label = "forbidden placements (no safe migration order)"
            else:
                label = f"guest {guests[g].label}: {phrase(refused)}"
            self.m.add(self.x[g][n] == 0).only_enforce_if(self.lit(label))

    def add_capacity(self) -> None:
        """Each node's capacity, per dimension, where the guests could overflow it."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, x = self.p, self.x
        for n in range(self.n_nodes):
            for d, dim in enumerate(p.dims):
                coeffs = [(g, int(p.dem[g, d])) for g in self.present if p.dem[g, d] > 0]
                if sum(c for _, c in coeffs) <= int(p.cap[n, d]):
                    continue
                self.m.add(
                    cp_model.LinearExpr.weighted_sum(
                        [x[g][n] for g, _ in coeffs], [c for _, c in coeffs]
                    )
                    <= int(p.cap[n, d])
                ).only_enforce_if(self.lit(f"{dim} capacity of {p.cluster.nodes[n].name}"))

    def add_anti_affinity(self) -> None:
        """Each hard anti-affinity rule: at most one member per node (on a relaxed node, only
        its held members)."""
        p, x = self.p, self.x
        for name, members, relaxed in p.neg_rules:
            label = f"hard anti-affinity '{name}'"
            for n in range(self.n_nodes):
                if n in relaxed:
                    for g in members[~p.held[members]].tolist():
                        self.m.add(x[g][n] == 0).only_enforce_if(self.lit(label))
                else:
                    apart = sum(x[g][n] for g in members.tolist()) <= 1
                    self.m.add(apart).only_enforce_if(self.lit(label))

    def core(self, time_limit: float) -> list[str]:
        """The labels of a set of constraints that admit no placement together (sorted; none
        when CP-SAT does not prove infeasibility within ``time_limit``, 5 s at most)."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.m.add_assumptions(list(self.lits.values()))
        solver = new_solver(min(time_limit, 5.0), 1, 0)
        status = solver.solve(self.m)
        if status != cp_model.INFEASIBLE:
            return []
        found = solver.sufficient_assumptions_for_infeasibility()
        return sorted({self.labels[i] for i in found if i in self.labels})


def explain(p: Problem, time_limit: float) -> list[str]:
    """A small set of hard constraints that together admit no placement (CP-SAT assumptions)."""
    explainer = _Explainer(p)
    explainer.add_units()
    explainer.add_capacity()
    explainer.add_anti_affinity()
    return explainer.core(time_limit)


__all__ = ["explain"]
