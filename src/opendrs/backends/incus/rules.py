"""The cluster's placement rules as :class:`~opendrs.model.rules.Rules`: Incus's own (cluster
groups, projects restricted to groups, pinned CPU sets, members that take no automatic
placement) and opendrs's instance keys ``user.opendrs.*``.

Incus's rules, always read:

* an instance created for a cluster group (``volatile.cluster.group``) stays on that group's
  members; an instance of a project with ``restricted: true`` and ``restricted.cluster.groups``
  stays on the members of those groups (both strict node rules);
* an instance whose ``limits.cpu`` pins CPUs (``0-3,5``) can only run on members that have them;
* a member whose ``scheduler.instance`` is ``manual`` takes part in no automatic placement, as
  Incus's own balancer treats it: its instances are not moved (ignored) and it receives none.

opendrs's keys (``user_keys: true``), in the spirit of ProxLB's tags on Proxmox, on an instance:

* ``user.opendrs.ignore: true`` — never moved (it still loads its member);
* ``user.opendrs.pin: m1,m2`` — only on these members (strict);
* ``user.opendrs.prefer: m1,m2`` — on these members when they can take it (not strict);
* ``user.opendrs.affinity: NAME`` — kept together with the other instances naming ``NAME``;
* ``user.opendrs.anti_affinity: NAME`` — kept apart from them (several names, comma-separated);
* ``user.opendrs.priority: 1|2|3`` — the instance's weight, as ProxLB's priority.

A member named in a key that the cluster does not have is skipped with a warning. Incus's rules
are the platform's, the keys are tags (:data:`~opendrs.model.rules.ORIGINS`): a key that
contradicts one of Incus's rules is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opendrs.backends.incus.assemble import guest_id
from opendrs.backends.incus.values import cpu_limit, flag
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

#: The key prefix of opendrs's instance keys.
PREFIX = "user.opendrs."


def read_rules(
    instances: Sequence[Mapping[str, Any]],
    members: Sequence[Mapping[str, Any]],
    threads: Mapping[str, float],
    projects: Mapping[str, Mapping[str, Any]],
    user_keys: bool,
    warn: Callable[[str], None],
) -> Rules:
    """The rules among ``instances`` (rows of ``/1.0/instances``) and ``members``.

    ``threads`` is each member's CPU threads; ``projects`` each project's config.
    """
    names = {str(m["server_name"]) for m in members}
    groups: dict[str, set[str]] = {}
    for member in members:
        for group in member.get("groups") or ():
            groups.setdefault(str(group), set()).add(str(member["server_name"]))
    manual = {
        str(m["server_name"]) for m in members if _config(m).get("scheduler.instance") == "manual"
    }
    node_rules: list[NodeAffinity] = []
    together: dict[str, list[str]] = {}
    apart: dict[str, list[str]] = {}
    ignored: set[str] = set()
    automatic: list[str] = []
    for row in instances:
        project = str(row.get("project") or "default")
        gid = guest_id(project, str(row["name"]))
        config = _config(row, "expanded_config")
        if row.get("location") in manual:
            ignored.add(gid)
        else:
            automatic.append(gid)
        node_rules += _incus_rules(gid, row, config, groups, threads, projects, warn)
        if user_keys:
            node_rules += _key_rules(gid, config, names, warn)
            if flag(config.get(PREFIX + "ignore", "")):
                ignored.add(gid)
            for key, table in (("affinity", together), ("anti_affinity", apart)):
                for name in _names(config.get(PREFIX + key)):
                    # A group's name is the project's own: an instance of another project
                    # naming it joins another group (one project never binds another's).
                    table.setdefault(guest_id(project, name), []).append(gid)
    if manual and automatic:
        usable = {n: 0 for n in sorted(names - manual)}
        node_rules.append(
            NodeAffinity(
                "scheduler.instance=manual", tuple(automatic), usable, True, origin="platform"
            )
        )
    guest_rules = [
        GuestAffinity(f"{PREFIX}{key} {name}", tuple(members_), positive, hard=True, origin="tag")
        for key, table, positive in (("affinity", together, True), ("anti_affinity", apart, False))
        for name, members_ in sorted(table.items())
        if len(members_) >= 2
    ]
    return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored))


def _incus_rules(
    gid: str,
    row: Mapping[str, Any],
    config: Mapping[str, str],
    groups: Mapping[str, set[str]],
    threads: Mapping[str, float],
    projects: Mapping[str, Mapping[str, Any]],
    warn: Callable[[str], None],
) -> list[NodeAffinity]:
    """An instance's cluster group, its project's groups and its pinned CPUs, as strict rules."""
    rules: list[NodeAffinity] = []
    group = config.get("volatile.cluster.group")
    if group:
        allowed = groups.get(group)
        if allowed:
            rules.append(
                NodeAffinity(
                    f"cluster group {group}",
                    (gid,),
                    dict.fromkeys(allowed, 0),
                    True,
                    origin="platform",
                )
            )
        else:
            warn(f"instance {gid}: cluster group {group} has no members: its rule is skipped")
    project = projects.get(str(row.get("project") or "default"), {})
    if flag(project.get("restricted", "")) and project.get("restricted.cluster.groups"):
        allowed_groups = _names(project["restricted.cluster.groups"])
        allowed = {m for g in allowed_groups for m in groups.get(g, ())}
        if allowed:
            rules.append(
                NodeAffinity(
                    f"project {row.get('project')} groups",
                    (gid,),
                    dict.fromkeys(sorted(allowed), 0),
                    True,
                    origin="platform",
                )
            )
    _, pinned = cpu_limit(config.get("limits.cpu"))
    if pinned:
        able = {m for m, count in threads.items() if count > max(pinned)}
        if able and len(able) < len(threads):
            rules.append(
                NodeAffinity(
                    f"limits.cpu {gid}",
                    (gid,),
                    dict.fromkeys(sorted(able), 0),
                    True,
                    origin="platform",
                )
            )
    return rules


def _key_rules(
    gid: str, config: Mapping[str, str], names: set[str], warn: Callable[[str], None]
) -> list[NodeAffinity]:
    """``user.opendrs.pin`` and ``user.opendrs.prefer`` of one instance."""
    rules: list[NodeAffinity] = []
    for key, strict in (("pin", True), ("prefer", False)):
        wanted = _names(config.get(PREFIX + key))
        known = [n for n in wanted if n in names]
        for name in wanted:
            if name not in names:
                warn(f"instance {gid}: {PREFIX}{key} names no member of the cluster: {name}")
        if known:
            rules.append(
                NodeAffinity(
                    f"{PREFIX}{key} {gid}", (gid,), dict.fromkeys(known, 0), strict, origin="tag"
                )
            )
    return rules


def _names(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def _config(row: Mapping[str, Any], key: str = "config") -> Mapping[str, str]:
    value = row.get(key)
    return value if isinstance(value, dict) else {}
