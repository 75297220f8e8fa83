"""``optimal``'s CP-SAT model of a :class:`~.problem.Problem`: one Boolean per unit and allowed
node, the hard constraints (capacity, anti-affinity), the objective (``w_balance · spread +
w_stickiness · migration cost + SOFT_PENALTY · broken soft rules``) and the tie-break the second
pass minimises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from opendrs.engine.objective import SOFT_PENALTY

from .problem import Problem
from .terms import SpreadTerm

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


class Model:
    """The CP-SAT model of a problem, with its objective and tie-break expressions."""

    def __init__(self, p: Problem, w_balance: int, w_stickiness: int) -> None:
        from ortools.sat.python import cp_model  # imported when solving: it is large

        self.p = p
        self.model = cp_model.CpModel()
        self._place_units()
        self._add_capacity()
        self._add_anti_affinity()
        penalties = self._soft_penalties()
        cost_terms = self._migration_cost()
        #: Per term: the term, its (node, load variable) pairs, and its max and min variables.
        self.load_vars: list[tuple[SpreadTerm, list[tuple[int, Any]], Any, Any]] = []
        spread_terms = self._spread() if w_balance > 0 else []
        self.objective = (
            w_balance * cp_model.LinearExpr.sum(spread_terms)
            + w_stickiness * cp_model.LinearExpr.sum(cost_terms)
            + SOFT_PENALTY * cp_model.LinearExpr.sum(penalties)
        )
        self.model.minimize(self.objective)

    def _place_units(self) -> None:
        """One Boolean per unit and allowed node, exactly one true per unit (``y``), and the
        units that may go to each node (``on_node``)."""
        m = self.model
        self.y: list[dict[int, cp_model.IntVar]] = []
        for u, dom in enumerate(self.p.domain):
            row = {int(n): m.new_bool_var(f"y{u}_{n}") for n in dom.tolist()}
            m.add_exactly_one(row.values())
            self.y.append(row)
        self.on_node: list[list[int]] = [[] for _ in range(len(self.p.cluster.nodes))]
        for u, dom in enumerate(self.p.domain):
            for n in dom.tolist():
                self.on_node[n].append(u)

    def _add_capacity(self) -> None:
        """Capacity of every node and dimension (only where the units could overflow it)."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, m = self.p, self.model
        unit_dem = (
            np.stack([p.dem[members].sum(axis=0) for members in p.units])
            if p.units
            else np.zeros((0, len(p.dims)), dtype=np.int64)
        )
        for n in range(len(p.cluster.nodes)):
            here = self.on_node[n]
            if not here:
                continue
            for d in range(len(p.dims)):
                coeffs = unit_dem[here, d]
                if int(coeffs.sum()) <= int(p.cap[n, d]):
                    continue
                nz = [(u, int(c)) for u, c in zip(here, coeffs.tolist(), strict=True) if c > 0]
                m.add(
                    cp_model.LinearExpr.weighted_sum(
                        [self.y[u][n] for u, _ in nz], [c for _, c in nz]
                    )
                    <= int(p.cap[n, d])
                )

    def _add_anti_affinity(self) -> None:
        """Hard anti-affinity: at most one member per node, except that on a relaxed node only
        the held members stay."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p, m = self.p, self.model
        for _name, members, relaxed in p.neg_rules:
            for n in range(len(p.cluster.nodes)):
                lits = [self.x(int(g), n) for g in members.tolist()]
                if n in relaxed:
                    for g in members[~p.held[members]].tolist():
                        lit = self.x(int(g), n)
                        if not isinstance(lit, int):
                            m.add(lit == 0)
                    continue
                # Members of one unit share a literal: count it once per member.
                vars_ = [lit for lit in lits if not isinstance(lit, int)]
                const = sum(lit for lit in lits if isinstance(lit, int))
                if len(vars_) + const > 1:
                    m.add(cp_model.LinearExpr.sum(vars_) + const <= 1)

    def _soft_penalties(self) -> list[Any]:
        """One 0/1 term per broken soft rule: a Boolean per soft guest-affinity rule
        (``soft_vars``), the literal of each guest on a node its node affinity does not prefer."""
        p, m = self.p, self.model
        n_nodes = len(p.cluster.nodes)
        penalties: list[Any] = []
        self.soft_vars: list[tuple[Any, bool, np.ndarray]] = []  # (var, positive, members)
        for name, members in p.soft_pos:
            v = m.new_bool_var(f"soft_pos_{name}")
            self.soft_vars.append((v, True, members))
            first = int(members[0])
            for g in members[1:].tolist():
                for n in range(n_nodes):
                    a, b = self.x(first, n), self.x(int(g), n)
                    if isinstance(a, int) and isinstance(b, int):
                        if a != b:
                            m.add(v == 1)
                        continue
                    m.add(a - b <= v)
            penalties.append(v)
        for name, members in p.soft_neg:
            v = m.new_bool_var(f"soft_neg_{name}")
            self.soft_vars.append((v, False, members))
            k = len(members)
            for n in range(n_nodes):
                lits = [self.x(int(g), n) for g in members.tolist()]
                if sum(1 for lit in lits if not isinstance(lit, int) or lit) > 1:
                    m.add(sum(lits) <= 1 + (k - 1) * v)
            penalties.append(v)
        for g in np.nonzero(p.present & p.not_preferred.row_any())[0].tolist():
            for n in np.nonzero(p.not_preferred[g])[0].tolist():
                lit = self.x(int(g), n)
                if not isinstance(lit, int) or lit:
                    penalties.append(lit)
        return penalties

    def _migration_cost(self) -> list[Any]:
        """The cost terms of the movable guests; ``moved``: whether each one moves."""
        p = self.p
        cost_terms: list[Any] = []
        self.moved: dict[int, Any] = {}
        for g in np.nonzero(p.movable)[0].tolist():
            stay = self.x(g, int(p.cur[g]))
            self.moved[g] = 1 - stay
            cost_terms.append(int(p.cost[g]) * (1 - stay))
        return cost_terms

    def _spread(self) -> list[Any]:
        """``weight · (max − min)`` of each term with two nodes or more (``load_vars``)."""
        spread_terms: list[Any] = []
        for t_i, term in enumerate(self.p.terms):
            if term.nodes.size < 2:
                continue
            node_vars, hi, lo = self._term_loads(t_i, term)
            spread_terms.append(term.weight * (hi - lo))
            self.load_vars.append((term, node_vars, hi, lo))
        return spread_terms

    def _term_loads(self, t_i: int, term: SpreadTerm) -> tuple[list[tuple[int, Any]], Any, Any]:
        """Term ``t_i``'s scaled, rounded-down load on each of its nodes (a variable where some
        unit may come, else a constant) and its max and min variables."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        m = self.model
        unit_coef = [int(term.coeffs[members].sum()) for members in self.p.units]
        total = sum(unit_coef)
        loads = []
        node_vars: list[tuple[int, Any]] = []
        ub_all = 0
        for n in term.nodes.tolist():
            here = [(u, unit_coef[u]) for u in self.on_node[n] if unit_coef[u]]
            base, cap = int(term.base[n]), int(term.cap[n])
            ub = term.scale * (base + total) // cap
            ub_all = max(ub_all, ub)
            if not here:
                loads.append(term.scale * base // cap)
                continue
            lv = m.new_int_var(0, max(ub, 0), f"l{t_i}_{n}")
            used = (
                cp_model.LinearExpr.weighted_sum(
                    [self.y[u][n] for u, _ in here], [term.scale * c for _, c in here]
                )
                + term.scale * base
            )
            m.add(cap * lv <= used)
            m.add(used <= cap * lv + cap - 1)
            loads.append(lv)
            node_vars.append((n, lv))
        hi = m.new_int_var(0, max(ub_all, 0), f"max{t_i}")
        lo = m.new_int_var(0, max(ub_all, 0), f"min{t_i}")
        for lv in loads:
            m.add(hi >= lv)
            m.add(lo <= lv)
        return node_vars, hi, lo

    def x(self, g: int, n: int) -> Any:
        """The literal "guest ``g`` on node ``n``" (a unit's variable, or the constant 0)."""
        u = int(self.p.unit_of[g])
        if u < 0:
            return 0
        return self.y[u].get(n, 0)

    def hint(self, assign: np.ndarray) -> None:
        """Hint a placement: every variable when it is complete (CP-SAT then starts from it at
        once), else the units whose hinted node is in their domain."""
        self.model.clear_hints()
        complete = True
        for u, members in enumerate(self.p.units):
            n = int(assign[members[0]])
            if n in self.y[u]:
                for node, var in self.y[u].items():
                    self.model.add_hint(var, 1 if node == n else 0)
            else:
                complete = False
        if not complete:
            return
        for term, node_vars, hi, lo in self.load_vars:
            loads = dict(zip(term.nodes.tolist(), term.node_loads(assign).tolist(), strict=True))
            for n, lv in node_vars:
                self.model.add_hint(lv, loads[n])
            self.model.add_hint(hi, max(loads.values()))
            self.model.add_hint(lo, min(loads.values()))
        for var, positive, members in self.soft_vars:
            where = assign[members].tolist()
            broken = len(set(where)) > 1 if positive else len(set(where)) < len(where)
            self.model.add_hint(var, int(broken))

    def read(self, solver: cp_model.CpSolver) -> np.ndarray:
        assign = self.p.cur.copy()
        for u, members in enumerate(self.p.units):
            for n, var in self.y[u].items():
                if solver.boolean_value(var):
                    assign[members] = n
                    break
        return assign

    def tie_break(self) -> Any:
        """Migration effort (cost, then CPU activity), then pressure exposure — integers."""
        from ortools.sat.python import cp_model  # imported when solving: it is large

        p = self.p
        guests, nodes = p.cluster.guests, p.cluster.nodes
        busy_raw = np.array([g.cpu_load for g in guests], dtype=float)
        busy = (
            np.round(10 * busy_raw / busy_raw.max()).astype(np.int64)
            if busy_raw.max(initial=0) > 0
            else np.zeros(len(guests), dtype=np.int64)
        )
        effort_terms = []
        effort_max = 0
        for g, moved in self.moved.items():
            coef = 11 * int(p.cost[g]) + int(busy[g])
            effort_max += coef
            effort_terms.append(coef * moved)
        effort = cp_model.LinearExpr.sum(effort_terms)
        # Exposure: busy guests (cpu, memory, disk) on nodes reporting pressure.
        loads = p.loads
        sizes = np.array(
            [[g.cpu_load, g.memory, g.local_disk_bytes] for g in guests], dtype=float
        ).reshape(len(guests), 3)
        top = sizes.max(axis=0, initial=0)
        level = np.where(top > 0, np.round(10 * sizes / np.where(top > 0, top, 1)), 0)
        pressure = np.array(
            [[n.pressure.cpu, n.pressure.memory, n.pressure.io] for n in nodes], dtype=float
        ).reshape(len(nodes), 3)
        plevel = np.round(np.clip(pressure, 0, 100) / 10)
        exposure = (level * loads.active[:, None]) @ plevel.T  # (G, N)
        exposure = exposure.astype(np.int64)
        ex_terms = []
        ex_max = 0
        for g in np.nonzero(p.present & p.movable)[0].tolist():
            row = exposure[g]
            if not row.any():
                continue
            u = int(p.unit_of[g])
            ex_max += int(row[p.domain[u]].max())
            for n, var in self.y[u].items():
                if row[n]:
                    ex_terms.append(int(row[n]) * var)
        if not ex_terms or (ex_max + 1) * max(effort_max, 1) > 2**52:
            return effort
        return (ex_max + 1) * effort + cp_model.LinearExpr.sum(ex_terms)


__all__ = ["Model"]
