"""Helpers shared by the rule checks and transforms (``PVE::HA::Rules::Helpers``)."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Rule

__all__ = ["find_disjoint_rules_resource_sets"]


def find_disjoint_rules_resource_sets(
    rules: Mapping[str, Rule],
) -> list[tuple[list[str], set[str]]]:
    """``find_disjoint_rules_resource_sets``: rules that share resources, merged greedily.

    Each entry is the rule ids (in merge order) and the union of their resources; the rules are
    taken by their lowest resource id, then by rule id, as upstream orders them.
    """
    lowest = {rid: min(rule.resources) if rule.resources else "" for rid, rule in rules.items()}
    ordered = sorted(sorted(rules), key=lambda rid: lowest[rid])
    disjoint: list[tuple[list[str], set[str]]] = []
    for rid in ordered:
        resources = rules[rid].resources
        for ruleids, entry_resources in disjoint:
            if entry_resources.isdisjoint(resources):
                continue
            ruleids.append(rid)
            entry_resources.update(resources)
            break
        else:
            disjoint.append(([rid], set(resources)))
    return disjoint
