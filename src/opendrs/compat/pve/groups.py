"""Legacy HA groups (``PVE::HA::Groups``): ``groups.cfg`` and its migration to rules.

A group lists nodes with priorities, ``restricted`` (only those nodes) and ``nofailback``; Proxmox
now turns the groups its services use into node affinity rules (``migrate_groups_to_rules``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from .rules.base import Rule
from .section_config import parse_bool, parse_node_list, parse_sections
from .status import Service

__all__ = ["Group", "apply_groups", "groups_to_rules", "parse_groups"]


@dataclass(frozen=True)
class Group:
    """A legacy HA group (``groups.cfg``)."""

    name: str
    nodes: dict[str, int]
    restricted: bool = False
    nofailback: bool = False
    comment: str | None = None


def parse_groups(text: str | None) -> tuple[dict[str, Group], list[str]]:
    """Parse the legacy ``groups.cfg`` (``PVE::HA::Groups``).

    ``group: <name>`` sections with ``nodes n1:2,n2``, ``restricted 0|1``,
    ``nofailback 0|1`` and ``comment``.
    """
    if not text:
        return {}, []
    sections, warnings = parse_sections(text, "groups")
    groups: dict[str, Group] = {}
    for stype, name, props in sections:
        if stype != "group":
            warnings.append(f"groups: unknown section type '{stype}' for '{name}', skipped")
            continue
        if "nodes" not in props:
            warnings.append(f"group '{name}': missing value for required option 'nodes', skipped")
            continue
        nodes, bad = parse_node_list(props["nodes"])
        for item in bad:
            warnings.append(f"group '{name}': invalid node entry '{item}' ignored")
        groups[name] = Group(
            name=name,
            nodes=nodes,
            restricted=bool(parse_bool(props.get("restricted", "0"))),
            nofailback=bool(parse_bool(props.get("nofailback", "0"))),
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
