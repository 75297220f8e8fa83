"""Proxmox VE HA cluster resource scheduler (CRS) decisions, reimplemented in Python.

This module mirrors the decision functions of ``pve-ha-manager`` (``src/PVE/HA/…``)
and ``proxmox-resource-scheduling`` so that opendrs can answer exactly what a
Proxmox HA manager would decide for a given cluster snapshot:

* usage accounting (``PVE::HA::Usage`` and its ``Basic``/``Static``/``Dynamic``
  plugins): which node(s) a service loads in which state, and with what;
* ``PVE::HA::Manager::select_service_node`` with the node preferences
  ``none``, ``best-score`` and ``try-next`` (failback, maintenance fallback,
  node affinity and resource affinity);
* the HA rules (``PVE::HA::Rules``, ``…::NodeAffinity``, ``…::ResourceAffinity``):
  parsing of ``rules.cfg`` and of the legacy ``groups.cfg``, the feasibility
  checks that drop rules, and the rule transforms;
* start scoring (``scheduler.rs score_nodes_to_start_service``, TOPSIS);
* the node imbalance and the automatic rebalancing choice
  (``Manager.pm load_balance``, ``scheduler.rs`` brute force and TOPSIS);
* manual ``migrate``/``relocate`` commands (``Manager.pm queue_resource_motion``).

Everything is pure: a query (a JSON-like ``dict``) goes in, an answer comes out.
:func:`serve` wraps :func:`decide` as a JSON-Lines service::

    query:  {"mode": "basic|static|dynamic",
             "nodes": {NODE: {"maxcpu": n, "maxmem": bytes, "online": bool}},
             "services": {SID: {"node": NODE, "state": STATE, "target": NODE|null,
                                "running": bool, "maxcpu": n, "maxmem": bytes,
                                "cpu": n, "mem": bytes, "failback": bool}},
             "rules": TEXT|null, "groups": TEXT|null,
             "query": {"select-node": {...}} | {"rebalance": {...}} | {"command": {...}}}
    answer: {"node": NODE|null} | {"migration": {...}|null} | {"accepted": bool, "comoves": [...]}

Optional service fields beyond the basic protocol: ``"group"`` (a legacy HA group
of ``groups``) and ``"ha": false`` (a non-HA guest: it loads its node but never
moves). Every answer also carries ``"mode"`` (the effective scheduler mode) and
``"dropped"`` (the ``Drop rule '<id>', because …`` messages), and where relevant
``"scores"`` (lower is better), ``"imbalance"`` (``before``/``after``, raw and
``*_normalized``), ``"comoves"``, ``"reason"`` and ``"warnings"``.

Imbalance, threshold and margin use the scale of the Proxmox test logs: the plain
coefficient of variation of the node loads (crate 2.0), not the ÷√(N−1) form of
crate 2.1.0 (which :func:`node_imbalance` also offers).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TextIO

from opendrs.engine.mcdm import McdmError, topsis_rank, topsis_scores

__all__ = [
    "DEFAULT_NODE_MAXCPU",
    "DEFAULT_NODE_MAXMEM",
    "DEFAULT_SERVICE_CPU",
    "DEFAULT_SERVICE_MAXCPU",
    "DEFAULT_SERVICE_MAXMEM",
    "DEFAULT_SERVICE_MEM",
    "PVE_TOPSIS_WEIGHTS",
    "BasicUsage",
    "Cluster",
    "CompiledRules",
    "DynamicUsage",
    "Group",
    "MigrationCandidate",
    "Node",
    "NodeStats",
    "PveQueryError",
    "Rule",
    "Service",
    "StaticUsage",
    "Usage",
    "apply_groups",
    "check_feasibility",
    "compile_rules",
    "decide",
    "execute_command",
    "get_node_affinity",
    "get_resource_affinity",
    "get_used_service_nodes",
    "groups_to_rules",
    "load_balance",
    "make_usage",
    "node_imbalance",
    "parse_groups",
    "parse_query",
    "parse_rules",
    "pve_topsis_alternative",
    "score_migrations_bruteforce",
    "score_nodes_to_start_service",
    "select_best_migration_bruteforce",
    "select_best_migration_topsis",
    "select_service_node",
    "serve",
    "sort_scored_migrations",
    "stats_with_migration",
    "transform_rules",
    "truncate_imbalance",
]

MIB = 1024**2
GIB = 1024**3

#: Simulator defaults for a service without static/dynamic stats (``Sim/Hardware.pm``).
DEFAULT_SERVICE_MAXCPU = 4.0
DEFAULT_SERVICE_MAXMEM = 4096 * MIB
DEFAULT_SERVICE_CPU = 2.0
DEFAULT_SERVICE_MEM = 2048 * MIB
#: Simulator defaults for a node without ``maxcpu``/``maxmem``.
DEFAULT_NODE_MAXCPU = 24
DEFAULT_NODE_MAXMEM = 128 * GIB

#: ``PVE_HA_TOPSIS_CRITERIA`` (scheduler.rs): average cpu, highest cpu, average memory,
#: highest memory — all minimised.
PVE_TOPSIS_WEIGHTS: tuple[float, float, float, float] = (-1.0, -2.0, -5.0, -10.0)

#: Manager service states (``Manager.pm $valid_service_states``).
SERVICE_STATES = frozenset(
    {
        "stopped",
        "request_stop",
        "request_start",
        "request_start_balance",
        "started",
        "fence",
        "recovery",
        "migrate",
        "relocate",
        "freeze",
        "error",
    }
)
MODES = ("basic", "static", "dynamic")
PREFERENCES = ("none", "best-score", "try-next")

Mode = Literal["basic", "static", "dynamic"]
Preference = Literal["none", "best-score", "try-next"]


class PveQueryError(ValueError):
    """A malformed query; the message is one sentence naming the offending field."""


# =============================================================================== model


@dataclass(frozen=True)
class Node:
    """A cluster node as the CRS sees it (``hardware_status`` / static node stats)."""

    name: str
    maxcpu: int = DEFAULT_NODE_MAXCPU
    maxmem: int = DEFAULT_NODE_MAXMEM
    online: bool = True


@dataclass(frozen=True)
class Service:
    """One HA service (``$ss->{$sid}`` merged with its config and usage stats).

    ``maxcpu``/``maxmem`` are the static (configured) stats, ``cpu``/``mem`` the
    measured (dynamic) ones. ``running`` is the LRM's report (``$sd->{running}``).
    ``ha`` is False for a non-HA guest, which only contributes load.
    """

    sid: str
    node: str
    state: str = "started"
    target: str | None = None
    running: bool = False
    maxcpu: float = DEFAULT_SERVICE_MAXCPU
    maxmem: int = DEFAULT_SERVICE_MAXMEM
    cpu: float = DEFAULT_SERVICE_CPU
    mem: int = DEFAULT_SERVICE_MEM
    failback: bool = True
    group: str | None = None
    ha: bool = True


@dataclass(frozen=True)
class Cluster:
    """A cluster snapshot: scheduler mode, nodes and services (sid → service)."""

    mode: Mode
    nodes: Mapping[str, Node]
    services: Mapping[str, Service]

    @property
    def online_nodes(self) -> list[str]:
        """Names of the online nodes, sorted."""
        return sorted(name for name, node in self.nodes.items() if node.online)

    def ha_sids(self) -> list[str]:
        """HA service ids in sid order."""
        return sorted(sid for sid, svc in self.services.items() if svc.ha)

    def usage_order(self) -> list[str]:
        """``recompute_online_node_usage`` order: HA services by sid, then non-HA guests."""
        ha = self.ha_sids()
        return ha + sorted(sid for sid, svc in self.services.items() if not svc.ha)


# =============================================================================== rules


@dataclass
class Rule:
    """One HA rule (``rules.cfg`` section), mutable while the transforms run."""

    ruleid: str
    type: Literal["node-affinity", "resource-affinity"]
    resources: set[str]
    order: int
    nodes: dict[str, int] = field(default_factory=dict)  # node → priority (node-affinity)
    strict: bool = False  # node-affinity
    affinity: str | None = None  # resource-affinity: 'positive' | 'negative'
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
class Group:
    """A legacy HA group (``groups.cfg``)."""

    name: str
    nodes: dict[str, int]
    restricted: bool = False
    nofailback: bool = False
    comment: str | None = None


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


_HEADER_RE = re.compile(r"^(\S+):\s*(\S+)\s*$")
_PROPERTY_RE = re.compile(r"^\s+(\S+)(\s+(.*\S))?\s*$")
_CONFIGID_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_\-]+$")
_NODE_PRIORITY_RE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)(:(\d+))?$")
_SID_RE = re.compile(r"^[a-z]+:\S+$")
_SPLIT_RE = re.compile(r"[\s,;]+")


def _split_list(value: str) -> list[str]:
    """``PVE::Tools::split_list``."""
    return [item for item in _SPLIT_RE.split(value.strip()) if item]


def _parse_sections(
    text: str, what: str
) -> tuple[list[tuple[str, str, dict[str, str]]], list[str]]:
    """``PVE::SectionConfig::parse_config``: ``type: id`` headers, tab-indented ``key value``.

    Returns the sections (type, id, properties) and warnings for ignored lines.
    """
    sections: list[tuple[str, str, dict[str, str]]] = []
    warnings: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        header = _HEADER_RE.match(line)
        if not header:
            warnings.append(f"{what}: ignore config line: {line.strip()}")
            continue
        stype, sid = header.group(1).lower(), header.group(2)
        props: dict[str, str] = {}
        skip = False
        if not _CONFIGID_RE.match(sid):
            warnings.append(f"{what}: invalid section id '{sid}', section skipped")
            skip = True
        while i < len(lines):
            raw = lines[i].rstrip("\r")
            if not raw.strip():
                break
            i += 1
            if raw.lstrip().startswith("#"):
                continue
            prop = _PROPERTY_RE.match(raw)
            if not prop:
                warnings.append(f"{what} (section '{sid}'): ignore config line: {raw.strip()}")
                continue
            key, value = prop.group(1), prop.group(3)
            if key in props:
                warnings.append(f"{what} (section '{sid}'): duplicate attribute '{key}'")
                continue
            props[key] = "1" if value is None else value
        if not skip:
            sections.append((stype, sid, props))
    return sections, warnings


def _parse_bool(value: str) -> bool | None:
    lowered = value.strip().lower()
    if lowered in ("1", "on", "yes", "true"):
        return True
    if lowered in ("0", "off", "no", "false"):
        return False
    return None


def _parse_node_list(value: str) -> tuple[dict[str, int], list[str]]:
    """``pve-ha-group-node-list``: ``node[:priority]`` items (priority defaults to 0)."""
    nodes: dict[str, int] = {}
    bad: list[str] = []
    for item in _split_list(value):
        match = _NODE_PRIORITY_RE.match(item)
        if not match:
            bad.append(item)
            continue
        nodes[match.group(1)] = int(match.group(4)) if match.group(4) is not None else 0
    return nodes, bad


def _parse_resources(value: str) -> tuple[set[str], list[str]]:
    resources: set[str] = set()
    bad: list[str] = []
    for item in _split_list(value):
        if _SID_RE.match(item):
            resources.add(item)
        else:
            bad.append(item)
    return resources, bad


def parse_rules(text: str | None, *, first_order: int = 1) -> tuple[list[Rule], list[str]]:
    """Parse ``rules.cfg`` (``PVE::HA::Rules->parse_config``).

    Sections are ``node-affinity: <id>`` (``resources``, ``nodes``, ``strict``,
    ``disable``, ``comment``) and ``resource-affinity: <id>`` (``resources``,
    ``affinity``, ``disable``, ``comment``). Like Proxmox, a section that lacks a
    required property or has an unknown type is skipped with a warning.

    Returns:
        The rules in file order and the parser warnings.
    """
    if not text:
        return [], []
    sections, warnings = _parse_sections(text, "rules")
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
        allowed = {"resources", "disable", "comment"} | (
            {"nodes", "strict"} if stype == "node-affinity" else {"affinity"}
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
            rule.nodes, bad = _parse_node_list(props["nodes"])
            for item in bad:
                warnings.append(f"{prefix}: invalid node entry '{item}' ignored")
            if "strict" in props:
                strict = _parse_bool(props["strict"])
                if strict is None:
                    warnings.append(f"{prefix}: invalid value for 'strict', using 0")
                rule.strict = bool(strict)
        else:
            affinity = props.get("affinity")
            if affinity not in ("positive", "negative"):
                warnings.append(
                    f"{prefix}: 'affinity' must be 'positive' or 'negative', rule skipped"
                )
                continue
            rule.affinity = affinity
        seen.add(ruleid)
        rules.append(rule)
        order += 1
    return rules, warnings


def parse_groups(text: str | None) -> tuple[dict[str, Group], list[str]]:
    """Parse the legacy ``groups.cfg`` (``PVE::HA::Groups``).

    ``group: <name>`` sections with ``nodes n1:2,n2``, ``restricted 0|1``,
    ``nofailback 0|1`` and ``comment``.
    """
    if not text:
        return {}, []
    sections, warnings = _parse_sections(text, "groups")
    groups: dict[str, Group] = {}
    for stype, name, props in sections:
        if stype != "group":
            warnings.append(f"groups: unknown section type '{stype}' for '{name}', skipped")
            continue
        if "nodes" not in props:
            warnings.append(f"group '{name}': missing value for required option 'nodes', skipped")
            continue
        nodes, bad = _parse_node_list(props["nodes"])
        for item in bad:
            warnings.append(f"group '{name}': invalid node entry '{item}' ignored")
        groups[name] = Group(
            name=name,
            nodes=nodes,
            restricted=bool(_parse_bool(props.get("restricted", "0"))),
            nofailback=bool(_parse_bool(props.get("nofailback", "0"))),
            comment=props.get("comment"),
        )
    return groups, warnings


def groups_to_rules(
    groups: Mapping[str, Group], services: Mapping[str, Service], *, first_order: int = 1
) -> list[Rule]:
    """Migrate legacy groups to node-affinity rules (``Groups.pm migrate_groups_to_rules``).

    Every group used by at least one service becomes the rule ``ha-group-<g>``
    with the group's nodes and priorities; ``restricted`` becomes ``strict``.
    """
    members: dict[str, set[str]] = {}
    for sid, svc in services.items():
        if svc.group and svc.group in groups:
            members.setdefault(svc.group, set()).add(sid)
    rules: list[Rule] = []
    order = first_order
    for name in sorted(members):
        group = groups[name]
        rules.append(
            Rule(
                ruleid=f"ha-group-{name}",
                type="node-affinity",
                resources=set(members[name]),
                order=order,
                nodes=dict(group.nodes),
                strict=group.restricted,
                comment=group.comment or f"Generated from HA group '{name}'.",
            )
        )
        order += 1
    return rules


def apply_groups(
    services: Mapping[str, Service], groups: Mapping[str, Group]
) -> dict[str, Service]:
    """A group's ``nofailback 1`` turns off failback for the services in it."""
    out: dict[str, Service] = {}
    for sid, svc in services.items():
        group = groups.get(svc.group) if svc.group else None
        if group is not None and group.nofailback and svc.failback:
            svc = replace(svc, failback=False)
        out[sid] = svc
    return out


