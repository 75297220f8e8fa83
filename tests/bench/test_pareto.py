"""bench.pareto: budgets matched to each peer, tables and targets (on made-up reports)."""

from __future__ import annotations

from typing import Any

from bench.pareto import Runs, _budget_of, matched_budget, table


def _report(migrations: int, above: float, hot: float = 0.0, repairs: int = 0) -> dict[str, Any]:
    return {
        "days": 10.0,
        "migrations": migrations,
        "repair_migrations": repairs,
        "balancing_migrations": migrations - repairs,
        "pct_time_above_threshold": above,
        "hot_node_minutes": hot,
        "capacity_violations": 0,
        "ping_pongs": 0,
        "wall_seconds": 1.0,
    }


def _runs(reports: dict[str, dict[str, Any]], per: int = 10) -> tuple[Runs, list[str]]:
    asked: list[str] = []

    def run(key: str) -> dict[str, Any]:
        asked.append(key)
        if key.startswith("budget "):
            budget = _budget_of(key)  # 5 repairs, and ``per`` per unit of budget
            return _report(5 + round(per * budget), 90.0 - budget, repairs=5)
        return reports[key]

    return Runs("test", run, {}, lambda: None), asked


PEERS = {
    "opendrs": _report(120, 40.0, repairs=5),
    "proxmox": _report(30, 99.0, hot=50.0),
    "incus": _report(900, 60.0, hot=10.0),
    "proxlb": _report(100, 95.0, hot=0.0),
}


def test_the_budget_is_the_largest_found_that_keeps_within_the_peer() -> None:
    runs, asked = _runs(PEERS)
    # proxmox: 30 in 10 days, 5 of them repairs: 2 a day fits (25), searched from there.
    assert matched_budget(runs, "proxmox") == "budget 2"
    # incus makes more than opendrs's default: its share, 89 a day, buys a faster reaction, and
    # the budget found (89: 895 ≤ 900; 90: 905) is above the threshold less than the default.
    assert matched_budget(runs, "incus") == "budget 89"
    assert matched_budget(runs, "proxlb") == "budget 9"
    assert asked.count("opendrs") == 1  # every run once


def test_the_search_goes_down_until_it_fits() -> None:
    # A budget spent more fully than 24 h at a time: 2 a day makes 29 > 25, then 1 fits.
    reports = dict(PEERS, proxmox=_report(25, 99.0))
    runs, asked = _runs(reports, per=12)
    assert matched_budget(runs, "proxmox") == "budget 1"
    assert asked == ["proxmox", "opendrs", "budget 2", "budget 1"]
    runs, asked = _runs(dict(PEERS, proxmox=_report(4, 99.0)))
    assert matched_budget(runs, "proxmox") == "budget 0"  # the repairs alone are more


def test_table_and_targets() -> None:
    runs, _ = _runs(PEERS)
    lines = table(runs)
    assert lines[0].startswith("| policy | budget per 24 h | migrations |")
    assert "| **opendrs** | none | 120 | 115 | 40.0 % | 0 | 0 | 0 |" in lines
    assert "| opendrs | 89 (≤ incus) | 895 | 890 | 1.0 % | 0 | 0 | 0 |" in lines
    assert "| opendrs | 2 (≤ proxmox) | 25 | 20 | 88.0 % | 0 | 0 | 0 |" in lines
    assert "- met: default: 0 hot node-min, the peers' fewest 0" in lines
    assert "- met: default not dominated by proxlb" in lines
    assert any(line.startswith("- met: budget 2 against proxmox: 25 migrations") for line in lines)
    assert any(line.startswith("- met: budget 9 against proxlb: 95 migrations") for line in lines)
    runs, _ = _runs(dict(PEERS, proxlb=_report(100, 30.0)))
    lines = table(runs)
    assert "- **missed**: default not dominated by proxlb" in lines


def test_the_search_goes_up_while_it_fits_a_few_budgets_at_most() -> None:
    # 5 per unit of budget: 2 a day makes 15 of proxmox's 30; 3, 4 and 5 fit too (5: 30).
    runs, asked = _runs(PEERS, per=5)
    assert matched_budget(runs, "proxmox") == "budget 5"
    assert asked[-4:] == ["budget 2", "budget 3", "budget 4", "budget 5"]
    # No more than three above the first that fits.
    runs, asked = _runs(dict(PEERS, proxmox=_report(60, 99.0)), per=5)
    assert matched_budget(runs, "proxmox") == "budget 8"


def test_below_one_a_day_the_search_tries_fractions() -> None:
    # 10 per unit of budget: 1 a day makes 15 of proxmox's 9; one in 2 days 10; in 3 days 8.
    runs, asked = _runs(dict(PEERS, proxmox=_report(9, 99.0)))
    assert matched_budget(runs, "proxmox") == "budget 1/3"
    assert asked[-3:] == ["budget 1", "budget 1/2", "budget 1/3"]
    lines = table(runs)
    assert "| opendrs | 1/3 (≤ proxmox) | 8 | 3 | 89.7 % | 0 | 0 | 0 |" in lines
    assert any(line.startswith("- met: budget 1/3 against proxmox: 8 migrations") for line in lines)


def test_a_fraction_found_by_a_jump_is_searched_back_down() -> None:
    # 100 per unit: 1 a day makes 105 of 30, so one in 4 days is tried next (30, fits), then
    # one in 3 days (38, does not).
    runs, asked = _runs(dict(PEERS, proxmox=_report(30, 99.0)), per=100)
    assert matched_budget(runs, "proxmox") == "budget 1/4"
    assert asked[-3:] == ["budget 1", "budget 1/4", "budget 1/3"]


def test_under_the_peer_the_default_stands_unless_a_budget_buys_more() -> None:
    # The default (120) makes fewer migrations than incus (900). With a budget that is above
    # the threshold more of the time than the default, the default is the match.
    def worse(key: str) -> dict[str, Any]:
        if key.startswith("budget "):
            return _report(5 + round(10 * _budget_of(key)), 50.0, repairs=5)
        return PEERS[key]

    runs = Runs("test", worse, {}, lambda: None)
    assert matched_budget(runs, "incus") == "opendrs"
    # 13 a day makes more than proxlb's 130; 12 fits (125) but is above the threshold 78 % of
    # the time against the default's 40 %.
    runs, asked = _runs(dict(PEERS, proxlb=_report(130, 95.0)))
    assert matched_budget(runs, "proxlb") == "opendrs"
    assert asked == ["proxlb", "opendrs", "budget 12", "budget 13"]
    # A peer's share of 4 a day or fewer buys no faster reaction (the default's six-hour
    # smoothing): no budget is tried.
    runs, asked = _runs(dict(PEERS, opendrs=_report(40, 40.0, repairs=5), proxlb=_report(45, 95.0)))
    assert matched_budget(runs, "proxlb") == "opendrs"
    assert asked == ["proxlb", "opendrs"]
