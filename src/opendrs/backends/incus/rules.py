"""The cluster's placement rules as :class:`~opendrs.model.rules.Rules`: Incus's own (cluster
groups, projects restricted to groups, pinned CPU sets, members that take no automatic
placement) and opendrs's instance keys ``user.opendrs.*``.

Incus's rules, always read:

* an instance created for a cluster group (``volatile.cluster.group``) stays on that group's
  members; an instance of a project with ``restricted: true`` and ``restricted.cluster.groups``
  stays on the members of those groups (both strict node rules);
* an instance whose ``limits.cpu`` pins CPUs (``0-3,5``) can only run on members that have them;
* a member whose ``scheduler.instance`` is ``manual`` takes part in no automatic placement, as
  Incus's own placement and balancer treat it (``GetCandidateMembers`` in
  ``internal/server/db/node.go``): its instances are not moved (ignored) and it receives none;
* a member whose ``scheduler.instance`` is ``group`` receives only the instances that target one
  of its cluster groups (``volatile.cluster.group``); an instance already on it may stay.

Each instance gets one strict rule of Incus's at most: what each of Incus's rules allow,
intersected, named after all of them (``scheduler.instance: m3 group; cluster group web``), so a
refused member names the setting that refuses it; instances with the same rule share it. A guest
in two node rules of one origin loses both in the engine, so Incus's are merged here; a key's
node rule stays apart, and when the instance has one of Incus's too, the key is ignored with a
warning (a tag never weakens the platform's rule).

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opendrs.backends.incus.assemble import guest_id
from opendrs.backends.incus.values import cpu_limit, flag
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules

#: The key prefix of opendrs's instance keys.
PREFIX = "user.opendrs."


@dataclass
class Restrictions:
    """The rules read, before Incus's strict ones are merged: each instance's strict pieces of
    Incus's own rules (a name and the members it allows), the node rules of opendrs's keys
    (tags: kept apart, so that the engine ignores one that contradicts Incus's rules), the guest
    rules, the ignored instances."""

    members: frozenset[str]
    strict: dict[str, list[tuple[str, frozenset[str]]]] = field(default_factory=dict)
    keyed: list[NodeAffinity] = field(default_factory=list)
    guest_rules: list[GuestAffinity] = field(default_factory=list)
    ignored: set[str] = field(default_factory=set)
    warn: Callable[[str], None] = lambda _message: None

    def add(self, gid: str, name: str, allowed: Iterable[str]) -> None:
        """A strict rule for ``gid``: only ``allowed``."""
        self.strict.setdefault(gid, []).append((name, frozenset(allowed)))

    def allowed(self, gid: str) -> frozenset[str]:
        """The members every strict rule of ``gid`` allows."""
        allowed = self.members
        for _name, nodes in self.strict.get(gid, ()):
            allowed &= nodes
        return allowed

    def rules(self) -> Rules:
        """The rules, with one strict rule per instance (shared by instances with the same).
        An instance whose rules allow no member together is not moved (ignored, with a
        warning)."""
        shared: dict[tuple[str, frozenset[str]], list[str]] = {}
        for gid, pieces in self.strict.items():
            name = "; ".join(dict.fromkeys(name for name, _ in pieces))
            allowed = self.allowed(gid)
            if allowed:
                shared.setdefault((name, allowed), []).append(gid)
            else:
                self.warn(f"instance {gid}: its rules ({name}) allow no member: it is not moved")
                self.ignored.add(gid)
        node_rules: list[NodeAffinity] = []
        seen: dict[str, int] = {}
        for (name, allowed), guests in sorted(
            shared.items(), key=lambda i: (i[0][0], sorted(i[0][1]))
        ):
            seen[name] = seen.get(name, 0) + 1
            unique = name if seen[name] == 1 else f"{name} #{seen[name]}"
            nodes = dict.fromkeys(sorted(allowed), 0)
            node_rules.append(NodeAffinity(unique, tuple(guests), nodes, True, origin="platform"))
        return Rules(
            tuple(node_rules + self.keyed), tuple(self.guest_rules), frozenset(self.ignored)
        )


def read_rules(
    instances: Sequence[Mapping[str, Any]],
    members: Sequence[Mapping[str, Any]],
    threads: Mapping[str, float],
    projects: Mapping[str, Mapping[str, Any]],
    user_keys: bool,
    warn: Callable[[str], None],
) -> Restrictions:
    """The rules among ``instances`` (rows of ``/1.0/instances``) and ``members``.

    ``threads`` is each member's CPU threads; ``projects`` each project's config.
    """
    names = frozenset(str(m["server_name"]) for m in members)
    groups: dict[str, set[str]] = {}
    for member in members:
        for group in member.get("groups") or ():
            groups.setdefault(str(group), set()).add(str(member["server_name"]))
    scheduler = {
        str(m["server_name"]): str(_config(m).get("scheduler.instance"))
        for m in members
        if _config(m).get("scheduler.instance") in ("manual", "group")
    }
    member_groups = {str(m["server_name"]): set(map(str, m.get("groups") or ())) for m in members}
    read = Restrictions(names, warn=warn)
    together: dict[str, list[str]] = {}
    apart: dict[str, list[str]] = {}
    for row in instances:
        project = str(row.get("project") or "default")
        gid = guest_id(project, str(row["name"]))
        config = _config(row, "expanded_config")
        location = str(row.get("location"))
        if scheduler.get(location) == "manual":
            read.ignored.add(gid)
        else:
            _scheduler_rule(read, gid, location, config, scheduler, member_groups)
        for name, allowed in _incus_rules(gid, row, config, groups, threads, projects, warn):
            read.add(gid, name, allowed)
        if user_keys:
            _key_rules(read, gid, config, names, warn)
            if flag(config.get(PREFIX + "ignore", "")):
                read.ignored.add(gid)
            for key, table in (("affinity", together), ("anti_affinity", apart)):
                for name in _names(config.get(PREFIX + key)):
                    # A group's name is the project's own: an instance of another project
                    # naming it joins another group (one project never binds another's).
                    table.setdefault(guest_id(project, name), []).append(gid)
    read.guest_rules = [
        GuestAffinity(f"{PREFIX}{key} {name}", tuple(members_), positive, hard=True, origin="tag")
        for key, table, positive in (("affinity", together, True), ("anti_affinity", apart, False))
        for name, members_ in sorted(table.items())
        if len(members_) >= 2
    ]
    return read


def _scheduler_rule(
    read: Restrictions,
    gid: str,
    location: str,
    config: Mapping[str, str],
    scheduler: Mapping[str, str],
    member_groups: Mapping[str, set[str]],
) -> None:
    """The members ``scheduler.instance`` keeps ``gid`` off: ``manual`` ones, and ``group`` ones
    whose groups it does not target. Where it is stays allowed (Incus moves nothing back)."""
    target = config.get("volatile.cluster.group")
    refusing = {
        member: setting
        for member, setting in scheduler.items()
        if member != location and (setting == "manual" or target not in member_groups[member])
    }
    if refusing:
        named = ", ".join(f"{m} {setting}" for m, setting in sorted(refusing.items()))
        read.add(gid, f"scheduler.instance: {named}", read.members - refusing.keys())


def _incus_rules(
    gid: str,
    row: Mapping[str, Any],
    config: Mapping[str, str],
    groups: Mapping[str, set[str]],
    threads: Mapping[str, float],
    projects: Mapping[str, Mapping[str, Any]],
    warn: Callable[[str], None],
) -> list[tuple[str, frozenset[str]]]:
    """An instance's cluster group, its project's groups and its pinned CPUs, as strict rules
    (their names and the members they allow)."""
    rules: list[tuple[str, frozenset[str]]] = []
    group = config.get("volatile.cluster.group")
    if group:
        allowed = groups.get(group)
        if allowed:
            rules.append((f"cluster group {group}", frozenset(allowed)))
        else:
            warn(f"instance {gid}: cluster group {group} has no members: its rule is skipped")
    project = projects.get(str(row.get("project") or "default"), {})
    if flag(project.get("restricted", "")) and project.get("restricted.cluster.groups"):
        allowed_groups = _names(project["restricted.cluster.groups"])
        allowed = {m for g in allowed_groups for m in groups.get(g, ())}
        if allowed:
            rules.append((f"project {row.get('project')} groups", frozenset(allowed)))
    _, pinned = cpu_limit(config.get("limits.cpu"))
    if pinned:
        able = {m for m, count in threads.items() if count > max(pinned)}
        if able and len(able) < len(threads):
            rules.append((f"limits.cpu {gid}", frozenset(able)))
    return rules


def _key_rules(
    read: Restrictions,
    gid: str,
    config: Mapping[str, str],
    names: frozenset[str],
    warn: Callable[[str], None],
) -> None:
    """``user.opendrs.pin`` (strict) and ``user.opendrs.prefer`` of one instance, as tags."""
    for key, strict in (("pin", True), ("prefer", False)):
        wanted = _names(config.get(PREFIX + key))
        known = [n for n in wanted if n in names]
        for name in wanted:
            if name not in names:
                warn(f"instance {gid}: {PREFIX}{key} names no member of the cluster: {name}")
        if known:
            read.keyed.append(
                NodeAffinity(
                    f"{PREFIX}{key} {gid}", (gid,), dict.fromkeys(known, 0), strict, origin="tag"
                )
            )


def _names(value: object) -> list[str]:
    if not isinstance(value, str):
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def _config(row: Mapping[str, Any], key: str = "config") -> Mapping[str, str]:
    value = row.get(key)
    return value if isinstance(value, dict) else {}