def _enabled(rules: Mapping[str, Rule], rtype: str, affinity: str | None = None) -> dict[str, Rule]:
    return {
        rid: rule
        for rid, rule in rules.items()
        if rule.type == rtype
        and not rule.disabled
        and (affinity is None or rule.affinity == affinity)
    }


def _find_disjoint_rules_resource_sets(
    rules: Mapping[str, Rule],
) -> list[tuple[list[str], set[str]]]:
    """``Rules/Helpers.pm find_disjoint_rules_resource_sets`` (same greedy merge order)."""
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


def _has_multiple_priorities(rule: Rule) -> bool:
    return len(set(rule.nodes.values())) > 1


def check_feasibility(
    rules: Mapping[str, Rule], nodes: Sequence[str]
) -> dict[str, dict[str, list[str]]]:
    """``PVE::HA::Rules->check_feasibility``: errors per rule id (and property).

    The checks run in plugin registration order (node affinity, resource affinity,
    then the global inter-plugin checks), all on the same, unmodified rule set.
    """
    errors: dict[str, dict[str, list[str]]] = {}

    def push(ruleid: str, message: str) -> None:
        errors.setdefault(ruleid, {}).setdefault("resources", []).append(message)

    node_affinity = _enabled(rules, "node-affinity")
    resource_affinity = _enabled(rules, "resource-affinity")
    positive = _enabled(rules, "resource-affinity", "positive")
    negative = _enabled(rules, "resource-affinity", "negative")

    # NodeAffinity: check_single_resource_reference
    resource_ruleids: dict[str, list[str]] = {}
    for rid in sorted(node_affinity):
        for sid in node_affinity[rid].resources:
            resource_ruleids.setdefault(sid, []).append(rid)
    conflicts = sorted(
        (rid, sid) for sid, rids in resource_ruleids.items() if len(rids) > 1 for rid in rids
    )
    for rid, sid in conflicts:
        push(rid, f"resource '{sid}' is already used in another node affinity rule")

    # ResourceAffinity: check_resource_affinity_resources_count
    for rid in sorted(r for r, rule in resource_affinity.items() if len(rule.resources) < 2):
        push(rid, "rule is ineffective as there are less than two resources")

    # ResourceAffinity: check_negative_resource_affinity_resources_count
    for rid in sorted(r for r, rule in negative.items() if len(rule.resources) > len(nodes)):
        push(rid, "rule defines more resources than available nodes")

    # ResourceAffinity: check_inter_resource_affinity_rules_consistency
    pairs: list[tuple[str, str]] = []
    for ruleids, resources in _find_disjoint_rules_resource_sets(positive):
        for nid in sorted(negative):
            if len(resources & negative[nid].resources) < 2:
                continue
            pairs.append(("negative", nid))
            pairs.extend(("positive", rid) for rid in ruleids)
    for kind, rid in sorted(pairs):
        other = "positive" if kind == "negative" else "negative"
        push(rid, f"rule shares two or more resources with a {other} resource affinity rule")

    # global: check_single_priority_node_affinity_in_resource_affinity_rules
    pairs = []
    for rid in sorted(resource_affinity):
        resources = resource_affinity[rid].resources
        paired = [n for n in sorted(node_affinity) if resources & node_affinity[n].resources]
        if any(_has_multiple_priorities(node_affinity[n]) for n in paired):
            pairs.append(("resource-affinity", rid))
            pairs.extend(("node-affinity", n) for n in paired)
    for kind, rid in sorted(pairs):
        if kind == "node-affinity":
            push(
                rid,
                "resources are in a resource affinity rule and cannot be in"
                " a node affinity rule with multiple priorities",
            )
        else:
            push(rid, "resources are in node affinity rules with multiple priorities")

    # global: check_single_node_affinity_per_positive_resource_affinity_rule
    pairs = []
    for ruleids, resources in _find_disjoint_rules_resource_sets(positive):
        paired = [n for n in sorted(node_affinity) if resources & node_affinity[n].resources]
        if len(paired) > 1:
            pairs.extend(("positive", rid) for rid in ruleids)
            pairs.extend(("node-affinity", n) for n in paired)
    for kind, rid in sorted(pairs):
        if kind == "positive":
            push(rid, "resources are in multiple node affinity rules")
        else:
            push(
                rid,
                "at least one resource is in a positive resource affinity"
                " rule and there are other resources in at least one"
                " other node affinity rule already",
            )

    # global: check_negative_resource_affinity_node_affinity_consistency
    pairs = []
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
            push(
                rid,
                "two or more resources are restricted to less nodes than"
                " available to the resources",
            )
        else:
            push(
                rid,
                "at least one resource is in a negative resource affinity"
                " rule and this rule would restrict these to less nodes"
                " than available to the resources",
            )
    return errors


