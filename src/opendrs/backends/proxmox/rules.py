"""The cluster's placement rules as :class:`~opendrs.model.rules.Rules`: Proxmox HA rules (or,
before Proxmox VE 9, HA groups) and ProxLB's tags.

``GET /cluster/ha/rules`` (``/cluster/ha/groups`` before Proxmox VE 9) unless ``ha_rules: false``
gives node affinity and resource affinity, parsed by :mod:`opendrs.compat.pve` and dropped where
Proxmox drops them; a negative node affinity ("avoid these nodes", Proxmox VE 9.2) is the positive
one on the other nodes, as Proxmox reads it. ProxLB's tags keep working (``tags: true``):
``plb_affinity_*`` and ``plb_anti_affinity_*`` shared by two or more guests are hard rules, a
guest's ``plb_pin_<node>`` tags pin it to those nodes, ``plb_ignore_*`` guests are never moved. A
resource pool the ``pools`` setting names keeps its members together or apart
(:mod:`.pools`). A guest whose HA resource is ``ignored`` is never moved either, nor (unless
``respect_auto_rebalance: false``) one whose HA resource has ``auto-rebalance: 0``. HA rules are
the platform's, pools' rules come after the configured ones, tags are tags
(:data:`~opendrs.model.rules.ORIGINS`): a tag that contradicts an HA rule is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opendrs.backends.proxmox.client import Client, HttpError
from opendrs.backends.proxmox.config import ProxmoxConfig
from opendrs.backends.proxmox.ha import HaView, sid_guest
from opendrs.backends.proxmox.pools import pool_rules
from opendrs.backends.proxmox.values import as_bool, as_list
from opendrs.compat import pve as pve_compat
from opendrs.model.cluster import Guest
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules


def read_rules(
    client: Client,
    config: ProxmoxConfig,
    guests: Sequence[Guest],
    nodes: set[str],
    ha: HaView,
    warn: Callable[[str], None],
) -> Rules:
    """The rules among ``guests`` and ``nodes``; ``warn`` is told about the rules dropped."""
    ids = {g.id for g in guests}
    node_rules: list[NodeAffinity] = []
    guest_rules: list[GuestAffinity] = []
    ignored: set[str] = set()
    if config.ha_rules:
        node_rules, guest_rules = _ha_rules(client, ids, nodes, ha, warn)
    guest_rules += pool_rules(client, config.pools, ids, warn)
    if config.tags:
        tag_nodes, tag_guests, ignored = _tag_rules(guests, nodes, warn)
        node_rules += tag_nodes
        guest_rules += tag_guests
    # An HA resource an operator set to ``ignored`` is theirs to handle: opendrs moves it
    # no more than the HA manager does.
    ignored |= {vmid for vmid, s in ha.services.items() if s.request == "ignored" and vmid in ids}
    reasons = _auto_rebalance_off(ha, ids) if config.respect_auto_rebalance else {}
    ignored |= reasons.keys()
    return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored), reasons)


def _auto_rebalance_off(ha: HaView, ids: set[str]) -> dict[str, str]:
    """The guests whose HA resource has ``auto-rebalance: 0`` (pve-manager 9.1.13: automatic
    rebalancing leaves it alone), with that reason."""
    return {
        vmid: "its HA resource has auto-rebalance 0"
        for vmid, service in ha.services.items()
        if not service.auto_rebalance and vmid in ids
    }


def _ha_rules(
    client: Client, ids: set[str], nodes: set[str], ha: HaView, warn: Callable[[str], None]
) -> tuple[list[NodeAffinity], list[GuestAffinity]]:
    """HA rules (Proxmox VE 9) or legacy HA groups, as Proxmox itself would keep them."""
    rules, warnings = _read_ha_rules(client, ha)
    errors = pve_compat.check_feasibility({r.ruleid: r for r in rules}, sorted(nodes))
    for ruleid in sorted(errors):
        for messages in errors[ruleid].values():
            for message in messages:
                warn(f"HA rule '{ruleid}' is not used, because {message}")
    for warning in warnings:
        warn(f"HA rules: {warning}")
    node_rules: list[NodeAffinity] = []
    guest_rules: list[GuestAffinity] = []
    for rule in rules:
        if rule.disabled or rule.ruleid in errors:
            continue
        members = tuple(
            sorted(
                {g for g in (sid_guest(s) for s in rule.resources) if g in ids},
                key=lambda g: int(g),
            )
        )
        if rule.type == "node-affinity":
            # "Avoid these nodes" is "keep to the others", as Proxmox transforms it.
            priorities = {
                n: p
                for n, p in pve_compat.inverted(rule, sorted(nodes)).nodes.items()
                if n in nodes
            }
            if not members:
                continue
            if not priorities:
                warn(f"HA rule '{rule.ruleid}' names no node of the cluster")
                continue
            node_rules.append(
                NodeAffinity(rule.ruleid, members, priorities, rule.strict, origin="platform")
            )
        elif len(members) >= 2:
            guest_rules.append(
                GuestAffinity(
                    rule.ruleid, members, rule.affinity == "positive", hard=True, origin="platform"
                )
            )
    return node_rules, guest_rules


def _read_ha_rules(client: Client, ha: HaView) -> tuple[list[pve_compat.Rule], list[str]]:
    """The HA rules as :mod:`opendrs.compat.pve` parses them, legacy HA groups turned into
    rules, and the parser's warnings."""
    try:
        raw = as_list(client.get("cluster/ha/rules"), "/cluster/ha/rules")
        legacy = False
    except HttpError as exc:
        if exc.status not in (400, 404, 501):
            raise
        raw, legacy = [], True
    text = "".join(
        _section(
            str(r.get("type")),
            str(r.get("rule")),
            {
                "resources": r.get("resources"),
                "nodes": r.get("nodes"),
                "strict": 1 if as_bool(r.get("strict")) else None,
                "affinity": r.get("affinity"),
                "disable": 1 if as_bool(r.get("disable")) else None,
            },
        )
        for r in raw
        if r.get("rule") and r.get("type")
    )
    rules, warnings = pve_compat.parse_rules(text)
    if legacy:
        group_rules, group_warnings = _group_rules(client, ha, first_order=len(rules) + 1)
        warnings += group_warnings
        rules += group_rules
    return rules, warnings


