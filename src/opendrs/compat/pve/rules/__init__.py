"""The HA rules (``PVE::HA::Rules`` and its plugins), read beside upstream's files.

* :mod:`.base` — the rule records and the ``rules.cfg`` parser (``Rules.pm``'s section config);
* :mod:`.helpers` — ``Rules/Helpers.pm``;
* :mod:`.node_affinity` — ``Rules/NodeAffinity.pm``;
* :mod:`.resource_affinity` — ``Rules/ResourceAffinity.pm``;
* :mod:`.ruleset` — ``Rules.pm``'s ``check_feasibility``, ``transform`` and ``compile``, with the
  checks and the transform between the two rule kinds.
"""

from __future__ import annotations

from .base import CompiledRules, Errors, Rule, parse_rules
from .node_affinity import get_node_affinity, inverted
from .resource_affinity import get_resource_affinity
from .ruleset import check_feasibility, compile_rules, transform_rules

__all__ = [
    "CompiledRules",
    "Errors",
    "Rule",
    "check_feasibility",
    "compile_rules",
    "get_node_affinity",
    "get_resource_affinity",
    "inverted",
    "parse_rules",
    "transform_rules",
]