def transform_rules(rules: Sequence[Rule], nodes: Sequence[str]) -> tuple[list[Rule], list[str]]:
    """``PVE::HA::Rules->transform``: drop infeasible rules, then run the transforms.

    Returns the resulting rules (copies; the input is left untouched) and the
    ``Drop rule '<id>', because <reason>.`` messages, sorted by rule id.

    Transforms, in registration order:

    1. merge connected positive resource-affinity rules into ``_merged-<ids>``;
    2. infer ``_implicit-negative-<positive>-<a>-<b>`` rules: every member of a
       positive group is kept apart from its partners' negative partners;
    3. positive partners join a member's node-affinity rule.
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

    # ResourceAffinity: merge_connected_positive_resource_affinity_rules
    positive = _enabled(current, "resource-affinity", "positive")
    for ruleids, resources in _find_disjoint_rules_resource_sets(positive):
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

    # ResourceAffinity: create_implicit_negative_resource_affinity_rules
    positive = _enabled(current, "resource-affinity", "positive")
    negative = _enabled(current, "resource-affinity", "negative")
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

    # global: create_implicit_positive_resource_affinity_node_affinity_rules
    positive = _enabled(current, "resource-affinity", "positive")
    node_affinity = _enabled(current, "node-affinity")
    for pid in sorted(positive):
        members = positive[pid].resources
        for rid in sorted(node_affinity, key=lambda r: (node_affinity[r].order, r)):
            if node_affinity[rid].resources.isdisjoint(members):
                continue
            node_affinity[rid].resources |= members
            break

    ordered = sorted(current.values(), key=lambda r: (r.order, r.ruleid))
    return ordered, messages


def compile_rules(rules: Sequence[Rule]) -> CompiledRules:
    """``PVE::HA::Rules->compile``: per-sid node-affinity rule and affinity partner sets."""
    node_affinity: dict[str, Rule] = {}
    positive: dict[str, set[str]] = {}
    negative: dict[str, set[str]] = {}
    for rule in sorted(rules, key=lambda r: (r.order, r.ruleid)):
        if rule.disabled:
            continue
        if rule.type == "node-affinity":
            for sid in rule.resources:
                node_affinity.setdefault(sid, rule)
        else:
            target = positive if rule.affinity == "positive" else negative
            for sid in rule.resources:
                for csid in rule.resources:
                    if csid != sid:
                        target.setdefault(sid, set()).add(csid)
    return CompiledRules(
        node_affinity=node_affinity,
        positive={sid: frozenset(v) for sid, v in positive.items()},
        negative={sid: frozenset(v) for sid, v in negative.items()},
        rules=tuple(rules),
    )


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


def get_used_service_nodes(
    online_nodes: Iterable[str] | set[str], state: str, node: str | None, target: str | None
) -> tuple[str | None, str | None]:
    """``Usage.pm get_used_service_nodes``: the (current, target) nodes a service loads.

    stopped/request_start load nothing; started, request_stop, fence, freeze,
    error and recovery load the current node; migrate/relocate load the current
    and the target node; request_start_balance loads the target node. Offline
    nodes are never loaded.
    """
    online = online_nodes if isinstance(online_nodes, set) else set(online_nodes)
    if state in ("stopped", "request_start"):
        return None, None
    current = None
    if state in (
        "started",
        "request_stop",
        "fence",
        "freeze",
        "error",
        "recovery",
        "migrate",
        "relocate",
    ):
        current = node if node in online else None
    tgt = None
    if state in ("migrate", "relocate", "request_start_balance"):
        tgt = target if target is not None and target in online else None
    return current, tgt


def get_resource_affinity(
    compiled: CompiledRules, sid: str, cluster: Cluster, online_nodes: Iterable[str]
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
        svc = cluster.services.get(csid)
        if svc is None:
            continue
        current, target = get_used_service_nodes(online, svc.state, svc.node, svc.target)
        node = target if target is not None else current
        if node is not None:
            together[node] = together.get(node, 0) + 1
    for csid in sorted(compiled.negative.get(sid, ())):
        svc = cluster.services.get(csid)
        if svc is None:
            continue
        current, target = get_used_service_nodes(online, svc.state, svc.node, svc.target)
        separate.update(n for n in (current, target) if n is not None)
    return together, separate


# =============================================================================== usage


@dataclass
class NodeStats:
    """``NodeStats`` (node.rs): cpu in cores, memory in bytes."""

    cpu: float
    maxcpu: int
    mem: int
    maxmem: int

    def add_started(self, maxcpu: float, maxmem: int) -> None:
        """``add_started_resource``: a maxcpu of 0 means "no limit", i.e. the node's maxcpu."""
        self.cpu = self.cpu + (float(self.maxcpu) if maxcpu == 0.0 else maxcpu)
        self.mem = self.mem + maxmem

    def add_running(self, cpu: float, mem: int) -> None:
        """``add_running_resource``."""
        self.cpu = self.cpu + cpu
        self.mem = self.mem + mem

    def remove_running(self, cpu: float, mem: int) -> None:
        """``remove_running_resource``, floored at 0."""
        self.cpu = max(0.0, self.cpu - cpu)
        self.mem = max(0, self.mem - mem)

    def cpu_load(self) -> float:
        """cpu / maxcpu."""
        return self.cpu / float(self.maxcpu)

    def mem_load(self) -> float:
        """mem / maxmem."""
        return float(self.mem) / float(self.maxmem)

    def load(self) -> float:
        """(cpu load + memory load) / 2."""
        return (self.cpu_load() + self.mem_load()) / 2.0

    def copy(self) -> NodeStats:
        """A copy."""
        return NodeStats(self.cpu, self.maxcpu, self.mem, self.maxmem)


