"""Proxmox VE HA cluster resource scheduler (CRS) decisions, reimplemented in Python.

This package mirrors the decision functions of ``pve-ha-manager`` (``src/PVE/HA/…``) and
``proxmox-resource-scheduling`` so that opendrs can answer exactly what a Proxmox HA manager
would decide for a given cluster snapshot. Its modules follow upstream's files, to be read beside
them:

* :mod:`.status` — what the manager knows: scheduler mode, nodes and services
  (:class:`ManagerStatus`, :class:`NodeInfo`, :class:`Service`);
* :mod:`.section_config` — the ``rules.cfg``/``groups.cfg`` text format (``PVE::SectionConfig``);
* :mod:`.rules` — ``PVE::HA::Rules`` and ``Rules/*.pm``: parsing, the feasibility checks that
  drop rules, the transforms, the compiled rules, node and resource affinity;
* :mod:`.groups` — ``PVE::HA::Groups``: legacy groups and their migration to rules;
* :mod:`.usage` — ``PVE::HA::Usage`` and ``Usage/*.pm``: which node(s) a service loads in which
  state, and with what (``basic``, ``static``, ``dynamic``);
* :mod:`opendrs.engine.pve_selection` (in the engine, shared with the ``pve-bruteforce`` and
  ``pve-topsis`` strategies) — ``proxmox-resource-scheduling``: node stats, imbalance, TOPSIS
  start scoring, brute-force and TOPSIS migration choice;
* :mod:`.manager` — ``PVE::HA::Manager``: ``select_service_node``, ``load_balance`` and the manual
  ``migrate``/``relocate`` commands;
* :mod:`.serve` — ``opendrs pve decide``: the JSON query protocol and the JSON-Lines service.

Everything is pure: a query goes in, an answer comes out.
"""

from __future__ import annotations

from .groups import Group, apply_groups, groups_to_rules, parse_groups
from .manager import execute_command, load_balance, make_usage, select_service_node
from .rules import (
    CompiledRules,
    Rule,
    check_feasibility,
    compile_rules,
    get_node_affinity,
    get_resource_affinity,
    inverted,
    parse_rules,
    transform_rules,
)
from .serve import PveQueryError, decide, parse_query, serve
from .status import (
    DEFAULT_NODE_MAXCPU,
    DEFAULT_NODE_MAXMEM,
    DEFAULT_SERVICE_CPU,
    DEFAULT_SERVICE_MAXCPU,
    DEFAULT_SERVICE_MAXMEM,
    DEFAULT_SERVICE_MEM,
    ManagerStatus,
    NodeInfo,
    Service,
)
from .usage import BasicUsage, DynamicUsage, StaticUsage, Usage, get_used_service_nodes

__all__ = [
    "DEFAULT_NODE_MAXCPU",
    "DEFAULT_NODE_MAXMEM",
    "DEFAULT_SERVICE_CPU",
    "DEFAULT_SERVICE_MAXCPU",
    "DEFAULT_SERVICE_MAXMEM",
    "DEFAULT_SERVICE_MEM",
    "BasicUsage",
    "CompiledRules",
    "DynamicUsage",
    "Group",
    "ManagerStatus",
    "NodeInfo",
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
    "inverted",
    "load_balance",
    "make_usage",
    "parse_groups",
    "parse_query",
    "parse_rules",
    "select_service_node",
    "serve",
    "transform_rules",
]
