"""Hot spots by default (issue #30, item 5): opendrs's default policy against every emulated peer.

``python -m bench.hotspots [--seeds 1,89,97] [--no-month] [--store FILE] [--markdown FILE]``, also a
stage of ``python -m bench`` (``--hot-months``, ``--hot-seeds``, ``--hot-store``).

For each scenario — the built-in month (``builtin:month``) and the 30-day months of ``opendrs
simulate --generate SEED`` for each seed — opendrs's default policy and the emulated peers
(``proxmox``, ``incus``, ``proxlb``) run over the whole month, one simulation at a time, each on a
fresh simulator, as :mod:`bench.pareto` runs them (``opendrs.cli.simulate.run_policy``: the same
reports as ``opendrs simulate --policy NAME --format json``). Per scenario and policy: the hot
node-minutes, those of the node with the most, ping-pongs, migrations and capacity violations.
The target is met on a scenario when opendrs's hot node-minutes are the fewest of every policy
(a tie counts as the fewest) and it makes no ping-pong; an overall line says on how many.

Each run is printed on standard error as it ends. With ``--store FILE`` every run's report is
written there as it ends and the runs already there are reused, so an interrupted measurement goes
on where it stopped (the file is ``python -m bench.pareto --json``'s: one serves both); delete it
after a change to opendrs's policy or to the simulator.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from bench.pareto import (
    PEERS,
    Report,
    Runs,
    checked_inputs,
    save_store,
    scenarios,
    target_line,
)
from bench.pareto import run as run_one
from bench.report import emit
from opendrs.backends.scenario import Scenario

#: opendrs's default policy first, then every emulated peer (``opendrs simulate --policy``).
POLICIES: tuple[str, ...] = ("opendrs", *PEERS)
#: Generated months run by default (``--hot-seeds``), beside the built-in month: seed 1, the one
#: the target was last missed on, and 89 and 97, never looked at before their first measurement.
SEEDS: tuple[int, ...] = (1, 89, 97)
#: The table's columns: heading and the report's key.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("hot node-min", "hot_node_minutes"),
    ("worst node", "max_hot_minutes_per_node"),
    ("ping-pongs", "ping_pongs"),
    ("migrations", "migrations"),
    ("capacity violations", "capacity_violations"),
)


@dataclass(frozen=True)
class HotMonth:
    """One scenario's runs: each policy's report (``opendrs``'s first), by policy."""

    scenario: str
    reports: dict[str, Report]

    @property
    def fewest(self) -> float:
        """The fewest hot node-minutes of every policy run, opendrs's included."""
        return min(r["hot_node_minutes"] for r in self.reports.values())

    @property
    def met(self) -> bool:
        """opendrs's hot node-minutes the fewest of every policy (ties too), and 0 ping-pongs."""
        ours = self.reports["opendrs"]
        return ours["hot_node_minutes"] <= self.fewest and ours["ping_pongs"] == 0

    def verdict(self) -> str:
        """The target's line for this scenario."""
        ours = self.reports["opendrs"]
        peers = ", ".join(
            f"{name} {r['hot_node_minutes']:,.0f}"
            for name, r in self.reports.items()
            if name != "opendrs"
        )
        return target_line(
            self.met,
            f"{self.scenario}: opendrs {ours['hot_node_minutes']:,.0f} hot node-min ({peers}), "
            f"{ours['ping_pongs']} ping-pongs",
        )

    def as_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "met": self.met, "reports": self.reports}


def overall(months: Sequence[HotMonth]) -> str:
    """The target's line over every scenario: met when met on each."""
    missed = [m.scenario for m in months if not m.met]
    text = f"on {len(months) - len(missed)} of {len(months)} scenarios"
    if missed:
        text += f" (missed on {', '.join(missed)})"
    return target_line(bool(months) and not missed, f"every scenario: {text}")


@contextmanager
def _quiet() -> Iterator[None]:
    """opendrs's logs held back while the simulations run, as ``opendrs simulate --no-progress``
    holds them: the simulated faults' warnings and errors (``cannot observe the cluster (3 in a
    row): simulated API error…``), dozens a month, would drown each run's line."""
    logger = logging.getLogger("opendrs")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def run(
    builds: Sequence[tuple[str, Callable[[], Scenario]]],
    stored: dict[str, dict[str, Report]],
    store: Path | None = None,
) -> list[HotMonth]:
    """Every policy of :data:`POLICIES` on each scenario of ``builds`` (label, how to build it),
    one at a time: the runs in ``stored`` (:func:`bench.pareto.load_store`) reused, each new one
    added to it and, with ``store``, the whole written there as it ends."""
    months = []
    with _quiet():
        for label, build in builds:
            scenario = cache(build)  # built once, and only when a run is not in the store

            def run_policy(key: str, scenario: Callable[[], Scenario] = scenario) -> Report:
                return run_one(scenario(), key)

            runs = Runs(
                label, run_policy, stored.setdefault(label, {}), lambda: save_store(store, stored)
            )
            months.append(HotMonth(label, {key: runs.get(key) for key in POLICIES}))
    return months


def section(months: Sequence[HotMonth]) -> str:
    """The runs as a Markdown section: one row per scenario and policy, then the targets."""
    hot = next((m.reports["opendrs"]["hot"] for m in months), 0.85)
    lines = [
        "### Hot spots by default (issue #30, item 5)",
        "",
        "opendrs's default policy and every emulated peer over each scenario's whole month, one "
        f"simulation at a time. *Hot node-min*: minutes a node is above {100 * hot:g} % of its "
        "CPU or memory net of reserves (5-minute average), summed over the nodes; *worst node*: "
        "those of the node with the most. The target: opendrs's hot node-minutes the fewest of "
        "every policy (a tie counts) and 0 ping-pongs.",
        "",
        "| scenario | policy | " + " | ".join(head for head, _key in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    for month in months:
        for name, report in month.reports.items():
            shown = "**opendrs**" if name == "opendrs" else name
            cells = " | ".join(f"{report[key]:,.0f}" for _head, key in COLUMNS)
            lines.append(f"| {month.scenario} | {shown} | {cells} |")
    lines += ["", *(m.verdict() for m in months), overall(months)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hotspots", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--seeds",
        default=",".join(map(str, SEEDS)),
        metavar="N,N,…",
        help="generated months (default %(default)s; 'none' for the built-in month alone)",
    )
    parser.add_argument("--no-month", action="store_true", help="leave out the built-in month")
    parser.add_argument(
        "--store",
        type=Path,
        metavar="FILE",
        help="write each run's report here as it ends; reuse the runs already there",
    )
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    seeds, stored = checked_inputs(parser, ("--seeds", args.seeds), ("--store", args.store))
    if not seeds and args.no_month:
        parser.error("no scenario: --no-month with --seeds none")
    months = run(scenarios(seeds, not args.no_month), stored, args.store)
    emit(section(months), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