def node_imbalance(stats: Sequence[NodeStats], *, normalized: bool = False) -> float:
    """``calculate_node_imbalance``: coefficient of variation of the node loads.

    ``load = (cpu/maxcpu + mem/maxmem) / 2``; I = population σ / mean, or 0 when
    all loads are 0. With ``normalized`` it is divided by √(N−1) as in
    proxmox-resource-scheduling 2.1.0 (0 for a single node); the Proxmox test
    logs, and the thresholds here, use the raw value.
    """
    count = len(stats)
    if count == 0:
        return 0.0
    loads = [s.load() for s in stats]
    load_sum = 0.0
    for load in loads:
        load_sum = load_sum + load
    if load_sum == 0.0:
        return 0.0
    mean = load_sum / count
    squared = 0.0
    for load in loads:
        squared = squared + (load - mean) * (load - mean)
    value = math.sqrt(squared / count) / mean
    if normalized:
        return 0.0 if count < 2 else value / math.sqrt(count - 1)
    return value


def truncate_imbalance(value: float) -> float:
    """``trunc(1e15 · I) / 1e15``, the brute-force comparison precision."""
    return float(math.trunc(value * 1e15)) / 1e15


def pve_topsis_alternative(stats: Sequence[NodeStats]) -> list[float]:
    """``[1+RMS cpu load, 1+max cpu load, 1+RMS mem load, 1+max mem load]`` (scheduler.rs)."""
    highest_cpu = squares_cpu = highest_mem = squares_mem = 0.0
    for s in stats:
        cpu = s.cpu_load()
        highest_cpu = max(highest_cpu, cpu)
        squares_cpu = squares_cpu + cpu * cpu
        mem = s.mem_load()
        highest_mem = max(highest_mem, mem)
        squares_mem = squares_mem + mem * mem
    n = float(len(stats))
    return [
        1.0 + math.sqrt(squares_cpu / n),
        1.0 + highest_cpu,
        1.0 + math.sqrt(squares_mem / n),
        1.0 + highest_mem,
    ]


def score_nodes_to_start_service(
    nodes: Sequence[tuple[str, NodeStats]], maxcpu: float, maxmem: int
) -> dict[str, float]:
    """``scheduler.rs score_nodes_to_start_service``: TOPSIS closeness per node (higher is better).

    Each node gives one alternative: the cluster as if the service (``maxcpu``
    cores, or the node's maxcpu when 0, and ``maxmem`` bytes) were added on it.

    Raises:
        McdmError: if the TOPSIS matrix is invalid (e.g. a node without capacity).
    """
    matrix: list[list[float]] = []
    for target_index in range(len(nodes)):
        alternative = []
        for index, (_, stats) in enumerate(nodes):
            node = stats.copy()
            if index == target_index:
                node.add_started(maxcpu, maxmem)
            alternative.append(node)
        matrix.append(pve_topsis_alternative(alternative))
    if not matrix:
        return {}
    scores = topsis_scores(matrix, PVE_TOPSIS_WEIGHTS)
    return {name: float(scores[i]) for i, (name, _) in enumerate(nodes)}


