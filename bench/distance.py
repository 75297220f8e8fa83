"""The distance to foresight on the month: opendrs's points against what knowing the future buys.

``python -m bench.distance [--budgets 1,2,3,5,10,20] [--moves 10,15,20,25,30,40]
[--daily-profile DAYS [--daily-budgets 1,2,5]] [--chart docs/distance-to-foresight.png]
[--json FILE] [--resume]``

``--json`` may be :mod:`bench.pareto`'s file: the month's runs are kept under the same keys, and
the ones either command made are reused by the other.

opendrs's points are ``opendrs simulate`` runs on the built-in month — the default policy and one
run per migration budget (``max_migrations_per_day``): migrations in the month against the share
of its minutes above the threshold. With ``--daily-profile DAYS``, the same policy with
``daily_profile: DAYSd`` (demand per time of day) adds its points: without a budget and with each
of ``--daily-budgets`` (none by default), under the keys ``daily DAYSd`` and ``daily DAYSd budget
N``. The curves are :mod:`bench.month`'s, for each number of
migrations in ``--moves``: *foresight* (a search that knows the usage of days 1–14) and *day 0*
(greedy moves on day 0's mean usage). For each point it prints the migrations foresight needs to
be above the threshold as little of the time (the foresight curve read between its points, by
linear interpolation; none when the point is beyond the curve) and the ratio of opendrs's
migrations to those — the issue's "distance to foresight" — and draws the chart.

The two sides are not measured quite alike, and the ratio should be read with that in mind: the
curves price the initial rebalance alone, judged on days 1–14 with every node up; the points are
whole simulated months (30 days, from day 0, with the node failure, the maintenance window and
their migrations).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.month import Month, above, day_zero, foresight
from bench.pareto import run
from opendrs.backends.scenario import builtin_scenario
from opendrs.cli.simulate import run_policy
from opendrs.engine.policy import PRESETS

DAYS = 14
DAY = 86400


def opendrs_points(budgets: Sequence[int], stored: dict[str, Any], save: Any) -> list[Any]:
    """(label, migrations, % above threshold) of the default and each budget; the runs are
    :func:`bench.pareto.run`'s, under its keys (``opendrs``, ``budget N``), reused when there."""
    scenario = builtin_scenario("month")
    out = []
    for key in ["opendrs", *(f"budget {b}" for b in budgets)]:
        if key not in stored:
            stored[key] = run(scenario, key)
            save()
        r = stored[key]
        label = "default" if key == "opendrs" else key
        out.append((label, r["migrations"], r["pct_time_above_threshold"]))
    return out


def daily_points(days: int, budgets: Sequence[int], stored: dict[str, Any], save: Any) -> list[Any]:
    """(label, migrations, % above threshold) of opendrs's preset with ``daily_profile`` of
    ``days`` days, without a budget and with each of ``budgets``; reused when stored."""
    scenario = builtin_scenario("month")
    out = []
    for budget in [None, *budgets]:
        key = f"daily {days}d" + ("" if budget is None else f" budget {budget}")
        if key not in stored:
            policy = replace(
                PRESETS["opendrs"], daily_profile=days * DAY, max_migrations_per_day=budget
            )
            stored[key] = run_policy(scenario, policy).as_dict()
            save()
        r = stored[key]
        out.append((key, r["migrations"], r["pct_time_above_threshold"]))
    return out


def curves(moves: Sequence[int], stored: dict[str, Any], save: Any) -> dict[str, list[float]]:
    """% of the minutes of days 1–14 above the threshold, per number of migrations."""
    if stored.get("moves") != list(moves):
        month = Month.load(builtin_scenario("month"), DAYS)
        stored["moves"] = list(moves)
        stored["foresight"] = [above(month, foresight(month, k, DAYS), DAYS) for k in moves]
        stored["day 0"] = [above(month, day_zero(month, k), DAYS) for k in moves]
        save()
    return {"foresight": stored["foresight"], "day 0": stored["day 0"]}


