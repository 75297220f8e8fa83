"""Resource affinity rules (``PVE::HA::Rules::ResourceAffinity``): resources kept together or apart.

A ``resource-affinity`` rule is ``positive`` (its resources share a node) or ``negative`` (each on
a node of its own). Its plugin checks and transforms, its compiled form (each resource's positive
and negative partners) and what the manager asks of it: :func:`get_resource_affinity` (where the
partners are) and the helpers that narrow a resource's candidate nodes by them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..status import ManagerStatus
from ..usage.base import get_used_service_nodes
from .base import CompiledRules, Errors, Rule, enabled, push_error
from .helpers import find_disjoint_rules_resource_sets

__all__ = [
    "apply_negative_resource_affinity",
    "apply_positive_resource_affinity",
    "check_inter_resource_affinity_rules_consistency",
    "check_negative_resource_affinity_resources_count",
    "check_resource_affinity_resources_count",
    "compile_resource_affinity",
    "create_implicit_negative_resource_affinity_rules",
    "get_resource_affinity",
    "is_allowed_on_node",
    "merge_connected_positive_resource_affinity_rules",
]

# ----------------------------------------------------------------------------------- checks


def check_resource_affinity_resources_count(
    resource_affinity: Mapping[str, Rule], errors: Errors
) -> None:
    """``check_resource_affinity_resources_count``: a rule needs two resources or more."""
    for rid in sorted(r for r, rule in resource_affinity.items() if len(rule.resources) < 2):
        push_error(errors, rid, "rule is ineffective as there are less than two resources")


def check_negative_resource_affinity_resources_count(
    negative: Mapping[str, Rule], nodes: Sequence[str], errors: Errors
) -> None:
    """``check_negative_resource_affinity_resources_count``: a negative rule cannot keep apart
    more resources than there are nodes."""
    for rid in sorted(r for r, rule in negative.items() if len(rule.resources) > len(nodes)):
        push_error(errors, rid, "rule defines more resources than available nodes")


def check_inter_resource_affinity_rules_consistency(
    positive: Mapping[str, Rule], negative: Mapping[str, Rule], errors: Errors
) -> None:
    """``check_inter_resource_affinity_rules_consistency``: a negative rule sharing two or more
    resources with connected positive rules makes all of them infeasible."""
    pairs: list[tuple[str, str]] = []
    for ruleids, resources in find_disjoint_rules_resource_sets(positive):
        for nid in sorted(negative):
            if len(resources & negative[nid].resources) < 2:
                continue
            pairs.append(("negative", nid))
            pairs.extend(("positive", rid) for rid in ruleids)
    for kind, rid in sorted(pairs):
        other = "positive" if kind == "negative" else "negative"
        push_error(
            errors, rid, f"rule shares two or more resources with a {other} resource affinity rule"
        )


# ------------------------------------------------------------------------------- transforms


def merge_connected_positive_resource_affinity_rules(current: dict[str, Rule]) -> None:
    """``merge_connected_positive_resource_affinity_rules``: positive rules that share resources
    become one rule ``_merged-<ids>``, at the first one's place in the rule order."""
    positive = enabled(current, "resource-affinity", "positive")
    for ruleids, resources in find_disjoint_rules_resource_sets(positive):
        if len(ruleids) < 2:
            continue
        new_id = "_merged-" + "-".join(ruleids)
        first_order = current[ruleids[0]].order
        for rid in ruleids:
            del current[rid]
        current[new_id] = Rule(
            ruleid=new_id,
            type="resource-affinity",
            resources=set(resources),
            order=first_order,
            affinity="positive",
        )


def create_implicit_negative_resource_affinity_rules(current: dict[str, Rule]) -> None:
    """``create_implicit_negative_resource_affinity_rules``: every member of a positive rule is
    kept apart from its partners' negative partners, by a rule
    ``_implicit-negative-<positive>-<member>-<other>`` at the end of the rule order."""
    positive = enabled(current, "resource-affinity", "positive")
    negative = enabled(current, "resource-affinity", "negative")
    for pid in sorted(positive):
        members = positive[pid].resources
        separated_from: dict[str, set[str]] = {}
        for rule in negative.values():
            for sid in members:
                if sid not in rule.resources:
                    continue
                for csid in rule.resources:
                    if csid != sid:
                        separated_from.setdefault(csid, set()).add(sid)
        for csid in sorted(separated_from):
            for sid in sorted(members):
                if sid in separated_from[csid]:
                    continue
                new_id = f"_implicit-negative-{pid}-{sid}-{csid}"
                next_order = max((r.order for r in current.values()), default=0) + 1
                current[new_id] = Rule(
                    ruleid=new_id,
                    type="resource-affinity",
                    resources={sid, csid},
                    order=next_order,
                    affinity="negative",
                )


# ---------------------------------------------------------------------------- the compiled form


def compile_resource_affinity(
    ordered: Sequence[Rule],
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``plugin_compile``: each resource's positive and negative partners (enabled rules of
    ``ordered``, the rules in rule order)."""
    positive: dict[str, set[str]] = {}
    negative: dict[str, set[str]] = {}
    for rule in ordered:
        if rule.disabled or rule.type != "resource-affinity":
            continue
        target = positive if rule.affinity == "positive" else negative
        for sid in rule.resources:
            for csid in rule.resources:
                if csid != sid:
                    target.setdefault(sid, set()).add(csid)
    return positive, negative


# ------------------------------------------------------------------------- the manager's helpers


def get_resource_affinity(
    compiled: CompiledRules, sid: str, status: ManagerStatus, online_nodes: Iterable[str]
) -> tuple[dict[str, int], set[str]]:
    """``ResourceAffinity.pm get_resource_affinity``: (together counts, separate nodes).

    ``together[n]`` counts the positive partners on n (their target if they are
    moving, else their current node); ``separate`` holds every current and
    target node of the negative partners.
    """
    online = set(online_nodes)
    together: dict[str, int] = {}
    separate: set[str] = set()
    for csid in sorted(compiled.positive.get(sid, ())):
        svc = status.services.get(csid)
        if svc is None:
            continue
        current, target = get_used_service_nodes(online, svc.state, svc.node, svc.target)
        node = target if target is not None else current
        if node is not None:
            together[node] = together.get(node, 0) + 1
    for csid in sorted(compiled.negative.get(sid, ())):
        svc = status.services.get(csid)
        if svc is None:
            continue
        current, target = get_used_service_nodes(online, svc.state, svc.node, svc.target)
        separate.update(n for n in (current, target) if n is not None)
    return together, separate


def is_allowed_on_node(together: Mapping[str, int], separate: set[str], node: str) -> bool:
    """Whether positive partners are on ``node``, or no negative partner is."""
    return bool(together.get(node)) or node not in separate


def apply_negative_resource_affinity(separate: set[str], nodes: set[str]) -> set[str]:
    """``nodes`` without those of the negative partners."""
    return nodes - separate


def apply_positive_resource_affinity(together: Mapping[str, int], nodes: set[str]) -> set[str]:
    """``nodes`` narrowed to the one among them most positive partners are on (ties: the first
    by name); ``nodes`` unchanged when no partner is on any of them."""
    possible = {node: count for node, count in together.items() if node in nodes}
    if not possible:
        return nodes
    return {sorted(sorted(possible), key=lambda node: -possible[node])[0]}
