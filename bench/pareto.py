"""opendrs against every emulated peer on the month and generated months: one table per scenario.

``python -m bench.pareto [--seeds 1,2,4,6,8] [--no-month] [--json FILE] [--resume [--again]]``

For each scenario — the shipped month (``builtin:month``) and the generated months of ``--seeds``
(``opendrs simulate --generate SEED``) — it runs, each on a fresh simulator, opendrs's default
policy and the emulated peers (``proxmox``, ``incus``, ``proxlb``), then opendrs with a migration
budget (``max_migrations_per_day``) matched to each peer: the largest budget, searched downwards
from the peer's total spread over the days, whose run makes at most as many migrations in all as
the peer; below one a day, the fractions 1/2, 1/3, … (one migration in any 2, 3, … days) before
0. When the default already makes no more migrations than the peer it is matched itself, unless
the peer's share per day is a budget that buys a faster reaction and the budget found is above
the threshold no more of the time than the default. It prints one Markdown table per scenario —
migrations, balancing migrations, time above the threshold, hot node-minutes, capacity
violations, ping-pongs — and the issue's targets, met or missed.

Every run's report goes to ``--json`` as it ends (``--resume`` reuses the runs already there), so
an interrupted measurement goes on where it stopped, and ``--again`` runs opendrs's policies
anew after a change to them, reusing the peers'. Runs one simulation at a time.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from opendrs.backends.generated import DEFAULT_GUESTS, DEFAULT_NODES, generated_scenario
from opendrs.backends.scenario import Scenario, builtin_scenario
from opendrs.cli.simulate import run_policy
from opendrs.engine.policy import PRESETS, PolicyConfig
from opendrs.engine.policy.spending import reach

PEERS = ("proxmox", "incus", "proxlb")
SEEDS = (1, 2, 4, 6, 8)
Report = dict[str, Any]


@dataclass
class Runs:
    """The reports of one scenario's runs, by key (``opendrs``, a peer, or ``budget N``)."""

    label: str
    run: Callable[[str], Report]
    store: dict[str, Report]
    save: Callable[[], None]

    def get(self, key: str) -> Report:
        if key not in self.store:
            self.store[key] = self.run(key)
            print(f"  {self.label} {key}: {_brief(self.store[key])}", file=sys.stderr, flush=True)
            self.save()
        return self.store[key]


def run(scenario: Scenario, key: str) -> Report:
    """The report of one run: ``opendrs``, a peer's preset, or ``budget N`` or ``budget 1/N``
    (opendrs's preset with ``max_migrations_per_day: N`` or ``1 / N``, spent on reaction)."""
    policy = _budgeted(_budget_of(key)) if key.startswith("budget ") else PRESETS[key]
    return run_policy(scenario, policy).as_dict()


def _budgeted(budget: float) -> PolicyConfig:
    """opendrs's preset with the migration budget ``budget``, what it leaves spent on reaction
    (``spend_budget``: the operator's budget is what the policy may spend; 4 a day or fewer, and
    fractions, only cap)."""
    return replace(PRESETS["opendrs"], max_migrations_per_day=budget, spend_budget=True)


def _brief(r: Report) -> str:
    return (
        f"{r['migrations']} migrations, {r['pct_time_above_threshold']:.1f} % above, "
        f"{r['hot_node_minutes']:.0f} hot node-min, {r['wall_seconds']:.0f} s"
    )


#: Budgets tried above the first one that fits, at most.
UPWARD = 3

#: The most days a fractional budget spreads one migration over (``budget 1/N``).
LONGEST = 30


def matched_budget(runs: Runs, peer: str) -> str:
    """The key of opendrs's run matched to ``peer``: the largest budget found whose run makes at
    most as many migrations as the peer — from the peer's balancing share per day (at least 1),
    downwards until one fits, or upwards (at most :data:`UPWARD` more) while they fit; when not
    even 1 a day fits, the fractions below it (:func:`_fractional`). When opendrs's default
    makes no more migrations than the peer, that budget only where the peer's share buys a faster
    reaction (:func:`reach`; docs/configuration.md, "Spending the budget") and the budget found
    fits and is above the threshold no more of the time than the default; else the default."""
    limit = runs.get(peer)["migrations"]
    default = runs.get("opendrs")
    if default["migrations"] > limit:
        return _searched(runs, limit, default)
    share = max(1, math.floor((limit - default["repair_migrations"]) / default["days"]))
    if reach(_budgeted(share)) == 0:
        return "opendrs"  # a budget that buys no faster reaction only caps the default
    found = _searched(runs, limit, default)
    if not found.startswith("budget ") or _budget_of(found) < 1:
        return "opendrs"
    budgeted = runs.get(found)
    above = "pct_time_above_threshold"
    fits = budgeted["migrations"] <= limit and budgeted[above] <= default[above]
    return found if fits else "opendrs"


