"""Spending a migration budget on reaction: with ``max_migrations_per_day`` set and
``spend_budget`` on (off by default: a budget alone only caps), the unspent part of a budget
larger than the smoothing's own pace buys a faster reaction — balancing reads usage closer to
the recent demand, with a shorter hold — and gives it back as the budget is spent (see "Spending
the budget" in docs/configuration.md). The margin stays: each plan still pays for itself.

A budget of *N* a day can pay for a migration every ``24 h / N``: that is the shortest demand it
affords to follow (its *horizon*). The policy's ``smoothing`` says how long a demand must last to
be worth a migration without a budget; a budget whose horizon is that long or longer (4 a day or
fewer with the default 6 hours) buys nothing faster and changes nothing. A larger one reaches
from the smoothing towards the recent usage (the mean over the hold, :func:`overload_span`) by
:func:`reach`, the share of that way its horizon covers; and only the unspent share of the
rolling window is offered, so that the reaction falls back to the default's as the budget runs
out (:func:`eagerness`). Pure and deterministic."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from opendrs.engine.policy.config import PolicyConfig
from opendrs.engine.policy.smoothing import overload_span
from opendrs.engine.policy.state import BUDGET_WINDOW, budget_allowance, budget_window
from opendrs.engine.usage import MeasuredUsage


def reach(config: PolicyConfig) -> float:
    """How far, from 0 to 1, the budget's horizon (a day over its migrations per day) lies from
    the ``smoothing`` window towards the recent usage's span: 0 unless ``spend_budget`` is on,
    with no budget, a budget of at most one migration per smoothing window, or no smoothing
    longer than the hold."""
    budget = config.max_migrations_per_day
    if not config.spend_budget or budget is None or budget == 0:
        return 0.0
    window = budget_window(budget, config.migration_budget_window)
    per_day = budget_allowance(budget, config.migration_budget_window) * BUDGET_WINDOW / window
    horizon = BUDGET_WINDOW / per_day
    smoothing, short = config.smoothing, overload_span(config)
    if smoothing <= short or horizon >= smoothing:
        return 0.0
    return (smoothing - max(horizon, short)) / (smoothing - short)


def eagerness(config: PolicyConfig, left: int | None) -> float:
    """How much faster than the default the policy reacts now, from 0 (the default) to 1 (on
    the recent usage, acting at once): :func:`reach` times the share of the budget's rolling
    window not yet spent (``left`` of its allowance)."""
    if left is None:
        return 0.0
    allowed = budget_allowance(config.max_migrations_per_day or 0, config.migration_budget_window)
    if allowed == 0:
        return 0.0
    return reach(config) * left / allowed


@dataclass(frozen=True)
class Hastening:
    """How the budget left hastens a decision: ``left`` of ``allowed`` budgeted migrations
    unspent; balancing reads usage ``eagerness`` (0..1) of the way to the mean over the last
    ``span`` seconds (None: no usage was given to move, only the hold shrinks)."""

    left: int
    allowed: int
    eagerness: float
    span: int | None = None


@dataclass(frozen=True)
class Reaction:
    """The policy as the budget left lets it react: the hold it decides with, and the usage
    balancing reads."""

    config: PolicyConfig
    average: MeasuredUsage | None
    #: How the budget hastens the decision (None: it does not).
    hastened: Hastening | None = None


def react(
    config: PolicyConfig,
    left: int | None,
    average: MeasuredUsage | None,
    latest: MeasuredUsage | None,
) -> Reaction:
    """``config`` and ``average`` as the budget left spends them (:func:`eagerness` *e*): the
    hold scaled by 1 − *e* (rounded up, at least one observation) and each measured value moved
    from the smoothed ``average`` towards ``latest`` (its mean over the hold) by *e*; the margin
    unchanged. With *e* = 0 — no budget, a small one, or one spent — both unchanged."""
    e = eagerness(config, left)
    if e <= 0.0:
        return Reaction(config, average)
    hold = max(math.ceil(max(config.hold, 1) * (1.0 - e) - 1e-9), 1)
    faster = replace(config, hold=hold)
    allowed = budget_allowance(config.max_migrations_per_day or 0, config.migration_budget_window)
    assert left is not None  # eagerness is 0 without a budget
    if average is None or latest is None:
        return Reaction(faster, average, Hastening(left, allowed, e))
    hastened = Hastening(left, allowed, e, overload_span(config))
    return Reaction(faster, blend(average, latest, e), hastened)


def blend(average: MeasuredUsage, latest: MeasuredUsage, weight: float) -> MeasuredUsage:
    """Each value ``weight`` of the way from ``average`` to ``latest`` (the same guests and
    nodes); memory in whole bytes."""
    if average.guest_ids != latest.guest_ids or average.node_names != latest.node_names:
        raise ValueError("measured usage: made for another cluster's guests or nodes")

    def mix(a: np.ndarray, b: np.ndarray, whole: bool) -> np.ndarray:
        out = a + weight * (b - a)
        out = np.rint(out) if whole else out
        out.setflags(write=False)
        return out

    return MeasuredUsage(
        average.guest_ids,
        average.node_names,
        mix(average.cpu, latest.cpu, False),
        mix(average.memory, latest.memory, True),
        mix(average.base_cpu, latest.base_cpu, False),
        mix(average.base_memory, latest.base_memory, True),
    )
