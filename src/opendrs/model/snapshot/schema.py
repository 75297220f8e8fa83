"""The snapshot format's vocabulary: its version, the keys each part of a document may hold, the
rule types and the ranges a value must fall in. Read by the snapshot readers and the writer alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

#: The version the snapshot format reads and writes.
FORMAT_VERSION: Final = 1
#: The rule types, in the order :func:`to_dict` writes them.
RULE_TYPES: Final = ("node-affinity", "pin", "affinity", "anti-affinity", "ignore")

# Physically sensible ranges: a value outside them is a mistake in the file, refused when read,
# not a number for a strategy to choke on. Sizes are bounded by MAX_BYTES (8 PiB).
#: Most cores a node has, or a guest is configured with, uses, or a node keeps in reserve.
MAX_CORES: Final = 100_000
#: Fewest cores a node has: a load divided by its capacity stays a sensible number.
MIN_NODE_CORES: Final = 0.01
#: Largest overcommit ratio, resource weight and migration cost factor.
MAX_RATIO: Final = 1000
#: Smallest overcommit ratio (below 1, a node carries less than it has).
MIN_OVERCOMMIT: Final = 0.01
#: Longest ``min_uptime``, in seconds (a year).
MAX_MIN_UPTIME: Final = 365 * 86400
#: Smallest migration ``cost_unit``, in bytes.
MIN_COST_UNIT: Final = 1024**2


PRESSURE_KEYS: Final = ("cpu", "memory", "io", "memory_full", "io_full")
TOP_KEYS: Final = (
    "version",
    "name",
    "settings",
    "storage",
    "nodes",
    "guests",
    "rules",
    "ha_auto_rebalance",
    "ha_scheduler",
)
SETTINGS_KEYS: Final = (
    "mode",
    "balance_source",
    "cpu_overcommit",
    "memory_overcommit",
    "reserve",
    "allow_restart_migration",
    "allow_local_disks",
    "min_uptime",
    "weights",
    "migration",
)
MIGRATION_KEYS: Final = ("max_parallel", "max_node_inflow", "cost_unit", "cost_disk_factor")
NODE_KEYS: Final = (
    "cpu",
    "memory",
    "arch",
    "online",
    "maintenance",
    "tags",
    "storage",
    "reserve",
    "usage",
    "pressure",
    "ksm",
)
GUEST_KEYS: Final = (
    "id",
    "name",
    "kind",
    "node",
    "state",
    "cpu",
    "memory",
    "disks",
    "usage",
    "pressure",
    "devices",
    "uptime",
    "lock",
    "ha",
    "ha_state",
    "failback",
    "tags",
    "priority",
    "migrating_to",
    "arch",
    "limits",
)
RULE_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "node-affinity": ("type", "name", "guests", "nodes", "strict", "affinity", "origin"),
    "pin": ("type", "name", "guests", "nodes", "origin"),
    "affinity": ("type", "name", "guests", "hard", "origin"),
    "anti-affinity": ("type", "name", "guests", "hard", "origin"),
    "ignore": ("type", "guests", "reason"),
}
#: Top-level keys of a proxlb-solver scenario, a different format (see compat/proxlb).
PROXLB_KEYS: Final = frozenset({"vms", "balancing", "constraints", "expect", "evacuate_node"})


def generated_name(kind: str, count: int, guests: tuple[str, ...]) -> str:
    """The name of a rule that has none: ``pin-<guests>`` for pins, else ``<type>-<n>``."""
    if kind == "pin":
        return "pin-" + "-".join(guests)
    return f"{kind}-{count}"