def _searched(runs: Runs, limit: int, default: Report) -> str:
    """The budget search of :func:`matched_budget`."""

    def total(budget: int) -> int:
        return int(runs.get(f"budget {budget}")["migrations"])

    budget = max(1, math.floor((limit - default["repair_migrations"]) / default["days"]))
    if total(budget) <= limit:
        for higher in range(budget + 1, budget + UPWARD + 1):
            if total(higher) > limit:
                break
            budget = higher
        return f"budget {budget}"
    while budget > 1:
        # Fewer by the share it went over, and at least one fewer.
        budget = max(1, min(budget - 1, math.floor(budget * limit / total(budget))))
        if total(budget) <= limit:
            return f"budget {budget}"
    if total(budget) <= limit:
        return f"budget {budget}"
    return _fractional(runs, limit)


def _fractional(runs: Runs, limit: int) -> str:
    """Below one a day: the largest ``budget 1/N`` (N up to :data:`LONGEST`) whose run makes at
    most ``limit`` migrations — N grown by the share the last went over, then back down while
    the one before fits — else ``budget 0``."""

    def total(days: int) -> int:
        key = "budget 1" if days == 1 else f"budget 1/{days}"
        return int(runs.get(key)["migrations"])

    days, tried = 1, 1
    while total(days) > limit:
        if days == LONGEST:
            return "budget 0"
        tried = days
        days = min(LONGEST, max(days + 1, math.ceil(days * total(days) / max(limit, 1))))
    while days - 1 > tried and total(days - 1) <= limit:
        days -= 1
    return f"budget 1/{days}"


