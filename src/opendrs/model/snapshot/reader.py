"""Reading a snapshot: the whole document — its version, name, settings, nodes, guests and rules —
checked field by field into a :class:`~opendrs.model.cluster.Cluster`; and the built-in demo."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Final, cast

from opendrs.model.cluster import (
    BALANCE_SOURCES,
    HA_SCHEDULERS,
    USAGE_MODES,
    Cluster,
    HaScheduler,
    Settings,
)
from opendrs.model.document import (
    DocumentError,
    Path,
    collector_paused,
    describe,
    parse,
    read_file,
)
from opendrs.model.rules import Rules
from opendrs.model.snapshot.read_guests import GuestReader
from opendrs.model.snapshot.read_rules import RuleReader
from opendrs.model.snapshot.schema import (
    FORMAT_VERSION,
    MAX_MIN_UPTIME,
    MAX_RATIO,
    MIGRATION_KEYS,
    MIN_COST_UNIT,
    MIN_OVERCOMMIT,
    PROXLB_KEYS,
    SETTINGS_KEYS,
    TOP_KEYS,
)

#: A snapshot that cannot be read: ``str()`` is one line, ``FILE: PATH: REASON``.
SnapshotError = DocumentError

_DEFAULT_NAME: Final = "cluster"


def load(path: str | os.PathLike[str]) -> Cluster:
    """Read a snapshot file (``.json``: JSON, anything else: YAML) into a :class:`Cluster`.

    The cluster's name is the document's ``name``, or else the file name without its suffix.
    Raises :class:`SnapshotError` — and nothing else — for any problem with the file.
    """
    filename, data = read_file(path)
    document = parse(data, filename=filename)
    del data  # the bytes are not kept while the cluster is built
    return from_dict(document, filename=filename)


def loads(text: str | bytes, *, filename: str = "<string>", fmt: str | None = None) -> Cluster:
    """Parse a snapshot from text (bytes are decoded as UTF-8).

    ``fmt`` is ``"yaml"`` or ``"json"``; by default it follows ``filename``'s suffix. ``filename``
    names the source in error messages and gives the default cluster name.
    """
    return from_dict(parse(text, filename=filename, fmt=fmt), filename=filename)


def from_dict(data: object, *, filename: str = "<dict>") -> Cluster:
    """Validate a parsed document (plain dicts, lists and scalars) and build the cluster.

    Raises :class:`SnapshotError` for the first problem found, and no other exception.
    """
    try:
        with collector_paused():
            return SnapshotReader(filename).cluster(data)
    except SnapshotError:
        raise
    except RecursionError:
        raise SnapshotError(filename, "", "the document is nested too deeply") from None
    except MemoryError:
        raise SnapshotError(filename, "", "the document is too large to load") from None
    except Exception as exc:  # last line of defence: bad input never escapes as another error
        raise SnapshotError(
            filename, "", f"internal error while reading the snapshot ({type(exc).__name__}: {exc})"
        ) from exc


def load_demo() -> Cluster:
    """The built-in demo cluster (``opendrs/data/demo.yaml``)."""
    from importlib import resources  # imported here: a snapshot file needs none of it

    resource = resources.files("opendrs") / "data" / "demo.yaml"
    return loads(resource.read_bytes(), filename="demo.yaml")


def _default_name(filename: str) -> str:
    """The file stem, or ``cluster`` for pseudo names such as ``<string>``."""
    if filename.startswith("<") and filename.endswith(">"):
        return _DEFAULT_NAME
    stem = PurePath(filename).stem
    return stem if stem and stem.isprintable() else _DEFAULT_NAME


class SnapshotReader(GuestReader, RuleReader):
    """Walks a snapshot document, checking it field by field and building model objects."""

    def cluster(self, data: object) -> Cluster:
        if data is None:
            self.fail((), "the snapshot is empty (it needs at least `version: 1` and `nodes`)")
        if not isinstance(data, Mapping):
            self.fail((), f"expected a mapping at the top level, got {describe(data)}")
        doc = self.mapping(data, ())
        if "version" in doc:
            self.version(doc["version"])
        hint = ""
        if PROXLB_KEYS.intersection(k for k in doc if isinstance(k, str)):
            hint = "; this looks like a proxlb-solver scenario, which is a different format"
        self.check_keys(doc, (), TOP_KEYS, hint)
        self.version(self.require(doc, "version", ()))
        name = doc.get("name")
        cluster_name = (
            _default_name(self.filename)
            if name is None
            else self.plain_name(name, ("name",), allow_int=True)
        )
        settings = self.settings(doc.get("settings"), ("settings",))
        shared = self.storage(doc.get("storage"), ("storage",))
        nodes = self.nodes(self.require(doc, "nodes", ()), ("nodes",), shared)
        self.check_reserves(nodes, settings)
        node_names = {node.name: node for node in nodes}
        guests_value = doc.get("guests")
        guests = () if guests_value is None else self.guests(guests_value, node_names, shared)
        rules_value = doc.get("rules")
        guest_ids = {guest.id for guest in guests}
        rules = Rules() if rules_value is None else self.rules(rules_value, node_names, guest_ids)
        return Cluster(nodes, guests, rules, settings, cluster_name, *self.ha_manager(doc))

    def ha_manager(self, doc: Mapping[str, Any]) -> tuple[bool, HaScheduler | None]:
        """What Proxmox VE's HA manager does beside opendrs: whether it balances its HA guests
        itself (``ha_auto_rebalance``) and the scheduler mode it restarts them in
        (``ha_scheduler``; None when the snapshot does not say)."""
        balancing = doc.get("ha_auto_rebalance")
        ha_auto_rebalance = (
            False if balancing is None else self.boolean(balancing, ("ha_auto_rebalance",))
        )
        mode = doc.get("ha_scheduler")
        if mode is None:
            return ha_auto_rebalance, None
        scheduler = self.choice(mode, ("ha_scheduler",), HA_SCHEDULERS)
        return ha_auto_rebalance, cast(HaScheduler, scheduler)

    def version(self, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(("version",), f"expected the number {FORMAT_VERSION}, got {describe(value)}")
        if value != FORMAT_VERSION:
            self.fail(
                ("version",),
                f"unsupported version {describe(value)} (this opendrs reads version "
                f"{FORMAT_VERSION})",
            )

    def settings(self, value: object, path: Path) -> Settings:
        if value is None:
            return Settings()
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, SETTINGS_KEYS)
        fields: dict[str, Any] = {}
        if "mode" in mapping:
            fields["mode"] = self.choice(mapping["mode"], (*path, "mode"), USAGE_MODES)
        if "balance_source" in mapping:
            fields["balance_source"] = self.choice(
                mapping["balance_source"], (*path, "balance_source"), BALANCE_SOURCES
            )
        for key in ("cpu_overcommit", "memory_overcommit"):
            if key in mapping:
                fields[key] = self.number(
                    mapping[key], (*path, key), positive=True, maximum=MAX_RATIO
                )
                if fields[key] < MIN_OVERCOMMIT:
                    self.fail(
                        (*path, key),
                        f"must be at least {MIN_OVERCOMMIT:g}, got {describe(mapping[key])}",
                    )
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"), configured=True)
            if cpu is not None:
                fields["reserve_cpu"] = cpu
            if memory is not None:
                fields["reserve_memory"] = memory
        for key in ("allow_restart_migration", "allow_local_disks"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "migration" in mapping:
            fields.update(self.migration(mapping["migration"], (*path, "migration")))
        if "min_uptime" in mapping:
            fields["min_uptime"] = self.duration(
                mapping["min_uptime"], (*path, "min_uptime"), maximum=MAX_MIN_UPTIME
            )
        if "weights" in mapping:
            fields.update(self.weights(mapping["weights"], (*path, "weights")))
        return Settings(**fields)

    def migration(self, value: object, mpath: Path) -> dict[str, Any]:
        """``settings.migration``: the fields of :class:`Settings` it sets."""
        migration = self.mapping(value, mpath)
        self.check_keys(migration, mpath, MIGRATION_KEYS)
        fields: dict[str, Any] = {}
        for key in ("max_parallel", "max_node_inflow"):
            if key in migration:
                fields[key] = self.integer(
                    migration[key], (*mpath, key), minimum=1, maximum=100_000
                )
        if "cost_unit" in migration:
            fields["cost_unit"] = self.size(
                migration["cost_unit"], (*mpath, "cost_unit"), positive=True
            )
            if fields["cost_unit"] < MIN_COST_UNIT:
                self.fail(
                    (*mpath, "cost_unit"),
                    f"must be at least 1MiB, got {describe(migration['cost_unit'])}",
                )
        if "cost_disk_factor" in migration:
            key = "cost_disk_factor"
            fields[key] = self.number(migration[key], (*mpath, key), maximum=MAX_RATIO)
        return fields

    def weights(self, value: object, wpath: Path) -> dict[str, Any]:
        """``settings.weights``: the cpu and memory weights, not both 0."""
        weights = self.mapping(value, wpath)
        self.check_keys(weights, wpath, ("cpu", "memory"))
        defaults = Settings()
        cpu_weight = (
            self.number(weights["cpu"], (*wpath, "cpu"), maximum=MAX_RATIO)
            if "cpu" in weights
            else defaults.weight_cpu
        )
        memory_weight = (
            self.number(weights["memory"], (*wpath, "memory"), maximum=MAX_RATIO)
            if "memory" in weights
            else defaults.weight_memory
        )
        if cpu_weight == 0 and memory_weight == 0:
            self.fail(wpath, "the cpu and memory weights must not both be 0")
        return {"weight_cpu": cpu_weight, "weight_memory": memory_weight}
