"""Node affinity rules (``PVE::HA::Rules::NodeAffinity``): which nodes a resource may use.

A ``node-affinity`` rule gives its resources nodes with priorities; a strict rule allows only
those nodes, a non-strict one prefers them. A *negative* rule (``affinity negative``, Proxmox VE
9.2) names the nodes to avoid instead: it is used as the positive rule on the other cluster
nodes (:func:`invert_negative_node_affinity_rules`), may not give priorities, and may not name
every node. Its plugin checks (a resource in at most one node affinity rule, the two checks of
negative rules), its compiled form (each resource's rule) and :func:`get_node_affinity`, which
the manager asks for a resource's allowed and preferred nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .base import CompiledRules, Errors, Rule, push_error

__all__ = [
    "check_nonempty_negative_nodes_complement",
    "check_single_resource_reference",
    "check_unprioritized_negative_nodes",
    "compile_node_affinity",
    "get_node_affinity",
    "invert_negative_node_affinity_rules",
    "inverted",
]


def check_single_resource_reference(node_affinity: Mapping[str, Rule], errors: Errors) -> None:
    """``check_single_resource_reference``: a resource in two or more node affinity rules makes
    each of them infeasible."""
    resource_ruleids: dict[str, list[str]] = {}
    for rid in sorted(node_affinity):
        for sid in node_affinity[rid].resources:
            resource_ruleids.setdefault(sid, []).append(rid)
    conflicts = sorted(
        (rid, sid) for sid, rids in resource_ruleids.items() if len(rids) > 1 for rid in rids
    )
    for rid, sid in conflicts:
        push_error(errors, rid, f"resource '{sid}' is already used in another node affinity rule")


def check_nonempty_negative_nodes_complement(
    node_affinity: Mapping[str, Rule], nodes: Sequence[str], errors: Errors
) -> None:
    """``check_nonempty_negative_nodes_complement``: a negative rule that names as many nodes
    as the cluster has leaves its resources no node (strict) or means nothing (non-strict)."""
    for rid in sorted(node_affinity):
        rule = node_affinity[rid]
        if rule.affinity == "negative" and len(rule.nodes) >= len(nodes):
            push_error(
                errors,
                rid,
                "negative node affinity rule must not specify all cluster nodes",
                "nodes",
            )


def check_unprioritized_negative_nodes(node_affinity: Mapping[str, Rule], errors: Errors) -> None:
    """``check_unprioritized_negative_nodes``: a node to avoid has no priority."""
    for rid in sorted(node_affinity):
        rule = node_affinity[rid]
        if rule.affinity == "negative" and any(rule.nodes.values()):
            push_error(
                errors, rid, "negative node affinity rule must not specify node priorities", "nodes"
            )


def inverted(rule: Rule, nodes: Sequence[str]) -> Rule:
    """A negative node affinity rule as the positive rule on the other cluster ``nodes`` (each at
    priority 0), strictness kept; any other rule as it is."""
    if rule.type != "node-affinity" or rule.affinity != "negative":
        return rule
    out = rule.copy()
    out.affinity = None
    out.nodes = {node: 0 for node in nodes if node not in rule.nodes}
    return out


def invert_negative_node_affinity_rules(current: dict[str, Rule], nodes: Sequence[str]) -> None:
    """``invert_negative_node_affinity_rules`` (the node affinity plugin's transform): every
    negative rule becomes the positive rule on the complement of its nodes."""
    for rid, rule in current.items():
        current[rid] = inverted(rule, nodes)


def compile_node_affinity(ordered: Sequence[Rule]) -> dict[str, Rule]:
    """``plugin_compile``: each resource's node affinity rule (the first enabled one in
    ``ordered``, the rules in rule order)."""
    node_affinity: dict[str, Rule] = {}
    for rule in ordered:
        if rule.disabled or rule.type != "node-affinity":
            continue
        for sid in rule.resources:
            node_affinity.setdefault(sid, rule)
    return node_affinity


def get_node_affinity(
    compiled: CompiledRules, sid: str, online_nodes: Iterable[str]
) -> tuple[set[str], set[str]]:
    """``NodeAffinity.pm get_node_affinity``: (allowed nodes, preferred nodes).

    Without a rule every online node is allowed and preferred (priority 0). A
    non-strict rule adds every other online node at priority -1. The preferred
    nodes are the online nodes of the highest priority present.
    """
    online = set(online_nodes)
    rule = compiled.node_affinity.get(sid)
    priorities: dict[str, int] = dict(rule.nodes) if rule else dict.fromkeys(online, 0)
    if rule is None or not rule.strict:
        for node in online:
            priorities.setdefault(node, -1)
    allowed = {node for node in priorities if node in online}
    if not allowed:
        return set(), set()
    top = max(priorities[node] for node in allowed)
    return allowed, {node for node in allowed if priorities[node] == top}