class Usage:
    """``PVE::HA::Usage``: node usage for one scheduling round.

    Subclasses fill ``stats`` (static and dynamic) or ``counts`` (basic).
    """

    mode: Mode = "basic"

    def __init__(self, cluster: Cluster, online_nodes: Sequence[str]) -> None:
        self.cluster = cluster
        self.online = list(online_nodes)
        self.online_set = set(online_nodes)

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        """Scores per online node; a *lower* score is better (as the Perl callers expect)."""
        raise NotImplementedError

    def imbalance_stats(self) -> list[NodeStats]:
        """Per-node stats for the imbalance and for rebalancing (online nodes, sorted)."""
        return []

    def imbalance(self, *, normalized: bool = False) -> float:
        """The node imbalance (raw coefficient of variation unless ``normalized``)."""
        return node_imbalance(self.imbalance_stats(), normalized=normalized)

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        """The (cpu, mem) a service takes along when it is moved by the rebalancer."""
        raise NotImplementedError


class BasicUsage(Usage):
    """``Usage::Basic``: a node's score is the number of services loading it."""

    mode: Mode = "basic"

    def __init__(self, cluster: Cluster, online_nodes: Sequence[str]) -> None:
        super().__init__(cluster, online_nodes)
        self.counts: dict[str, int] = dict.fromkeys(self.online, 0)
        for sid in cluster.usage_order():
            svc = cluster.services[sid]
            for node in get_used_service_nodes(self.online_set, svc.state, svc.node, svc.target):
                if node is not None:
                    self.counts[node] += 1

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        return {node: float(count) for node, count in self.counts.items()}

    def imbalance(self, *, normalized: bool = False) -> float:
        return 0.0

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        return 0.0, 0


class _TopsisUsage(Usage):
    """Static and dynamic usage: start scoring by TOPSIS over ``scoring`` node stats."""

    scoring: dict[str, NodeStats]

    def score_nodes_to_start_service(self, sid: str) -> dict[str, float]:
        svc = self.cluster.services[sid]
        nodes = [(n, self.scoring[n]) for n in self.online]
        try:
            scores = score_nodes_to_start_service(nodes, svc.maxcpu, svc.maxmem)
        except McdmError:
            # Proxmox: a scoring error scores every node 0, so the pick is alphabetical.
            return dict.fromkeys(self.online, 0.0)
        return {n: 0.0 - score for n, score in scores.items()}


class StaticUsage(_TopsisUsage):
    """``Usage::Static``: each service adds its maxcpu and maxmem on every node it loads."""

    mode: Mode = "static"

    def __init__(self, cluster: Cluster, online_nodes: Sequence[str]) -> None:
        super().__init__(cluster, online_nodes)
        self.stats: dict[str, NodeStats] = {
            n: NodeStats(0.0, cluster.nodes[n].maxcpu, 0, cluster.nodes[n].maxmem)
            for n in self.online
        }
        for sid in cluster.usage_order():
            svc = cluster.services[sid]
            for node in get_used_service_nodes(self.online_set, svc.state, svc.node, svc.target):
                if node is not None:
                    self.stats[node].add_started(svc.maxcpu, svc.maxmem)
        self.scoring = self.stats

    def imbalance_stats(self) -> list[NodeStats]:
        return [self.stats[n] for n in self.online]

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        svc = self.cluster.services[sid]
        return svc.maxcpu, svc.maxmem


class DynamicUsage(_TopsisUsage):
    """``Usage::Dynamic``: measured usage.

    Without a node baseline in the query, a node's measured usage is the sum of
    the measured cpu/mem of the running services that load it. Start scoring
    additionally adds the max values (maxcpu, maxmem) of the services placed on
    a node that are not running yet. A service is running when
    ``(started and running) or (not started and it loads its current node)``.
    """

    mode: Mode = "dynamic"

    def __init__(self, cluster: Cluster, online_nodes: Sequence[str]) -> None:
        super().__init__(cluster, online_nodes)

        def fresh() -> dict[str, NodeStats]:
            return {
                n: NodeStats(0.0, cluster.nodes[n].maxcpu, 0, cluster.nodes[n].maxmem)
                for n in self.online
            }

        self.measured = fresh()
        self.scoring = fresh()
        for sid in cluster.usage_order():
            svc = cluster.services[sid]
            current, target = get_used_service_nodes(
                self.online_set, svc.state, svc.node, svc.target
            )
            if current is None and target is None:
                continue
            running = (svc.state == "started" and svc.running) or (
                svc.state != "started" and current is not None
            )
            for node in (current, target):
                if node is None:
                    continue
                if running:
                    self.measured[node].add_running(svc.cpu, svc.mem)
                    self.scoring[node].add_running(svc.cpu, svc.mem)
                else:
                    self.scoring[node].add_started(svc.maxcpu, svc.maxmem)

    def imbalance_stats(self) -> list[NodeStats]:
        return [self.measured[n] for n in self.online]

    def service_move_stats(self, sid: str) -> tuple[float, int]:
        svc = self.cluster.services[sid]
        return svc.cpu, svc.mem


def make_usage(cluster: Cluster) -> tuple[Usage, list[str]]:
    """``recompute_online_node_usage``: the usage plugin for the cluster's mode.

    Like Proxmox, a static/dynamic init failure (a node without cpu or memory
    capacity) falls back to ``basic`` for the round; the warning is returned.
    """
    online = cluster.online_nodes
    warnings: list[str] = []
    if cluster.mode in ("static", "dynamic"):
        bad = [n for n in online if cluster.nodes[n].maxcpu <= 0 or cluster.nodes[n].maxmem <= 0]
        if bad:
            warnings.append(
                f"fallback to 'basic' scheduler mode, init for '{cluster.mode}' failed - "
                f"node '{bad[0]}' has no cpu or memory capacity"
            )
        elif cluster.mode == "static":
            return StaticUsage(cluster, online), warnings
        else:
            return DynamicUsage(cluster, online), warnings
    return BasicUsage(cluster, online), warnings


# =============================================================================== decisions


def _is_allowed_on_node(together: Mapping[str, int], separate: set[str], node: str) -> bool:
    return bool(together.get(node)) or node not in separate


