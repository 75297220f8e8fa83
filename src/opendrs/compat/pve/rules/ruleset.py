"""A rule set checked, transformed and compiled, as ``PVE::HA::Rules`` does it.

:func:`check_feasibility` runs the plugins' checks in registration order (node affinity, then
resource affinity) and then the checks between the two kinds, all on the same rule set;
:func:`transform_rules` drops every rule found infeasible and runs the transforms in the same
order; :func:`compile_rules` gives the scheduler each resource's node affinity rule and its
resource affinity partners.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .base import CompiledRules, Errors, Rule, enabled, push_error
from .helpers import find_disjoint_rules_resource_sets
from .node_affinity import (
    check_nonempty_negative_nodes_complement,
    check_single_resource_reference,
    check_unprioritized_negative_nodes,
    compile_node_affinity,
    invert_negative_node_affinity_rules,
    inverted,
)
from .resource_affinity import (
    check_inter_resource_affinity_rules_consistency,
    check_negative_resource_affinity_resources_count,
    check_resource_affinity_resources_count,
    compile_resource_affinity,
    create_implicit_negative_resource_affinity_rules,
    merge_connected_positive_resource_affinity_rules,
)

__all__ = ["check_feasibility", "compile_rules", "transform_rules"]


def _has_multiple_priorities(rule: Rule) -> bool:
    return len(set(rule.nodes.values())) > 1


# ------------------------------------------------------------- checks between the rule kinds


def check_single_priority_node_affinity_in_resource_affinity_rules(
    resource_affinity: Mapping[str, Rule], node_affinity: Mapping[str, Rule], errors: Errors
) -> None:
    """A resource affinity rule whose resources are in a node affinity rule with several
    priorities: both are infeasible."""
    pairs: list[tuple[str, str]] = []
    for rid in sorted(resource_affinity):
        resources = resource_affinity[rid].resources
        paired = [n for n in sorted(node_affinity) if resources & node_affinity[n].resources]
        if any(_has_multiple_priorities(node_affinity[n]) for n in paired):
            pairs.append(("resource-affinity", rid))
            pairs.extend(("node-affinity", n) for n in paired)
    for kind, rid in sorted(pairs):
        if kind == "node-affinity":
            push_error(
                errors,
                rid,
                "resources are in a resource affinity rule and cannot be in"
                " a node affinity rule with multiple priorities",
            )
        else:
            push_error(errors, rid, "resources are in node affinity rules with multiple priorities")


def check_single_node_affinity_per_positive_resource_affinity_rule(
    positive: Mapping[str, Rule], node_affinity: Mapping[str, Rule], errors: Errors
) -> None:
    """Connected positive rules whose resources are in two or more node affinity rules: all of
    them are infeasible."""
    pairs: list[tuple[str, str]] = []
    for ruleids, resources in find_disjoint_rules_resource_sets(positive):
        paired = [n for n in sorted(node_affinity) if resources & node_affinity[n].resources]
        if len(paired) > 1:
            pairs.extend(("positive", rid) for rid in ruleids)
            pairs.extend(("node-affinity", n) for n in paired)
    for kind, rid in sorted(pairs):
        if kind == "positive":
            push_error(errors, rid, "resources are in multiple node affinity rules")
        else:
            push_error(
                errors,
                rid,
                "at least one resource is in a positive resource affinity"
                " rule and there are other resources in at least one"
                " other node affinity rule already",
            )


def check_negative_resource_affinity_node_affinity_consistency(
    negative: Mapping[str, Rule], node_affinity: Mapping[str, Rule], errors: Errors
) -> None:
    """A negative rule whose resources node affinity restricts to fewer nodes than there are
    resources: it and those node affinity rules are infeasible."""
    pairs: list[tuple[str, str]] = []
    for nid in sorted(negative):
        resources = negative[nid].resources
        allowed_nodes: set[str] = set()
        located: set[str] = set()
        paired = []
        for rid in sorted(node_affinity):
            common = resources & node_affinity[rid].resources
            if not common:
                continue
            located |= common
            allowed_nodes |= set(node_affinity[rid].nodes)
            paired.append(rid)
        if len(allowed_nodes) < len(located):
            pairs.append(("negative", nid))
            pairs.extend(("node-affinity", rid) for rid in paired)
    for kind, rid in sorted(pairs):
        if kind == "negative":
            push_error(
                errors,
                rid,
                "two or more resources are restricted to less nodes than"
                " available to the resources",
            )
        else:
            push_error(
                errors,
                rid,
                "at least one resource is in a negative resource affinity"
                " rule and this rule would restrict these to less nodes"
                " than available to the resources",
            )


def create_implicit_positive_resource_affinity_node_affinity_rules(
    current: dict[str, Rule],
) -> None:
    """Positive partners join the node affinity rule (the first in rule order) of any member."""
    positive = enabled(current, "resource-affinity", "positive")
    node_affinity = enabled(current, "node-affinity")
    for pid in sorted(positive):
        members = positive[pid].resources
        for rid in sorted(node_affinity, key=lambda r: (node_affinity[r].order, r)):
            if node_affinity[rid].resources.isdisjoint(members):
                continue
            node_affinity[rid].resources |= members
            break


# ---------------------------------------------------------------------------- the rule set


def check_feasibility(rules: Mapping[str, Rule], nodes: Sequence[str]) -> Errors:
    """``PVE::HA::Rules->check_feasibility``: errors per rule id (and property).

    The checks run in plugin registration order (node affinity, resource affinity,
    then the global inter-plugin checks), all on the same, unmodified rule set — except that
    the checks between the two kinds read a negative node affinity rule as the nodes it leaves
    (its complement), which is what it means.
    """
    errors: Errors = {}
    node_affinity = enabled(rules, "node-affinity")
    leaves = {rid: inverted(rule, nodes) for rid, rule in node_affinity.items()}
    resource_affinity = enabled(rules, "resource-affinity")
    positive = enabled(rules, "resource-affinity", "positive")
    negative = enabled(rules, "resource-affinity", "negative")

    check_single_resource_reference(node_affinity, errors)
    check_nonempty_negative_nodes_complement(node_affinity, nodes, errors)
    check_unprioritized_negative_nodes(node_affinity, errors)
    check_resource_affinity_resources_count(resource_affinity, errors)
    check_negative_resource_affinity_resources_count(negative, nodes, errors)
    check_inter_resource_affinity_rules_consistency(positive, negative, errors)
    check_single_priority_node_affinity_in_resource_affinity_rules(
        resource_affinity, leaves, errors
    )
    check_single_node_affinity_per_positive_resource_affinity_rule(positive, leaves, errors)
    check_negative_resource_affinity_node_affinity_consistency(negative, leaves, errors)
    return errors


def transform_rules(rules: Sequence[Rule], nodes: Sequence[str]) -> tuple[list[Rule], list[str]]:
    """``PVE::HA::Rules->transform``: drop infeasible rules, then run the transforms.

    Returns the resulting rules (copies; the input is left untouched) and the
    ``Drop rule '<id>', because <reason>.`` messages, sorted by rule id.

    Transforms, in registration order:

    1. negative node-affinity rules become positive ones on the other nodes;
    2. merge connected positive resource-affinity rules into ``_merged-<ids>``;
    3. infer ``_implicit-negative-<positive>-<a>-<b>`` rules: every member of a
       positive group is kept apart from its partners' negative partners;
    4. positive partners join a member's node-affinity rule.
    """
    current: dict[str, Rule] = {rule.ruleid: rule.copy() for rule in rules}
    errors = check_feasibility(current, nodes)
    for rid in errors:
        del current[rid]
    messages = [
        f"Drop rule '{rid}', because {message}."
        for rid in sorted(errors)
        for opt in sorted(errors[rid])
        for message in errors[rid][opt]
    ]
    invert_negative_node_affinity_rules(current, nodes)
    merge_connected_positive_resource_affinity_rules(current)
    create_implicit_negative_resource_affinity_rules(current)
    create_implicit_positive_resource_affinity_node_affinity_rules(current)
    ordered = sorted(current.values(), key=lambda r: (r.order, r.ruleid))
    return ordered, messages


def compile_rules(rules: Sequence[Rule]) -> CompiledRules:
    """``PVE::HA::Rules->compile``: per-sid node-affinity rule and affinity partner sets."""
    ordered = sorted(rules, key=lambda r: (r.order, r.ruleid))
    positive, negative = compile_resource_affinity(ordered)
    return CompiledRules(
        node_affinity=compile_node_affinity(ordered),
        positive={sid: frozenset(v) for sid, v in positive.items()},
        negative={sid: frozenset(v) for sid, v in negative.items()},
        rules=tuple(rules),
    )
