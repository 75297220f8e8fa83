"""Reading a snapshot's rules: node affinities and pins, guest affinities, ignored guests."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from opendrs.model.cluster import Node
from opendrs.model.document import MAX_ID, Path, describe
from opendrs.model.rules import ORIGINS, GuestAffinity, NodeAffinity, Origin, Rules, avoiding
from opendrs.model.snapshot.read_nodes import NodeReader
from opendrs.model.snapshot.schema import RULE_KEYS, RULE_TYPES, generated_name

# The logger of the snapshot format as a whole (``opendrs.model.snapshot``).
log = logging.getLogger(__package__)


class RuleReader(NodeReader):
    """Reads the rules of a snapshot, checking the nodes and guests they name."""

    def rules(
        self, value: object, nodes: Mapping[str, Node], guest_ids: set[str] | frozenset[str]
    ) -> Rules:
        node_rules: list[NodeAffinity] = []
        guest_rules: list[GuestAffinity] = []
        ignored: set[str] = set()
        reasons: dict[str, str] = {}
        names: dict[str, int] = {}
        counters = dict.fromkeys(RULE_TYPES, 0)
        for index, item in enumerate(self.sequence(value, ("rules",))):
            path: Path = ("rules", index)
            rule = self.mapping(item, path)
            kind = self.choice(self.require(rule, "type", path), (*path, "type"), RULE_TYPES)
            self.check_keys(rule, path, RULE_KEYS[kind])
            counters[kind] += 1
            minimum = 2 if kind in ("affinity", "anti-affinity") else 1
            guests = self.rule_guests(self.require(rule, "guests", path), path, guest_ids, minimum)
            if kind == "ignore":
                ignored.update(guests)
                if "reason" in rule:
                    reason = self.text(rule["reason"], (*path, "reason"))
                    reasons.update(dict.fromkeys(guests, reason))
                continue
            name = self.rule_name(rule, index, kind, counters[kind], guests, names)
            origin: Origin = (
                self.choice(rule["origin"], (*path, "origin"), ORIGINS)  # type: ignore[assignment]
                if "origin" in rule
                else "config"
            )
            if kind in ("node-affinity", "pin"):
                kept = self.node_rule(rule, index, kind, name, guests, origin, nodes)
                if kept is not None:
                    node_rules.append(kept)
            else:
                hard = self.boolean(rule["hard"], (*path, "hard")) if "hard" in rule else True
                guest_rules.append(GuestAffinity(name, guests, kind == "affinity", hard, origin))
        return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored), reasons)

    def node_rule(
        self,
        rule: Mapping[Any, Any],
        index: int,
        kind: str,
        name: str,
        guests: tuple[str, ...],
        origin: Origin,
        nodes: Mapping[str, Node],
    ) -> NodeAffinity | None:
        """A ``node-affinity`` or ``pin`` rule (its type, name, guests and origin read), or None
        for a negative affinity naming every node, which is not used."""
        path: Path = ("rules", index)
        negative = "affinity" in rule and (
            self.choice(rule["affinity"], (*path, "affinity"), ("positive", "negative"))
            == "negative"
        )
        # "Avoid these nodes" names nodes, not priorities (Proxmox refuses them).
        priorities = self.rule_nodes(
            self.require(rule, "nodes", path), path, nodes, "avoid" if negative else kind
        )
        # A pin is strict by definition; a node affinity is strict only when asked.
        strict = kind == "pin" or (
            "strict" in rule and self.boolean(rule["strict"], (*path, "strict"))
        )
        if not negative:
            return NodeAffinity(name, guests, priorities, strict, origin)
        kept = avoiding(name, guests, set(priorities), list(nodes), strict, origin)
        if kept is None:
            log.warning(
                "%s: rules[%d] (%s): a negative node affinity naming every node leaves "
                "its guests none; the rule is not used, as Proxmox drops it",
                self.filename,
                index,
                name,
            )
        return kept

    def rule_name(
        self,
        rule: Mapping[Any, Any],
        index: int,
        kind: str,
        count: int,
        guests: tuple[str, ...],
        names: dict[str, int],
    ) -> str:
        path: Path = ("rules", index)
        given = rule.get("name")
        if given is not None:
            name = self.text(given, (*path, "name"), allow_int=True)
            where: Path = (*path, "name")
        else:
            name = generated_name(kind, count, guests)
            where = path
        if name in names:
            generated = "" if given is not None else "generated "
            self.fail(
                where,
                f"duplicate rule name: {generated}{describe(name)} is also the name of "
                f"rules[{names[name]}]" + ("" if given is not None else "; give this rule a name"),
            )
        names[name] = index
        return name

    def rule_guests(
        self, value: object, path: Path, guest_ids: set[str] | frozenset[str], minimum: int
    ) -> tuple[str, ...]:
        gpath = (*path, "guests")
        items = self.sequence(value, gpath)
        if len(items) < minimum:
            need = "at least two guests" if minimum == 2 else "at least one guest"
            self.fail(gpath, f"the rule needs {need}, got {len(items)}")
        out: list[str] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            ipath = (*gpath, index)
            guest_id = self.text(item, ipath, allow_int=True)
            if guest_id not in guest_ids:
                self.fail(ipath, f"unknown guest {describe(guest_id)}")
            if guest_id in seen:
                self.fail(ipath, f"guest {describe(guest_id)} is listed twice")
            seen.add(guest_id)
            out.append(guest_id)
        return tuple(out)

    def rule_nodes(
        self, value: object, path: Path, nodes: Mapping[str, Node], kind: str
    ) -> dict[str, int]:
        npath = (*path, "nodes")
        priorities: dict[str, int] = {}
        if isinstance(value, Mapping) and kind == "node-affinity":
            for name, priority, ppath in self.name_map(value, npath, "node"):
                self.node_ref(name, ppath, nodes)
                priorities[name] = self.integer(priority, ppath, minimum=0, maximum=MAX_ID)
        else:
            if isinstance(value, Mapping):
                what = "a pin" if kind == "pin" else "a negative node affinity"
                self.fail(npath, f"expected a list of node names ({what} has no priorities)")
            items = self.sequence(value, npath)
            for index, item in enumerate(items):
                name = self.node_ref(item, (*npath, index), nodes)
                if name in priorities:
                    self.fail((*npath, index), f"node {describe(name)} is listed twice")
                priorities[name] = 0
        if not priorities:
            self.fail(npath, "the rule needs at least one node")
        return priorities
