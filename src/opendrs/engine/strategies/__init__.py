"""Rebalancing strategies: one module per algorithm, one interface (see :mod:`.base`), one
explicit list (:mod:`.registry`)."""

from __future__ import annotations

from .base import Proposal, ProposedMove, Strategy, StrategyInfo, cluster_imbalance, migration_cost
from .registry import DEFAULT_STRATEGY, REGISTRY, get_strategy

__all__ = [
    "DEFAULT_STRATEGY",
    "REGISTRY",
    "Proposal",
    "ProposedMove",
    "Strategy",
    "StrategyInfo",
    "cluster_imbalance",
    "get_strategy",
    "migration_cost",
]
