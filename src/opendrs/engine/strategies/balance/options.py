"""``balance``'s options (:class:`BalanceOptions`), read by every phase."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..base import StrategyOptions

DEFAULT_TARGET_SPREAD = 0.01
DEFAULT_MARGIN = 0.05
DEFAULT_WIDE = 64
DEFAULT_CPU_COMMIT_SPREAD = 1.0
DEFAULT_CPU_COMMIT_MOVES = 1.3


def _check_options(
    target_spread: float,
    margin: float,
    max_moves: int | None,
    wide: int,
    flags: dict[str, bool],
    cpu_commit_spread: float,
    cpu_commit_moves: float,
) -> None:
    """ValueError naming the first bad option."""

    def number(name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
            raise ValueError(f"{name}: expected a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"{name}: must not be negative, got {value!r}")

    number("target_spread", target_spread)
    number("margin", margin)
    number("cpu_commit_spread", cpu_commit_spread)
    number("cpu_commit_moves", cpu_commit_moves)
    if max_moves is not None and (
        isinstance(max_moves, bool) or not isinstance(max_moves, int) or max_moves < 0
    ):
        raise ValueError(f"max_moves: expected a whole number ≥ 0, got {max_moves!r}")
    if isinstance(wide, bool) or not isinstance(wide, int) or wide < 1:
        raise ValueError(f"wide: expected a whole number ≥ 1, got {wide!r}")
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ValueError(f"{name}: expected true or false, got {flag!r}")


@dataclass(frozen=True)
class BalanceOptions(StrategyOptions):
    """``balance``'s options (see :func:`propose_balance`)."""

    fractions: ClassVar[frozenset[str]] = frozenset({"target_spread", "cpu_commit_spread"})

    target_spread: float = DEFAULT_TARGET_SPREAD
    margin: float = DEFAULT_MARGIN
    max_moves: int | None = None
    wide: int = DEFAULT_WIDE
    swaps: bool = True
    #: Hold each resource within its goal (:mod:`.hold`): no weight in choosing moves, never
    #: taken above its goal.
    hold: bool = False
    #: The least goal of the vCPU commitments' spread (static mode): by default 100 pp (one vCPU
    #: per core between the most and the least committed node; a goal looser than
    #: ``target_spread`` holds the resources within their goal, as ``hold`` does); 0: one vCPU
    #: on the smallest node (or ``target_spread``, where coarser).
    cpu_commit_spread: float = DEFAULT_CPU_COMMIT_SPREAD
    #: Where the vCPU commitments start wider than ``cpu_commit_spread`` (static mode), the most
    #: migrations the plan that brings them within it may take, as a multiple of a plan's that
    #: balances the other resources and leaves them no wider than they start; beyond it that
    #: plan is proposed instead (:func:`.strategy.propose_balance`; clusters of up to 5,000
    #: guests). 0: that plan wherever it may be proposed (it ends balanced, or neither plan does
    #: and it leaves the other resources no less even); a large value: always the goal.
    cpu_commit_moves: float = DEFAULT_CPU_COMMIT_MOVES

    def check(self) -> None:
        _check_options(
            self.target_spread,
            self.margin,
            self.max_moves,
            self.wide,
            {"swaps": self.swaps, "hold": self.hold},
            self.cpu_commit_spread,
            self.cpu_commit_moves,
        )
