"""The strategies opendrs knows, listed explicitly: importing a module registers nothing.

Each strategy is listed by its name, its one-line summary and the module whose ``STRATEGIES``
holds it; the module is imported when the strategy is first asked for, so that a command runs
without loading every algorithm (``opendrs strategies`` lists them without importing any). The
listing is checked against the modules' own ``name`` and ``summary`` (tests/engine/strategies).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass

from .base import StrategyInfo

DEFAULT_STRATEGY = "balance"


@dataclass(frozen=True)
class Listed:
    """A strategy as listed before its module is imported."""

    name: str
    summary: str
    #: The module whose ``STRATEGIES`` holds it.
    module: str


_PACKAGE = "opendrs.engine.strategies"

#: Every strategy, in the order ``opendrs strategies`` lists them (by name).
LISTED: tuple[Listed, ...] = (
    Listed(
        "balance",
        "opendrs: fewest, smallest migrations to a target spread; all rules hard",
        f"{_PACKAGE}.balance.strategy",
    ),
    Listed(
        "static-greedy",
        "Proxmox's sketched balancer: worst guests first, to their best node unless close",
        f"{_PACKAGE}.greedy",
    ),
    Listed(
        "incus",
        "Incus rebalancing: busiest member to the least busy, up to the midpoint, per arch",
        f"{_PACKAGE}.incus",
    ),
    Listed(
        "optimal",
        "Exact placement with CP-SAT: spread, migration cost and soft rules (proxlb-solver's "
        "model)",
        f"{_PACKAGE}.optimal",
    ),
    Listed(
        "drs-pressure",
        "DRS-like: move the worst bad VM (cpu pressure, node memory, rules), TOPSIS+AHP",
        f"{_PACKAGE}.pressure",
    ),
    Listed(
        "proxlb-greedy",
        "ProxLB 2.3's greedy balancer: busiest node's guests to the most free node",
        f"{_PACKAGE}.proxlb_greedy",
    ),
    Listed(
        "pve-bruteforce",
        "Proxmox auto-rebalance: best single move by imbalance, repeated",
        f"{_PACKAGE}.pve",
    ),
    Listed(
        "pve-topsis",
        "Proxmox auto-rebalance: best single move by TOPSIS on RMS/max load",
        f"{_PACKAGE}.pve",
    ),
)


class Registry(MutableMapping[str, StrategyInfo]):
    """Each strategy by its name: its module imported on first access. A strategy set by hand
    (a test's stand-in) replaces the listed one until it is set back."""

    def __init__(self, listed: tuple[Listed, ...]) -> None:
        self._listed = {entry.name: entry for entry in listed}
        self._loaded: dict[str, StrategyInfo] = {}

    def __getitem__(self, name: str) -> StrategyInfo:
        info = self._loaded.get(name)
        if info is None:
            entry = self._listed[name]
            module = importlib.import_module(entry.module)
            (strategy,) = (s for s in module.STRATEGIES if s.name == name)
            info = self._loaded[name] = StrategyInfo(strategy)
        return info

    def __setitem__(self, name: str, info: StrategyInfo) -> None:
        self._loaded[name] = info

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._listed.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        yield from self._listed
        yield from (name for name in self._loaded if name not in self._listed)

    def __len__(self) -> int:
        return len(self._listed.keys() | self._loaded.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._listed or name in self._loaded

    def summary(self, name: str) -> str:
        """The strategy's one line, without importing its module."""
        info = self._loaded.get(name)
        return info.summary if info is not None else self._listed[name].summary


#: Each strategy by its name, in the order ``opendrs strategies`` lists them (by name).
REGISTRY = Registry(LISTED)


def get_strategy(name: str) -> StrategyInfo:
    """The strategy called ``name``; KeyError naming the known ones otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown strategy {name!r} (known: {known})") from None
