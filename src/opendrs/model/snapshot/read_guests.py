"""Reading a snapshot's guests: each guest, its disks and its node limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opendrs.model.cluster import GUEST_KINDS, GUEST_STATES, HA_STATES, Disk, Guest, Node, NodeLimit
from opendrs.model.document import Path, describe
from opendrs.model.snapshot.quick_guest import quick_guest
from opendrs.model.snapshot.read_nodes import NodeReader
from opendrs.model.snapshot.schema import GUEST_KEYS, MAX_CORES


class GuestReader(NodeReader):
    """Reads the guests of a snapshot, checking the nodes they name."""

    def guests(
        self, value: object, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> tuple[Guest, ...]:
        path: Path = ("guests",)
        if isinstance(value, Mapping):
            self.fail(path, "expected a list of guests (- id: 101 …), got a mapping")
        items = self.sequence(value, path)
        guests: list[Guest] = []
        first_at: dict[str, int] = {}
        for index, item in enumerate(items):
            guest = quick_guest(item, nodes, shared)
            if guest is None:  # another shape, or something to report: read in full
                guest = self.guest(item, ("guests", index), nodes, shared)
            if guest.id in first_at:
                self.fail(
                    ("guests", index, "id"),
                    f"duplicate guest id {describe(guest.id)} (also guests[{first_at[guest.id]}])",
                )
            first_at[guest.id] = index
            guests.append(guest)
        return tuple(guests)

    def guest(
        self, value: object, path: Path, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> Guest:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, GUEST_KEYS)
        has = mapping.__contains__

        def at(key: str) -> Path:
            return (*path, key)

        guest_id = self.plain_name(self.require(mapping, "id", path), at("id"), allow_int=True)
        fields: dict[str, Any] = {"id": guest_id}
        if has("name") and mapping["name"] is not None:
            fields["name"] = self.text(mapping["name"], at("name"), allow_int=True)
        if has("kind"):
            fields["kind"] = self.choice(mapping["kind"], at("kind"), GUEST_KINDS)
        node = self.node_ref(self.require(mapping, "node", path), at("node"), nodes)
        fields["node"] = node
        if has("state"):
            fields["state"] = self.choice(mapping["state"], at("state"), GUEST_STATES)
        if has("cpu"):
            fields["cpu"] = self.number(mapping["cpu"], at("cpu"), positive=True, maximum=MAX_CORES)
        # A stopped container without a memory limit has no size (Incus): 0 is its memory.
        sizeless = fields.get("kind") == "ct" and fields.get("state") == "stopped"
        fields["memory"] = self.size(
            self.require(mapping, "memory", path), at("memory"), positive=not sizeless, memory=True
        )
        if has("disks"):
            fields["disks"] = self.disks(mapping["disks"], at("disks"), shared)
        if has("usage"):
            cpu_used, memory_used = self.cpu_memory(mapping["usage"], at("usage"))
            fields["cpu_used"] = cpu_used
            fields["memory_used"] = memory_used
        if has("pressure"):
            fields["pressure"] = self.pressure(mapping["pressure"], at("pressure"))
        if has("devices"):
            fields["devices"] = self.text_list(mapping["devices"], at("devices"))
        if has("uptime"):
            fields["uptime"] = self.duration(mapping["uptime"], at("uptime"))
        if has("lock"):
            fields["lock"] = self.optional_text(mapping["lock"], at("lock"))
        fields.update(self.guest_management(mapping, path))
        fields.update(self.guest_placement(mapping, path, nodes, node))
        return Guest(**fields)

    def guest_management(self, mapping: Mapping[Any, Any], path: Path) -> dict[str, Any]:
        """The fields of a guest that say how it is managed: HA, failback, tags, priority."""
        has = mapping.__contains__

        def at(key: str) -> Path:
            return (*path, key)

        fields: dict[str, Any] = {}
        ha = self.boolean(mapping["ha"], at("ha")) if has("ha") else False
        fields["ha"] = ha
        if has("ha_state") and mapping["ha_state"] is not None:
            if not ha:
                self.fail(at("ha_state"), "only HA-managed guests have an HA state (set ha: true)")
            fields["ha_state"] = self.choice(mapping["ha_state"], at("ha_state"), HA_STATES)
        if has("failback"):
            if not ha:
                self.fail(at("failback"), "only HA-managed guests have failback (set ha: true)")
            fields["failback"] = self.boolean(mapping["failback"], at("failback"))
        if has("tags"):
            fields["tags"] = self.text_list(mapping["tags"], at("tags"))
        if has("priority"):
            fields["priority"] = self.integer(
                mapping["priority"], at("priority"), minimum=1, maximum=3
            )
        return fields

    def guest_placement(
        self, mapping: Mapping[Any, Any], path: Path, nodes: Mapping[str, Node], node: str
    ) -> dict[str, Any]:
        """The fields of a guest that say where it may go: its migration, arch and node limits."""
        has = mapping.__contains__

        def at(key: str) -> Path:
            return (*path, key)

        fields: dict[str, Any] = {}
        if has("migrating_to") and mapping["migrating_to"] is not None:
            target = self.node_ref(mapping["migrating_to"], at("migrating_to"), nodes)
            if target == node:
                self.fail(at("migrating_to"), f"the guest is already on {describe(node)}")
            fields["migrating_to"] = target
        if has("arch"):
            fields["arch"] = self.optional_text(mapping["arch"], at("arch"))
        if has("limits"):
            fields["limits"] = self.node_limits(mapping["limits"], at("limits"), nodes, node)
        return fields

    def node_limits(
        self, value: object, path: Path, nodes: Mapping[str, Node], node: str
    ) -> tuple[NodeLimit, ...]:
        """A guest's ``limits``: ``[{nodes: [...], reason: TEXT}]`` (its own node is added)."""
        limits: list[NodeLimit] = []
        for index, item in enumerate(self.sequence(value, path)):
            lpath = (*path, index)
            limit = self.mapping(item, lpath)
            self.check_keys(limit, lpath, ("nodes", "reason"))
            names = self.sequence(self.require(limit, "nodes", lpath), (*lpath, "nodes"))
            allowed = {self.node_ref(n, (*lpath, "nodes", i), nodes) for i, n in enumerate(names)}
            reason = self.text(self.require(limit, "reason", lpath), (*lpath, "reason"))
            limits.append(NodeLimit(frozenset(allowed | {node}), reason))
        return tuple(limits)

    def disks(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Disk, ...]:
        disks: list[Disk] = []
        for index, item in enumerate(self.sequence(value, path)):
            dpath = (*path, index)
            disk = self.mapping(item, dpath)
            self.check_keys(disk, dpath, ("pool", "size"))
            pool = self.text(self.require(disk, "pool", dpath), (*dpath, "pool"), allow_int=True)
            size = self.size(self.require(disk, "size", dpath), (*dpath, "size"))
            disks.append(Disk(pool, size, pool in shared))
        return tuple(disks)
