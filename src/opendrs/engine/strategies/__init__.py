"""Rebalancing strategies: one module per algorithm, one interface (see :mod:`.base`)."""

from __future__ import annotations

from . import pve as _pve  # noqa: F401  (registers its strategies)
from .base import REGISTRY, Proposal, ProposedMove, StrategyInfo, cluster_imbalance, migration_cost

DEFAULT_STRATEGY = "pve-bruteforce"


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
