"""Migration windows through the commands, each a subprocess: ``opendrs run`` against the
simulator starts no balancing migration outside its window, and no more of a plan once the
window closes (those in flight end); ``opendrs simulate`` of a scenario with a window reports
none started outside it. The simulated clock starts at 1970-01-01 00:00 UTC, a Thursday."""

from __future__ import annotations

import json
from pathlib import Path

from daemon import opendrs, write_sim_config

HOUR = 3600.0


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_daemon_starts_balancing_only_within_its_window(tmp_path: Path) -> None:
    # Thursday 06:00-06:01: the plan made at 06:00 moves guests one at a time, 20 s or more
    # each; when the window closes the one in flight ends, the rest of the plan is skipped.
    config = write_sim_config(tmp_path, days=0.5)
    config.write_text(
        config.read_text().replace(
            "policy: {interval: 5m, hold: 1, smoothing: 0}",
            "policy: {interval: 5m, hold: 1, smoothing: 0, max_parallel: 1,\n"
            "         windows: ['Thu 06:00-06:01'], timezone: UTC}",
        )
    )
    done = opendrs("run", "--config", str(config), timeout=300)
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "decisions.jsonl")
    decisions = {r["id"]: r for r in records if r["kind"] == "decision"}
    starts = [r for r in records if r["kind"] == "migration" and r["event"] == "started"]
    balancing = [r for r in starts if decisions[r["decision"]]["action"] == "plan"]
    assert balancing, "the window opened on an imbalance: a plan started"
    assert all(6 * HOUR <= float(r["at"]) < 6 * HOUR + 60 for r in balancing)  # type: ignore[arg-type]
    before = [d for d in decisions.values() if float(d["at"]) < 6 * HOUR]  # type: ignore[arg-type]
    assert before and all(d["code"] == "outside-window" for d in before)
    assert "next opens Thu 06:00" in str(before[0]["reason"])
    planned = next(d for d in decisions.values() if d["action"] == "plan")
    assert len(planned["moves"]) > len(balancing)  # type: ignore[arg-type]
    assert "outside the migration window Thu 06:00-06:01 UTC now: no more of the plan starts" in (
        done.stderr
    )
    # Every migration that started ended: none was aborted when the window closed.
    ended = {r["id"] for r in records if r["kind"] == "migration" and r["event"] != "started"}
    assert {r["id"] for r in starts} <= ended
    # Status, at the history's last time (Thursday noon): closed, and when it opens next.
    status = opendrs("status", "--config", str(config), timeout=120)
    assert status.returncode == 0, status.stderr
    assert (
        "  balance: closed now (outside the migration window Thu 06:00-06:01 UTC); next opens "
        "1970-01-08 06:00\n"
    ) in status.stdout
    shown = json.loads(
        opendrs("status", "--config", str(config), "--format", "json", timeout=120).stdout
    )
    balance = shown["windows"]["now"]["balance"]
    assert balance["open"] is False and balance["opens"] == 7 * 86400 + 6 * HOUR


def test_a_bad_window_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = write_sim_config(tmp_path, days=0.1)
    config.write_text(
        config.read_text().replace(
            "smoothing: 0}", "smoothing: 0, windows: ['Mon-Fri 22-06'], timezone: UTC}"
        )
    )
    done = opendrs("run", "--config", str(config), timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {config}: policy.windows[0]: 'Mon-Fri 22-06': expected 'DAYS HH:MM-HH:MM' "
        "(DAYS: Mon, Mon-Fri, Sat,Sun or daily)"
    ]


def test_simulate_starts_no_balancing_migration_outside_the_window(tmp_path: Path) -> None:
    policy = tmp_path / "nightly.yaml"
    policy.write_text(
        "policy:\n  name: nightly\n  windows: ['daily 22:00-02:00']\n  timezone: Europe/Berlin\n"
    )
    done = opendrs(
        "simulate", "builtin:demo", "--days", "2", "--policy", f"{policy},opendrs", "--format",
        "json", "--no-progress", "--report", str(tmp_path / "report.html"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    nightly, plain = json.loads(done.stdout)
    assert nightly["windows"] == (
        "balance may start migrations only within daily 22:00-02:00 (Europe/Berlin)"
    )
    assert plain["windows"] is None and plain["balancing_outside_windows"] == 0
    starts = nightly["balancing_starts"]
    assert starts and nightly["balancing_outside_windows"] == 0
    # Read apart from opendrs: 22:00-02:00 in Berlin in January is 21:00-01:00 UTC.
    assert all(t % 86400 >= 21 * HOUR or t % 86400 < 1 * HOUR for t in starts)
    # The report lists them.
    page = (tmp_path / "report.html").read_text()
    assert (
        "Migration windows of nightly: balance may start migrations only within daily "
        "22:00-02:00 (Europe/Berlin); balancing migrations started outside them: 0."
    ) in page
    assert "nightly: balancing may start" in page  # the windows shaded on the spread chart
    # The unrestricted policy starts at once, outside those hours.
    assert any(1 * HOUR <= t % 86400 < 21 * HOUR for t in plain["balancing_starts"])