def table(runs: Runs) -> list[str]:
    """The Markdown table of one scenario and its targets."""
    rows = ["opendrs", *PEERS]
    matched = {peer: matched_budget(runs, peer) for peer in PEERS}
    lines = [
        "| policy | budget per 24 h | migrations | balancing | above threshold | hot node-min "
        "| capacity violations | ping-pongs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    budgeted = sorted({m for m in matched.values() if m != "opendrs"}, key=_budget_of)
    for key in rows + budgeted:
        r = runs.get(key)
        if key in PEERS:
            name, budget = key, "—"
        else:
            name = "**opendrs**" if key == "opendrs" else "opendrs"
            budget = key.split()[1] if key in budgeted else "none"
            peers = [p for p, m in matched.items() if m == key]
            if peers:
                budget += f" (≤ {', '.join(peers)})"
        lines.append(
            f"| {name} | {budget} | {r['migrations']} | {r['balancing_migrations']} "
            f"| {r['pct_time_above_threshold']:.1f} % | {r['hot_node_minutes']:,.0f} "
            f"| {r['capacity_violations']} | {r['ping_pongs']} |"
        )
    return [*lines, "", *verdict(runs, matched)]


def _budget_of(key: str) -> float:
    """The budget per day of a run's key (``budget 3``, ``budget 1/2``); -1 for no budget."""
    if not key.startswith("budget "):
        return -1
    text = key.split()[1]
    return 1 / int(text.split("/")[1]) if "/" in text else int(text)


def verdict(runs: Runs, matched: dict[str, str]) -> list[str]:
    """The issue's targets on this scenario, each met or missed (and by how much)."""
    ours = runs.get("opendrs")
    peers = {p: runs.get(p) for p in PEERS}
    out = []
    hot = min(r["hot_node_minutes"] for r in peers.values())
    out.append(
        target_line(
            ours["capacity_violations"] == 0 and ours["ping_pongs"] == 0,
            f"default: {ours['capacity_violations']} capacity violations, "
            f"{ours['ping_pongs']} ping-pongs",
        )
    )
    out.append(
        target_line(
            ours["hot_node_minutes"] <= hot,
            f"default: {ours['hot_node_minutes']:,.0f} hot node-min, the peers' fewest {hot:,.0f}",
        )
    )
    for peer, r in peers.items():
        dominated = (
            r["migrations"] <= ours["migrations"]
            and r["pct_time_above_threshold"] <= ours["pct_time_above_threshold"]
            and (
                r["migrations"] < ours["migrations"]
                or r["pct_time_above_threshold"] < ours["pct_time_above_threshold"]
            )
        )
        out.append(target_line(not dominated, f"default not dominated by {peer}"))
    for peer, r in peers.items():
        mine = runs.get(matched[peer])
        fits = mine["migrations"] <= r["migrations"]
        better = mine["pct_time_above_threshold"] < r["pct_time_above_threshold"]
        out.append(
            target_line(
                fits and better,
                f"{_label(matched[peer])} against {peer}: {mine['migrations']} migrations ≤ "
                f"{r['migrations']}? {'yes' if fits else 'no'}; above threshold "
                f"{mine['pct_time_above_threshold']:.1f} % against "
                f"{r['pct_time_above_threshold']:.1f} %",
            )
        )
    return out


def _label(key: str) -> str:
    return "default" if key == "opendrs" else key


def target_line(met: bool, text: str) -> str:
    """A target's Markdown list item: ``- met: TEXT`` or ``- **missed**: TEXT``."""
    return f"- {'met' if met else '**missed**'}: {text}"


def scenarios(seeds: Sequence[int], month: bool) -> list[tuple[str, Callable[[], Scenario]]]:
    out: list[tuple[str, Callable[[], Scenario]]] = []
    if month:
        out.append(("builtin:month", lambda: builtin_scenario("month")))
    for seed in seeds:
        out.append(
            (
                f"generated:{seed}",
                lambda seed=seed: generated_scenario(seed, DEFAULT_NODES, DEFAULT_GUESTS),
            )
        )
    return out


def seed_list(text: str) -> list[int]:
    """The seeds of a comma list (``1,2,7``), each once, in order; none for ``none``; ValueError
    when one is no whole number ≥ 0 (a generator's seed)."""
    if text.strip() == "none":
        return []
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected whole numbers separated by commas, got {text!r}") from None
    if any(seed < 0 for seed in seeds):
        raise ValueError(f"a seed is a whole number of 0 or more, got {text!r}")
    return list(dict.fromkeys(seeds))


def load_store(path: Path | None) -> dict[str, dict[str, Report]]:
    """The runs stored in ``path`` by scenario and key (none when it is None or absent);
    ValueError when it holds no such store, or when it could not be written (its folder missing
    or read-only: said now, not after the first run)."""
    if path is not None and not os.access(path.parent, os.W_OK):
        raise ValueError(f"{path}: cannot write there (its folder is missing or read-only)")
    if path is None or not path.exists():
        return {}
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it as a store of runs ({exc})") from None
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
        raise ValueError(f"{path}: not a store of runs (scenario → key → report)")
    return stored


def checked_inputs(
    parser: argparse.ArgumentParser,
    seeds: tuple[str, str],
    store: tuple[str, Path | None],
) -> tuple[list[int], dict[str, dict[str, Report]]]:
    """The seeds and the stored runs two options give (each its name and value), checked before
    any run: a bad one is the parser's one line and exit status 2."""
    (seeds_option, text), (store_option, path) = seeds, store
    try:
        listed = seed_list(text)
    except ValueError as exc:
        parser.error(f"{seeds_option}: {exc}")
    try:
        return listed, load_store(path)
    except ValueError as exc:
        parser.error(f"{store_option}: {exc}")


def save_store(path: Path | None, stored: dict[str, dict[str, Report]]) -> None:
    """Write ``stored`` to ``path`` (nothing when it is None), whole or not at all: written
    beside it, then put in its place, so a run stopped meanwhile leaves the store as it was."""
    if path is None:
        return
    written = path.with_name(f".{path.name}.part")
    written.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(written, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pareto", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="generated months")
    parser.add_argument("--no-month", action="store_true", help="leave out the shipped month")
    parser.add_argument("--json", type=Path, help="write every run's report here as it ends")
    parser.add_argument("--resume", action="store_true", help="reuse the runs in --json")
    parser.add_argument(
        "--again",
        action="store_true",
        help="with --resume, run opendrs's own policies again (the peers' runs are reused)",
    )
    args = parser.parse_args(argv)
    if args.resume and args.json is None:
        parser.error("--resume needs --json")
    store = args.json if args.resume else None
    seeds, stored = checked_inputs(parser, ("--seeds", args.seeds), ("--json", store))
    if args.again:
        stored = {
            label: {k: r for k, r in runs.items() if k in PEERS} for label, runs in stored.items()
        }

    def save() -> None:
        save_store(args.json, stored)

    logging.getLogger("opendrs").setLevel(logging.ERROR)  # the simulated faults' warnings
    for label, build in scenarios(seeds, not args.no_month):
        scenario = build()
        runs = Runs(label, partial(run, scenario), stored.setdefault(label, {}), save)
        print(f"#### {label}\n")
        print("\n".join(table(runs)) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