def _group_rules(
    client: Client, ha: HaView, *, first_order: int
) -> tuple[list[pve_compat.Rule], list[str]]:
    """The legacy HA groups (before Proxmox VE 9) as the rules Proxmox turns them into, and the
    parser's warnings."""
    groups_raw = as_list(client.get("cluster/ha/groups"), "/cluster/ha/groups")
    groups_text = "".join(
        _section(
            "group",
            str(g.get("group")),
            {
                "nodes": g.get("nodes"),
                "restricted": 1 if as_bool(g.get("restricted")) else 0,
                "nofailback": 1 if as_bool(g.get("nofailback")) else 0,
            },
        )
        for g in groups_raw
        if g.get("group")
    )
    groups, warnings = pve_compat.parse_groups(groups_text)
    services = {
        s.sid: pve_compat.Service(sid=s.sid, node=s.node or "", group=s.group)
        for s in ha.services.values()
    }
    return pve_compat.groups_to_rules(groups, services, first_order=first_order), warnings


def _section(kind: str, name: str, props: Mapping[str, Any]) -> str:
    """One section of a Proxmox section-config file, for :mod:`opendrs.compat.pve` to parse."""
    lines = [f"{kind}: {name}"]
    for key, value in props.items():
        if value is None or value == "":
            continue
        text = " ".join(str(value).split())
        if text:
            lines.append(f"\t{key} {text}")
    return "\n".join(lines) + "\n\n"


def _tag_rules(
    guests: Sequence[Guest], nodes: set[str], warn: Callable[[str], None]
) -> tuple[list[NodeAffinity], list[GuestAffinity], set[str]]:
    """ProxLB's tags: ``plb_affinity*``, ``plb_anti_affinity*``, ``plb_pin_<node>``,
    ``plb_ignore*``."""
    together: dict[str, list[str]] = {}
    apart: dict[str, list[str]] = {}
    pins: dict[str, set[str]] = {}
    ignored: set[str] = set()
    lowered = {n.lower(): n for n in nodes}
    for guest in guests:
        for tag in guest.tags:
            if tag.startswith("plb_anti_affinity"):
                apart.setdefault(tag, []).append(guest.id)
            elif tag.startswith("plb_affinity"):
                together.setdefault(tag, []).append(guest.id)
            elif tag.startswith("plb_ignore"):
                ignored.add(guest.id)
            elif tag.startswith("plb_pin_"):
                wanted = tag.removeprefix("plb_pin_")
                node = wanted if wanted in nodes else lowered.get(wanted.lower())
                if node is None:
                    warn(f"guest {guest.id}: tag {tag} names no node of the cluster: skipped")
                    continue
                pins.setdefault(guest.id, set()).add(node)
    guest_rules = [
        GuestAffinity(tag, tuple(members), positive, hard=True, origin="tag")
        for rules, positive in ((together, True), (apart, False))
        for tag, members in sorted(rules.items())
        if len(members) >= 2
    ]
    node_rules = [
        NodeAffinity(
            f"plb_pin {gid}", (gid,), dict.fromkeys(sorted(pinned), 0), strict=True, origin="tag"
        )
        for gid, pinned in sorted(pins.items(), key=lambda item: int(item[0]))
    ]
    return node_rules, guest_rules, ignored