def select_service_node(
    compiled: CompiledRules,
    usage: Usage,
    cluster: Cluster,
    sid: str,
    preference: Preference = "none",
    *,
    failed_nodes: Sequence[str] = (),
    maintenance_fallback: str | None = None,
) -> tuple[str | None, dict[str, float] | None]:
    """``Manager.pm select_service_node``: the node the service should be on.

    Returns the node (or None when no node is possible) and the node scores if
    they had to be computed (lower is better).
    """
    svc = cluster.services[sid]
    current = svc.node
    online = usage.online
    allowed, pri = get_node_affinity(compiled, sid, online)
    if not pri:
        return None, None
    together, separate = get_resource_affinity(compiled, sid, cluster, online)

    # stay on current node if possible (avoids random migrations)
    if (
        preference == "none"
        and not svc.failback
        and current in allowed
        and _is_allowed_on_node(together, separate, current)
    ):
        return current, None

    if preference == "try-next":
        pri -= set(failed_nodes)

    # apply_negative_resource_affinity / apply_positive_resource_affinity
    pri -= separate
    possible = {node: count for node, count in together.items() if node in pri}
    if possible:
        majority = sorted(sorted(possible), key=lambda node: -possible[node])[0]
        pri = {majority}

    if maintenance_fallback is not None and maintenance_fallback in pri:
        return maintenance_fallback, None

    if preference == "none" and current in pri:
        return current, None

    scores = usage.score_nodes_to_start_service(sid)
    nodes = sorted(pri, key=lambda node: (scores.get(node, 0.0), node))
    if not nodes:
        return None, scores
    found = nodes.index(current) if current in nodes else None
    if preference == "try-next" and found is not None and found < len(nodes) - 1:
        return nodes[found + 1], scores
    return nodes[0], scores


@dataclass(frozen=True)
class MigrationCandidate:
    """``MigrationCandidate`` (scheduler.rs): a leader, its source, a target and the stats."""

    sid: str
    source: str
    target: str
    cpu: float
    mem: int
    members: tuple[str, ...] = ()


def stats_with_migration(
    nodes: Sequence[tuple[str, NodeStats]], candidate: MigrationCandidate
) -> list[NodeStats]:
    """``node_imbalance_with_migration``'s cluster: the candidate's stats removed from its
    source (floored at 0) and added to its target."""
    out = []
    for name, stats in nodes:
        new = stats.copy()
        if name == candidate.source:
            new.remove_running(candidate.cpu, candidate.mem)
        elif name == candidate.target:
            new.add_running(candidate.cpu, candidate.mem)
        out.append(new)
    return out


def sort_scored_migrations(
    scored: Iterable[tuple[float, MigrationCandidate]],
) -> list[tuple[float, MigrationCandidate]]:
    """Order brute-force results best first: by ``trunc(1e15·I′)/1e15``, then by the
    ``(sid, source, target)`` strings (so ``"vm:1000"`` sorts before ``"vm:200"``).

    The returned imbalances are the truncated ones.
    """
    truncated = [(truncate_imbalance(value), candidate) for value, candidate in scored]
    return sorted(
        truncated, key=lambda item: (item[0], item[1].sid, item[1].source, item[1].target)
    )


