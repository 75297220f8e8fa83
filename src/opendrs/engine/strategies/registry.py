"""The strategies opendrs knows, listed explicitly: importing a module registers nothing."""

from __future__ import annotations

from . import greedy, incus, optimal, pressure, proxlb_greedy, pve
from .balance import strategy as balance
from .base import StrategyInfo

DEFAULT_STRATEGY = "balance"

#: Each strategy by its name, in the order ``opendrs strategies`` lists them (by name).
REGISTRY: dict[str, StrategyInfo] = {
    strategy.name: StrategyInfo(strategy)
    for module in (balance, greedy, incus, optimal, pressure, proxlb_greedy, pve)
    for strategy in module.STRATEGIES
}


def get_strategy(name: str) -> StrategyInfo:
    """The strategy called ``name``; KeyError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown strategy {name!r} (known: {known})") from None
