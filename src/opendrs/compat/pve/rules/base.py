"""The HA rule records and the ``rules.cfg`` parser (``PVE::HA::Rules``'s section config).

A :class:`Rule` is one ``node-affinity`` or ``resource-affinity`` section; the checks and
transforms work on rule ids mapped to rules (:func:`enabled` picks one kind), and report what
makes a rule infeasible as :data:`Errors` (:func:`push_error`). :class:`CompiledRules` is what the
scheduler reads once the rule set is feasible (:func:`~.ruleset.compile_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..section_config import parse_bool, parse_node_list, parse_sections, split_list
from ..status import SID_RE

__all__ = ["CompiledRules", "Errors", "Rule", "enabled", "parse_rules", "push_error"]

#: Why rules are infeasible: rule id → property → messages (``check_feasibility``'s errors).
Errors = dict[str, dict[str, list[str]]]


@dataclass
class Rule:
    """One HA rule (``rules.cfg`` section), mutable while the transforms run."""

    ruleid: str
    type: Literal["node-affinity", "resource-affinity"]
    resources: set[str]
    order: int
    nodes: dict[str, int] = field(default_factory=dict)  # node → priority (node-affinity)
    strict: bool = False  # node-affinity
    #: resource-affinity: 'positive' | 'negative'; node-affinity: 'positive' (prefer or keep to
    #: ``nodes``) or 'negative' (avoid ``nodes``), None when the section does not say (positive).
    affinity: str | None = None
    disabled: bool = False
    comment: str | None = None

    def copy(self) -> Rule:
        """A deep copy (sets and dicts are copied)."""
        return Rule(
            ruleid=self.ruleid,
            type=self.type,
            resources=set(self.resources),
            order=self.order,
            nodes=dict(self.nodes),
            strict=self.strict,
            affinity=self.affinity,
            disabled=self.disabled,
            comment=self.comment,
        )


@dataclass(frozen=True)
class CompiledRules:
    """``PVE::HA::Rules->compile``: per-sid node affinity and resource affinity sets."""

    node_affinity: Mapping[str, Rule]
    positive: Mapping[str, frozenset[str]]
    negative: Mapping[str, frozenset[str]]
    rules: tuple[Rule, ...] = ()

    @staticmethod
    def empty() -> CompiledRules:
        """No rules at all."""
        return CompiledRules(node_affinity={}, positive={}, negative={})


def enabled(rules: Mapping[str, Rule], rtype: str, affinity: str | None = None) -> dict[str, Rule]:
    """The enabled rules of type ``rtype`` (and of that ``affinity``, when given)."""
    return {
        rid: rule
        for rid, rule in rules.items()
        if rule.type == rtype
        and not rule.disabled
        and (affinity is None or rule.affinity == affinity)
    }


def push_error(errors: Errors, ruleid: str, message: str, prop: str = "resources") -> None:
    """Record that rule ``ruleid`` is infeasible because of ``message`` (about ``prop``)."""
    errors.setdefault(ruleid, {}).setdefault(prop, []).append(message)


def _parse_resources(value: str) -> tuple[set[str], list[str]]:
    resources: set[str] = set()
    bad: list[str] = []
    for item in split_list(value):
        if SID_RE.match(item):
            resources.add(item)
        else:
            bad.append(item)
    return resources, bad


def parse_rules(text: str | None, *, first_order: int = 1) -> tuple[list[Rule], list[str]]:
    """Parse ``rules.cfg`` (``PVE::HA::Rules->parse_config``).

    Sections are ``node-affinity: <id>`` (``resources``, ``nodes``, ``strict``,
    ``affinity``, ``disable``, ``comment``) and ``resource-affinity: <id>`` (``resources``,
    ``affinity``, ``disable``, ``comment``). A node affinity's ``affinity`` is ``positive``
    (the default) or ``negative`` ("avoid these nodes", Proxmox VE 9.2). Like Proxmox, a
    section that lacks a required property or has an unknown type is skipped with a warning.

    Returns:
        The rules in file order and the parser warnings.
    """
    if not text:
        return [], []
    sections, warnings = parse_sections(text, "rules")
    rules: list[Rule] = []
    seen: set[str] = set()
    order = first_order
    for stype, ruleid, props in sections:
        prefix = f"rule '{ruleid}'"
        if stype not in ("node-affinity", "resource-affinity"):
            warnings.append(f"{prefix}: unknown rule type '{stype}', rule skipped")
            continue
        if ruleid in seen:
            warnings.append(f"{prefix}: duplicate rule id, rule skipped")
            continue
        allowed = {"resources", "disable", "comment", "affinity"} | (
            {"nodes", "strict"} if stype == "node-affinity" else set()
        )
        for key in sorted(set(props) - allowed):
            warnings.append(f"{prefix}: unexpected property '{key}' ignored")
        if "resources" not in props:
            warnings.append(f"{prefix}: missing value for required option 'resources', skipped")
            continue
        resources, bad = _parse_resources(props["resources"])
        for item in bad:
            warnings.append(f"{prefix}: invalid resource id '{item}' ignored")
        rule = Rule(
            ruleid=ruleid,
            type=stype,  # type: ignore[arg-type]
            resources=resources,
            order=order,
            disabled="disable" in props,
            comment=props.get("comment"),
        )
        if stype == "node-affinity":
            if "nodes" not in props:
                warnings.append(f"{prefix}: missing value for required option 'nodes', skipped")
                continue
            rule.nodes, bad = parse_node_list(props["nodes"])
            for item in bad:
                warnings.append(f"{prefix}: invalid node entry '{item}' ignored")
            if "strict" in props:
                strict = parse_bool(props["strict"])
                if strict is None:
                    warnings.append(f"{prefix}: invalid value for 'strict', using 0")
                rule.strict = bool(strict)
        # A node affinity is positive unless it says otherwise; a resource affinity must say.
        affinity = props.get("affinity", "positive" if stype == "node-affinity" else None)
        if affinity not in ("positive", "negative"):
            warnings.append(f"{prefix}: 'affinity' must be 'positive' or 'negative', rule skipped")
            continue
        if stype == "resource-affinity" or affinity == "negative":
            rule.affinity = affinity
        seen.add(ruleid)
        rules.append(rule)
        order += 1
    return rules, warnings