def needed(moves: Sequence[int], pct: Sequence[float], target: float) -> float | None:
    """Migrations the curve needs to be above the threshold ``target`` % of the time (linear
    between its points); None when the curve does not reach that low, or starts below it."""
    xs, ys = np.asarray(moves, dtype=float), np.asarray(pct, dtype=float)
    for i in range(len(xs) - 1):
        high, low = ys[i], ys[i + 1]
        if high >= target >= low and high > low:
            return float(xs[i] + (xs[i + 1] - xs[i]) * (high - target) / (high - low))
    return None


def chart(
    path: Path, moves: Sequence[int], lines: dict[str, list[float]], points: list[Any]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for name, style in (("foresight", "-o"), ("day 0", "--s")):
        ax.plot(moves, lines[name], style, label=f"{name} (days 1–{DAYS}, no faults)")
    own = [p for p in points if not p[0].startswith("daily")]
    daily = [p for p in points if p[0].startswith("daily")]
    for group, marker, colour, name in (
        (own, "D", "C3", "opendrs: default and budgets (30 days, faults)"),
        (daily, "^", "C2", "opendrs with daily_profile (30 days, faults)"),
    ):
        if group:
            xs = [m for _, m, _ in group]
            ys = [p for _, _, p in group]
            ax.plot(xs, ys, marker, color=colour, label=name)
    for label, m, p in points:
        ax.annotate(
            label.replace("budget ", "").replace("daily ", ""),
            (m, p),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    ax.set_xlabel("migrations")
    ax.set_ylabel("time above the threshold (%)")
    ax.set_title("The month: opendrs against foresight")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def _numbers(parser: argparse.ArgumentParser, name: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        parser.error(f"--{name}: expected whole numbers separated by commas, got {text!r}")
    if any(v < 0 for v in values):
        parser.error(f"--{name}: must be ≥ 0")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.distance", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--budgets", default="1,2,3,5,10,20", help="opendrs's budgets per day")
    parser.add_argument("--moves", default="10,15,20,25,30,40", help="the curves' migrations")
    parser.add_argument(
        "--daily-profile", type=int, metavar="DAYS", help="add the points of daily_profile: DAYSd"
    )
    parser.add_argument(
        "--daily-budgets", default="", help="with --daily-profile, its budgets per day"
    )
    parser.add_argument("--chart", type=Path, help="write the chart (PNG) here")
    parser.add_argument("--json", type=Path, help="write every result here as it ends")
    parser.add_argument("--resume", action="store_true", help="reuse the results in --json")
    args = parser.parse_args(argv)
    budgets = _numbers(parser, "budgets", args.budgets)
    moves = sorted(_numbers(parser, "moves", args.moves))
    daily_budgets = _numbers(parser, "daily-budgets", args.daily_budgets)
    if args.daily_profile is not None and not 1 <= args.daily_profile <= 30:
        parser.error("--daily-profile: expected whole days from 1 to 30")
    if args.resume and args.json is None:
        parser.error("--resume needs --json")
    stored: dict[str, Any] = {}
    if args.resume and args.json.exists():
        stored = json.loads(args.json.read_text())

    def save() -> None:
        if args.json is not None:
            args.json.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")

    logging.getLogger("opendrs").setLevel(logging.ERROR)
    lines = curves(moves, stored.setdefault("curves", {}), save)
    month_runs = stored.setdefault("builtin:month", {})
    points = opendrs_points(budgets, month_runs, save)
    if args.daily_profile is not None:
        points += daily_points(args.daily_profile, daily_budgets, month_runs, save)
    print("| migrations | foresight | day 0 |\n|---:|---:|---:|")
    for k, best, causal in zip(moves, lines["foresight"], lines["day 0"], strict=True):
        print(f"| {k} | {best:.1f} % | {causal:.1f} % |")
    print("\n| opendrs | migrations | above threshold | foresight needs | ratio |")
    print("|---|---:|---:|---:|---:|")
    for label, m, p in points:
        k = needed(moves, lines["foresight"], p)
        need, ratio = ("—", "—") if k is None else (f"{k:.1f}", f"{m / k:.1f}×")
        print(f"| {label} | {m} | {p:.1f} % | {need} | {ratio} |")
    if args.chart is not None:
        chart(args.chart, moves, lines, points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
