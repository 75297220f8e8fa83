"""Rebalancing strategies: one module per algorithm, one interface (see :mod:`.base`)."""

from __future__ import annotations

from . import balance as _balance  # noqa: F401  (registers its strategies)
from . import greedy as _greedy  # noqa: F401
from . import incus as _incus  # noqa: F401
from . import optimal as _optimal  # noqa: F401
from . import pressure as _pressure  # noqa: F401
from . import proxlb_greedy as _proxlb_greedy  # noqa: F401
from . import pve as _pve  # noqa: F401
from .base import REGISTRY, Proposal, ProposedMove, StrategyInfo, cluster_imbalance, migration_cost

DEFAULT_STRATEGY = "balance"


def get_strategy(name: str) -> StrategyInfo:
    """The strategy called ``name``; KeyError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown strategy {name!r} (known: {known})") from None


__all__ = [
    "DEFAULT_STRATEGY",
    "REGISTRY",
    "Proposal",
    "ProposedMove",
    "StrategyInfo",
    "cluster_imbalance",
    "get_strategy",
    "migration_cost",
]
