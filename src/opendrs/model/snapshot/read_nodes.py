"""Reading a snapshot's nodes: the storage catalogue, each node, references to nodes, reserves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opendrs.model.cluster import Node, Pressure, Settings
from opendrs.model.document import Path, Reader, closest, describe
from opendrs.model.snapshot.schema import MAX_CORES, MIN_NODE_CORES, NODE_KEYS, PRESSURE_KEYS
from opendrs.model.snapshot.write import number_out, size_out


class NodeReader(Reader):
    """Reads the nodes of a snapshot, and the mappings nodes and guests share (pressure, cpu and
    memory); the base of the guest and rule readers, which refer to nodes by name."""

    def pressure(self, value: object, path: Path) -> Pressure:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, PRESSURE_KEYS)
        fields = {
            key: self.number(mapping[key], (*path, key), maximum=100.0)
            for key in PRESSURE_KEYS
            if key in mapping
        }
        return Pressure(**fields)

    def cpu_memory(
        self, value: object, path: Path, *, configured: bool = False
    ) -> tuple[float | None, int | None]:
        """A ``{cpu: cores, memory: size}`` mapping, either key optional; ``configured``: sizes
        someone wrote (a reserve), not measured, so a bare memory under 1 MiB is refused."""
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, ("cpu", "memory"))
        cpu = mapping.get("cpu")
        memory = mapping.get("memory")
        return (
            None if cpu is None else self.number(cpu, (*path, "cpu"), maximum=MAX_CORES),
            None if memory is None else self.size(memory, (*path, "memory"), memory=configured),
        )

    def storage(self, value: object, path: Path) -> frozenset[str]:
        """The catalogue of pools: the names of the shared ones."""
        if value is None:
            return frozenset()
        shared: set[str] = set()
        for name, item, ppath in self.name_map(value, path, "pool"):
            pool = {} if item is None else self.mapping(item, ppath)
            self.check_keys(pool, ppath, ("shared",))
            if "shared" in pool and self.boolean(pool["shared"], (*ppath, "shared")):
                shared.add(name)
        return frozenset(shared)

    def nodes(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Node, ...]:
        if isinstance(value, list):
            self.fail(path, "expected a mapping of node name to node (pve1: {cpu: …}), got a list")
        entries = self.name_map(value, path, "node name")
        if not entries:
            self.fail(path, "a snapshot needs at least one node")
        return tuple(self.node(name, item, npath, shared) for name, item, npath in entries)

    def node(self, name: str, value: object, path: Path, shared: frozenset[str]) -> Node:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, NODE_KEYS)
        fields: dict[str, Any] = {
            "name": name,
            "cpu": self.number(
                self.require(mapping, "cpu", path), (*path, "cpu"), positive=True, maximum=MAX_CORES
            ),
            "memory": self.size(
                self.require(mapping, "memory", path), (*path, "memory"), positive=True, memory=True
            ),
        }
        if fields["cpu"] < MIN_NODE_CORES:
            self.fail(
                (*path, "cpu"),
                f"must be at least {MIN_NODE_CORES:g} cores, got {describe(mapping['cpu'])}",
            )
        if "arch" in mapping:
            fields["arch"] = self.text(mapping["arch"], (*path, "arch"))
        for key in ("online", "maintenance"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "tags" in mapping:
            fields["tags"] = self.text_list(mapping["tags"], (*path, "tags"))
        if "storage" in mapping:
            capacity: dict[str, int] = {}
            for pool, size, spath in self.name_map(mapping["storage"], (*path, "storage"), "pool"):
                if pool in shared:
                    self.fail(spath, f"pool {describe(pool)} is shared; list only local pools here")
                capacity[pool] = self.size(size, spath)
            fields["storage"] = capacity
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"), configured=True)
            fields["reserve_cpu"] = cpu
            fields["reserve_memory"] = memory
        if "usage" in mapping:
            cpu, memory = self.cpu_memory(mapping["usage"], (*path, "usage"))
            fields["base_cpu"] = 0.0 if cpu is None else cpu
            fields["base_memory"] = 0 if memory is None else memory
        if "pressure" in mapping:
            fields["pressure"] = self.pressure(mapping["pressure"], (*path, "pressure"))
        if "ksm" in mapping:
            fields["ksm_shared"] = self.size(mapping["ksm"], (*path, "ksm"))
        return Node(**fields)

    def node_ref(self, value: object, path: Path, nodes: Mapping[str, Node]) -> str:
        name = self.text(value, path, allow_int=True)
        if name not in nodes:
            self.fail(path, f"unknown node {describe(name)}{_suggest(name, nodes)}")
        return name

    def check_reserves(self, nodes: tuple[Node, ...], settings: Settings) -> None:
        """Every node's reserve leaves it some capacity: less than its cores and its memory.

        A reserve that takes a whole node would leave a capacity of 0, and every load on it a
        fraction without a value; it is refused at the node's own ``reserve`` or, when the node
        takes the cluster default, at ``settings.reserve``.
        """
        for node in nodes:
            for key, own, capacity, default in (
                ("cpu", node.reserve_cpu, node.cpu, settings.reserve_cpu),
                ("memory", node.reserve_memory, node.memory, settings.reserve_memory),
            ):
                reserve = default if own is None else own
                if reserve < capacity:
                    continue
                where: Path = ("settings", "reserve", key)
                if own is not None:
                    where = ("nodes", node.name, "reserve", key)
                if key == "cpu":
                    has, kept = f"{number_out(capacity)} cores", f"{number_out(reserve)}"
                else:
                    has, kept = str(size_out(int(capacity))), str(size_out(int(reserve)))
                self.fail(
                    where,
                    f"must be less than the node's {key} (node {describe(node.name)} has {has}), "
                    f"got {kept}",
                )


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    if len(known) > 1000:
        return ""
    close = closest(name, list(known))
    return f" (did you mean '{close}'?)" if close is not None else ""