def score_migrations_bruteforce(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> list[tuple[float, MigrationCandidate]]:
    """``score_best_balancing_migrations``: every candidate with its imbalance after the
    move (subtract from the source, floored at 0; add to the target), best first."""
    return sort_scored_migrations(
        (node_imbalance(stats_with_migration(nodes, candidate)), candidate)
        for candidate in candidates
    )


def select_best_migration_bruteforce(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> tuple[MigrationCandidate, float] | None:
    """Exhaustive search: the lowest truncated imbalance I′ after the move wins.

    Ties go to the smallest ``(sid, source, target)`` string tuple.
    """
    scored = score_migrations_bruteforce(nodes, candidates)
    if not scored:
        return None
    value, candidate = scored[0]
    return candidate, value


def select_best_migration_topsis(
    nodes: Sequence[tuple[str, NodeStats]], candidates: Sequence[MigrationCandidate]
) -> tuple[MigrationCandidate, float, list[float]] | None:
    """TOPSIS over the post-move clusters' load vectors; ties keep the candidate order.

    Returns the best candidate, its (untruncated) imbalance after the move and
    the closeness of every candidate.
    """
    if not candidates:
        return None
    matrix = [pve_topsis_alternative(stats_with_migration(nodes, c)) for c in candidates]
    scores = topsis_scores(matrix, PVE_TOPSIS_WEIGHTS)
    best = candidates[topsis_rank(matrix, PVE_TOPSIS_WEIGHTS)[0]]
    return best, node_imbalance(stats_with_migration(nodes, best)), [float(s) for s in scores]


def _rebalance_candidates(
    compiled: CompiledRules, usage: Usage, cluster: Cluster
) -> list[MigrationCandidate]:
    """The auto-rebalance candidates: bundles of started positive partners, with targets.

    A bundle is keyed by its alphabetically first started member and skipped
    while a partner moves or its started members are split over several nodes.
    Targets: the top-priority node-affinity nodes, minus the nodes of negative
    partners, minus the current node. Only HA services in state ``started`` move.
    """
    online = usage.online
    started = {sid for sid in cluster.ha_sids() if cluster.services[sid].state == "started"}
    candidates: list[MigrationCandidate] = []
    for sid in sorted(started):
        partners = compiled.positive.get(sid, frozenset())
        members = sorted({sid} | {p for p in partners if p in started})
        if members[0] != sid:
            continue
        if any(
            cluster.services[p].state in ("migrate", "relocate")
            for p in partners
            if p in cluster.services
        ):
            continue
        source = cluster.services[sid].node
        if any(cluster.services[m].node != source for m in members):
            continue
        if source not in usage.online_set:
            continue
        _, preferred = get_node_affinity(compiled, sid, online)
        separate: set[str] = set()
        for member in members:
            separate |= get_resource_affinity(compiled, member, cluster, online)[1]
        cpu, mem = 0.0, 0
        for member in members:
            member_cpu, member_mem = usage.service_move_stats(member)
            cpu, mem = cpu + member_cpu, mem + member_mem
        for target in sorted(preferred - separate - {source}):
            candidates.append(MigrationCandidate(sid, source, target, cpu, mem, tuple(members)))
    return candidates


def load_balance(
    compiled: CompiledRules,
    usage: Usage,
    cluster: Cluster,
    *,
    method: Literal["bruteforce", "topsis"] = "bruteforce",
    threshold: float = 0.3,
    margin: float = 0.1,
) -> dict[str, Any]:
    """``Manager.pm load_balance`` for one triggered round (the hold counter has expired).

    Returns an answer dict with ``migration`` (``{"sid", "source", "target"}`` or
    None), the ``imbalance`` before/after (raw CV), the bundle ``comoves`` and a
    ``reason``.
    """
    answer: dict[str, Any] = {"migration": None}
    if usage.mode == "basic":
        answer["reason"] = "the basic scheduler mode never rebalances"
        return answer
    moving = sorted(
        sid for sid, svc in cluster.services.items() if svc.state in ("migrate", "relocate")
    )
    if moving:
        answer["reason"] = f"service '{moving[0]}' is still moving"
        return answer
    stats = usage.imbalance_stats()
    before = node_imbalance(stats)
    answer["imbalance"] = {
        "before": before,
        "before_normalized": node_imbalance(stats, normalized=True),
    }
    if before <= threshold:
        answer["reason"] = f"imbalance {before:.2f} is not above the threshold {threshold}"
        return answer
    candidates = _rebalance_candidates(compiled, usage, cluster)
    nodes = [(n, s) for n, s in zip(usage.online, stats, strict=True)]
    if method == "topsis":
        topsis_pick = select_best_migration_topsis(nodes, candidates)
        picked = None if topsis_pick is None else (topsis_pick[0], topsis_pick[1])
    else:
        picked = select_best_migration_bruteforce(nodes, candidates)
    if picked is None:
        answer["reason"] = "no migration candidate"
        return answer
    candidate, after = picked
    answer["imbalance"]["after"] = after
    answer["imbalance"]["after_normalized"] = node_imbalance(
        stats_with_migration(nodes, candidate), normalized=True
    )
    improvement = (before - after) / before
    if improvement < margin:
        answer["reason"] = (
            f"best move {candidate.sid} to {candidate.target} improves the imbalance by "
            f"{improvement:.3f}, less than the margin {margin}"
        )
        return answer
    answer["migration"] = {
        "sid": candidate.sid,
        "source": candidate.source,
        "target": candidate.target,
    }
    answer["comoves"] = [m for m in candidate.members if m != candidate.sid]
    answer["reason"] = (
        f"auto rebalance - migrate {candidate.sid} to {candidate.target} "
        f"(expected change for imbalance from {before:.2f} to {after:.2f})"
    )
    return answer


def execute_command(
    compiled: CompiledRules,
    cluster: Cluster,
    sid: str,
    task: Literal["migrate", "relocate"],
    target: str,
) -> dict[str, Any]:
    """``update_crm_commands`` + ``queue_resource_motion`` for a manual migrate/relocate.

    Refused when the target is not online, when the service is already there, or
    when a negative partner is on (or moving to) the target. Positive partners
    not already on (or moving to) the target are queued along (``comoves``).
    """
    cmd = f"{task} {sid} {target}"
    svc = cluster.services[sid]
    node = cluster.nodes.get(target)
    if node is None or not node.online:
        return {
            "accepted": False,
            "comoves": [],
            "reason": f"crm command error - node not online: {cmd}",
        }
    if svc.node == target:
        return {
            "accepted": False,
            "comoves": [],
            "reason": f"ignore crm command - service already on target node: {cmd}",
        }
    for csid in sorted(compiled.negative.get(sid, ())):
        other = cluster.services.get(csid)
        if other is None:
            continue
        if other.node == target or other.target == target:
            return {
                "accepted": False,
                "comoves": [],
                "reason": (
                    f"crm command '{cmd}' error - service '{csid}' on node '{target}' in"
                    f" negative affinity with service '{sid}'"
                ),
            }
    comoves = []
    for csid in sorted(compiled.positive.get(sid, ())):
        other = cluster.services.get(csid)
        if other is None or other.node == target or other.target == target:
            continue
        comoves.append(csid)
    return {"accepted": True, "comoves": comoves, "reason": f"got crm command: {cmd}"}


# =============================================================================== query


#: The keys a query, a node, a service and each request may have (as in snapshots, a key that
#: is not one of them is an error: a misspelt key would otherwise silently take its default).
_QUERY_KEYS = ("mode", "nodes", "services", "rules", "groups", "query")
_NODE_KEYS = ("maxcpu", "maxmem", "online")
_SERVICE_KEYS = (
    "node",
    "state",
    "target",
    "running",
    "maxcpu",
    "maxmem",
    "cpu",
    "mem",
    "failback",
    "group",
    "ha",
)
_REQUEST_KEYS: Mapping[str, tuple[str, ...]] = {
    "select-node": ("sid", "preference", "failed_nodes", "maintenance_fallback"),
    "rebalance": ("method", "threshold", "margin"),
    "command": ("sid", "task", "target"),
}
#: Largest number a query may hold (cores, bytes, threshold, margin): 2⁵³, the largest integer
#: a float holds exactly — the arithmetic stays finite and exact in its whole numbers.
MAX_QUERY_NUMBER = 2**53


def _err(path: str, message: str) -> PveQueryError:
    return PveQueryError(f"field '{path}' {message}")


def _show(value: Any) -> str:
    """A value for a message: its JSON, shortened (a number of 4,000 digits is not repeated)."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:39] + "…"


def _known_keys(obj: Mapping[str, Any], path: str, allowed: Sequence[str]) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path else str(key)
            raise _err(where, f"is not a known key (known: {', '.join(allowed)})")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # an int of any size is finite


def _number(obj: Mapping[str, Any], key: str, path: str, default: float) -> float:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if not _is_number(value) or not 0 <= value <= MAX_QUERY_NUMBER:
        raise _err(f"{path}.{key}", f"must be a non-negative number up to 2^53, got {_show(value)}")
    return float(value)


def _bool(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _err(f"{path}.{key}", f"must be a boolean, got {_show(value)}")


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _err(path, f"must be an object, got {type(value).__name__}")
    return value


def _text(query: Mapping[str, Any], key: str) -> str | None:
    value = query.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _err(key, f"must be a string or null, got {type(value).__name__}")
    return value


def parse_query(query: Mapping[str, Any]) -> tuple[Cluster, Mapping[str, Any]]:
    """Validate a query dict and build the :class:`Cluster`; also return ``query["query"]``.

    Optional fields get Proxmox's defaults: node online, 24 cores, 128 GiB;
    service state ``started``, maxcpu 4, maxmem 4096 MiB, cpu 2, mem 2048 MiB,
    failback true, not running.

    Raises:
        PveQueryError: naming the first malformed field.
    """
    query = _mapping(query, "(query line)")
    _known_keys(query, "", _QUERY_KEYS)
    mode = query.get("mode", "basic")
    if mode not in MODES:
        raise _err("mode", f"must be one of basic, static, dynamic, got {_show(mode)}")
    raw_nodes = _mapping(query.get("nodes"), "nodes")
    if not raw_nodes:
        raise _err("nodes", "must name at least one node")
    nodes: dict[str, Node] = {}
    for name, spec in raw_nodes.items():
        path = f"nodes.{name}"
        spec = _mapping(spec, path)
        _known_keys(spec, path, _NODE_KEYS)
        maxcpu = _number(spec, "maxcpu", path, DEFAULT_NODE_MAXCPU)
        maxmem = _number(spec, "maxmem", path, DEFAULT_NODE_MAXMEM)
        nodes[name] = Node(
            name=name,
            maxcpu=int(maxcpu),
            maxmem=int(maxmem),
            online=_bool(spec, "online", path, True),
        )
    raw_services = _mapping(query.get("services", {}), "services")
    services: dict[str, Service] = {}
    for sid, spec in raw_services.items():
        path = f"services.{sid}"
        if not _SID_RE.match(sid):
            raise _err(path, "must be named like 'vm:100' or 'ct:100'")
        spec = _mapping(spec, path)
        _known_keys(spec, path, _SERVICE_KEYS)
        node = spec.get("node")
        if not isinstance(node, str) or node not in nodes:
            raise _err(f"{path}.node", f"must name a known node, got {_show(node)}")
        state = spec.get("state", "started")
        if not isinstance(state, str) or state not in SERVICE_STATES:
            raise _err(f"{path}.state", f"is not a valid service state: {_show(state)}")
        target = spec.get("target")
        if target is not None and (not isinstance(target, str) or target not in nodes):
            raise _err(f"{path}.target", f"must be null or name a known node, got {_show(target)}")
        group = spec.get("group")
        if group is not None and not isinstance(group, str):
            raise _err(f"{path}.group", "must be a string or null")
        services[sid] = Service(
            sid=sid,
            node=node,
            state=state,
            target=target,
            running=_bool(spec, "running", path, False),
            maxcpu=_number(spec, "maxcpu", path, DEFAULT_SERVICE_MAXCPU),
            maxmem=int(_number(spec, "maxmem", path, DEFAULT_SERVICE_MAXMEM)),
            cpu=_number(spec, "cpu", path, DEFAULT_SERVICE_CPU),
            mem=int(_number(spec, "mem", path, DEFAULT_SERVICE_MEM)),
            failback=_bool(spec, "failback", path, True),
            group=group,
            ha=_bool(spec, "ha", path, True),
        )
    request = _mapping(query.get("query"), "query")
    if len(request) != 1 or next(iter(request)) not in ("select-node", "rebalance", "command"):
        raise _err("query", "must hold exactly one of 'select-node', 'rebalance' or 'command'")
    return Cluster(mode=mode, nodes=nodes, services=services), request


def _prepare_rules(
    query: Mapping[str, Any], cluster: Cluster
) -> tuple[Cluster, CompiledRules, list[str], list[str]]:
    """Parse rules and groups, migrate groups, drop infeasible rules, compile."""
    rules, warnings = parse_rules(_text(query, "rules"))
    groups, group_warnings = parse_groups(_text(query, "groups"))
    warnings.extend(group_warnings)
    if groups:
        cluster = Cluster(cluster.mode, cluster.nodes, apply_groups(cluster.services, groups))
        existing = {rule.ruleid for rule in rules}
        next_order = max((rule.order for rule in rules), default=0) + 1
        for rule in groups_to_rules(groups, cluster.services, first_order=next_order):
            if rule.ruleid not in existing:
                rules.append(rule)
    transformed, dropped = transform_rules(rules, sorted(cluster.nodes))
    return cluster, compile_rules(transformed), dropped, warnings


def _known_sid(request: Mapping[str, Any], path: str, cluster: Cluster) -> str:
    sid = request.get("sid")
    if not isinstance(sid, str) or sid not in cluster.services:
        raise _err(f"{path}.sid", f"must name a service of the query, got {_show(sid)}")
    return sid


def decide(query: Mapping[str, Any]) -> dict[str, Any]:
    """Answer one query (see the module docstring for the protocol).

    Raises:
        PveQueryError: if the query is malformed.
    """
    cluster, request = parse_query(query)
    cluster, compiled, dropped, warnings = _prepare_rules(query, cluster)
    usage, usage_warnings = make_usage(cluster)
    warnings.extend(usage_warnings)
    kind, body = next(iter(request.items()))
    path = f"query.{kind}"
    body = _mapping(body, path)
    _known_keys(body, path, _REQUEST_KEYS[kind])
    answer: dict[str, Any]
    if kind == "select-node":
        sid = _known_sid(body, path, cluster)
        preference = body.get("preference", "none")
        if preference not in PREFERENCES:
            raise _err(
                f"{path}.preference",
                f"must be none, best-score or try-next, got {_show(preference)}",
            )
        failed = body.get("failed_nodes") or []
        if not isinstance(failed, list) or not all(isinstance(n, str) for n in failed):
            raise _err(f"{path}.failed_nodes", "must be a list of node names")
        fallback = body.get("maintenance_fallback")
        if fallback is not None and not isinstance(fallback, str):
            raise _err(f"{path}.maintenance_fallback", "must be a node name or null")
        node, scores = select_service_node(
            compiled,
            usage,
            cluster,
            sid,
            preference,
            failed_nodes=failed,
            maintenance_fallback=fallback,
        )
        answer = {"node": node}
        if scores is not None:
            answer["scores"] = {n: scores[n] for n in sorted(scores)}
    elif kind == "rebalance":
        method = body.get("method", "bruteforce")
        if method not in ("bruteforce", "topsis"):
            raise _err(f"{path}.method", f"must be bruteforce or topsis, got {_show(method)}")
        threshold = _number(body, "threshold", path, 0.3)
        margin = _number(body, "margin", path, 0.1)
        answer = load_balance(
            compiled, usage, cluster, method=method, threshold=threshold, margin=margin
        )
    else:
        sid = _known_sid(body, path, cluster)
        task = body.get("task", "migrate")
        if task not in ("migrate", "relocate"):
            raise _err(f"{path}.task", f"must be migrate or relocate, got {_show(task)}")
        target = body.get("target")
        if not isinstance(target, str):
            raise _err(f"{path}.target", f"must be a node name, got {_show(target)}")
        answer = execute_command(compiled, cluster, sid, task, target)
    answer["mode"] = usage.mode
    answer["dropped"] = dropped
    if warnings:
        answer["warnings"] = warnings
    return answer


def _dump(answer: Mapping[str, Any]) -> str:
    return json.dumps(answer, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _read_line(number: int, line: str) -> Any:
    """The JSON value on ``line``, or PveQueryError saying why there is none (one sentence)."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, kept as lone surrogates
        raise PveQueryError(f"line {number} is not UTF-8 text") from None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        reason = exc.msg
    except RecursionError:
        reason = "it is nested too deeply"
    except ValueError:  # an integer longer than Python converts
        reason = f"a number has more than {sys.get_int_max_str_digits()} digits"
    raise PveQueryError(f"line {number} is not valid JSON: {reason}")


def answer_line(number: int, line: str) -> str:
    """The answer to input line ``number`` (without its newline): never raises.

    An error in the query is ``{"error": "line N: …"}`` naming the field; an error opendrs
    cannot explain by the query (a bug) is ``{"error": "line N: internal error …"}`` — the
    stream goes on either way.
    """
    try:
        query = _read_line(number, line)
    except PveQueryError as exc:
        return _dump({"error": f"{exc}."})
    try:
        if not isinstance(query, dict):
            raise PveQueryError("the query line must be a JSON object")
        return _dump(decide(query))
    except PveQueryError as exc:
        return _dump({"error": f"line {number}: {exc}."})
    except Exception as exc:  # the stream must go on; say it is not the query's fault
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        return _dump(
            {"error": f"line {number}: internal error (a bug in opendrs): {detail}."},
        )


def serve(stdin: TextIO, stdout: TextIO) -> int:
    """JSON-Lines service: one query per input line, one answer per output line.

    Blank lines are skipped; a malformed line — not UTF-8 (when ``stdin`` decodes with
    ``surrogateescape``), not JSON, an integer Python will not convert, an unknown key, a
    number out of range — yields ``{"error": "..."}`` and the stream goes on. Output is
    deterministic (sorted keys, compact separators) and flushed after every answer. Returns 0.
    """
    for number, line in enumerate(stdin, start=1):
        if not line.strip():
            continue
        stdout.write(answer_line(number, line) + "\n")
        stdout.flush()
    return 0
