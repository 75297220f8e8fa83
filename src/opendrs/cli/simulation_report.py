"""The report of ``opendrs simulate --report FILE``: the policies side by side.

Each policy's stability figures (those ``opendrs simulate`` prints, less the wall time, which is
not the input's), the imbalance yardstick over time — every policy on one chart, hourly means —
and the controller's migrations per simulated day, every policy on one chart; Markdown gives the
same per day as tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opendrs.cli.simulate import DAY, PolicyTrace, StabilityReport
from opendrs.report.charts import Line, Spans, bar_chart, line_chart
from opendrs.report.render import Document

__all__ = ["simulation_document"]

HOUR = 3600.0


def simulation_document(
    scenario: str, runs: Sequence[tuple[StabilityReport, PolicyTrace]]
) -> Document:
    """The report of one simulation: ``runs`` are each policy's report and trace, in order."""
    if not runs:
        raise ValueError("a simulation report needs at least one policy's run")
    runs = _labelled(runs)
    first = runs[0][0]
    count = max(1, math.ceil(first.days - 1e-9))
    data = {
        "scenario": scenario,
        "days": first.days,
        "threshold": first.threshold,
        "hot": first.hot,
        "policies": [_figures(report) for report, _ in runs],
        "per_day": [_per_day(trace, count) for _, trace in runs],
        "day_numbers": list(range(1, count + 1)),
    }

    def charts() -> dict[str, str]:
        return _charts(runs, count, first.threshold)

    return Document("simulation", f"opendrs simulation report: {scenario}", data, charts)


def _labelled(
    runs: Sequence[tuple[StabilityReport, PolicyTrace]],
) -> list[tuple[StabilityReport, PolicyTrace]]:
    """``runs`` with each policy named once: a name given again gets ``#2``, ``#3``…"""
    seen: dict[str, int] = {}
    out = []
    for report, trace in runs:
        seen[report.policy] = seen.get(report.policy, 0) + 1
        if seen[report.policy] > 1:
            name = f"{report.policy} #{seen[report.policy]}"
            report, trace = replace(report, policy=name), replace(trace, policy=name)
        out.append((report, trace))
    return out


def _figures(report: StabilityReport) -> dict[str, Any]:
    figures = report.as_dict()
    del figures["wall_seconds"]  # the machine's, not the simulation's: not in the report
    del figures["balancing_starts"]  # the migrations chart shows them
    figures["capacity_violations_shown"] = report.capacity_violations_shown
    return figures


def _per_day(trace: PolicyTrace, count: int) -> dict[str, Any]:
    """Per simulated day: the mean yardstick of its steps, and the migrations started."""
    spreads: list[list[float]] = [[] for _ in range(count)]
    for k, value in enumerate(trace.spreads):
        spreads[min(int(k * trace.step // DAY), count - 1)].append(value)
    started = [0] * count
    failed = [0] * count
    for at in trace.migrations:
        started[min(int(at // DAY), count - 1)] += 1
    for at in trace.failed:
        failed[min(int(at // DAY), count - 1)] += 1
    return {
        "policy": trace.policy,
        "mean_spread": [sum(day) / len(day) if day else None for day in spreads],
        "migrations": started,
        "failed": failed,
    }


def _hourly(trace: PolicyTrace) -> list[tuple[float, float]]:
    """The yardstick averaged per simulated hour, as (day, percentage points)."""
    hours: dict[int, list[float]] = {}
    for k, value in enumerate(trace.spreads):
        hours.setdefault(int(k * trace.step // HOUR), []).append(value)
    return [(hour * HOUR / DAY, 100.0 * sum(v) / len(v)) for hour, v in sorted(hours.items())]


def _windows(runs: Sequence[tuple[StabilityReport, PolicyTrace]]) -> Spans | None:
    """The migration windows of the first policy that has some, in simulated days, to shade."""
    for _report, trace in runs:
        if trace.open_spans is not None:
            days = tuple((start / DAY, end / DAY) for start, end in trace.open_spans)
            return Spans(days, f"{trace.policy}: balancing may start")
    return None


def _charts(
    runs: Sequence[tuple[StabilityReport, PolicyTrace]], count: int, threshold: float
) -> dict[str, str]:
    per_day = [_per_day(trace, count) for _, trace in runs]
    return {
        "spread": line_chart(
            {trace.policy: _hourly(trace) for _, trace in runs},
            title="Spread over time, each policy (hourly mean)",
            xlabel="simulated days",
            ylabel="spread (pp)",
            lines=[Line(100.0 * threshold, "threshold")],
            shaded=_windows(runs),
        ),
        "migrations": bar_chart(
            [str(day) for day in range(1, count + 1)],
            {p["policy"]: [float(n) for n in p["migrations"]] for p in per_day},
            title="Migrations per simulated day, each policy",
            ylabel="migrations",
        ),
    }
