"""``opendrs run`` driven from outside, as an operator drives it: a subprocess against the fake
Proxmox API on loopback, with signals and reloads. Migrations take about two seconds each."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import (
    TOKEN_SECRET,
    FakeCluster,
    proxmox_config,
    running_on_pve1,
    three_nodes,
)
from daemon import Daemon


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes, eight running VMs all on pve1: any balancer plans about five moves."""
    cluster = three_nodes(str(tmp_path))
    cluster.pve.migrate_secs = 200  # two seconds of real time
    running_on_pve1(cluster.pve, range(100, 108))
    try:
        yield cluster
    finally:
        cluster.stop()


def write_config(
    tmp_path: Path,
    fake: FakeCluster,
    *,
    mode: str = "active",
    token: str = TOKEN_SECRET,
    extra: str = "",
) -> Path:
    return proxmox_config(tmp_path, fake, mode=mode, token=token, extra=extra)


def migration_requests(fake: FakeCluster) -> int:
    return len(fake.pve.migrations)


def history_rows(tmp_path: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute("SELECT guest, outcome FROM migrations ORDER BY id").fetchall()


def test_shadow_on_the_command_line_survives_a_reload(tmp_path: Path, fake: FakeCluster) -> None:
    config = write_config(tmp_path, fake, mode="active")
    with Daemon(config, "--shadow") as daemon:
        daemon.wait_for(r"shadow: would migrate")
        daemon.signal(signal.SIGHUP)
        mark = daemon.mark
        daemon.wait_for(r"configuration reloaded .*mode shadow", after=mark)
        # Cycles after the reload still only say what they would do.
        daemon.wait_for(r"shadow: would migrate", after=daemon.mark)
        daemon.wait_for(r"shadow: would migrate", after=daemon.mark)
        assert daemon.stop() == 0
    assert migration_requests(fake) == 0
    assert history_rows(tmp_path) == []


def test_a_reload_to_shadow_during_a_plan_starts_nothing_more(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, mode="active")
    with Daemon(config) as daemon:
        daemon.wait_for(r"started (?:\S+ \()?\d+\)? pve1 → ")
        write_config(tmp_path, fake, mode="shadow")
        daemon.signal(signal.SIGHUP)
        daemon.wait_for(r"configuration reloaded .*mode shadow")
        started = daemon.count(r"started (?:\S+ \()?\d+\)? pve1 → ")
        requests = migration_requests(fake)
        assert requests == started <= 2
        daemon.wait_for(r"skipped .*changed to shadow mode")
        # The migration in flight is followed to its end and recorded; nothing else starts.
        daemon.wait_for(r"done (?:\S+ \()?\d+\)? pve1 → ")
        daemon.wait_for(r"shadow: would migrate", after=daemon.mark)
        assert migration_requests(fake) == requests
        assert daemon.stop() == 0
    assert [outcome for _, outcome in history_rows(tmp_path)] == ["done"] * requests


def test_once_exits_with_status_1_when_it_cannot_observe(tmp_path: Path, fake: FakeCluster) -> None:
    config = write_config(tmp_path, fake, token="00000000-0000-0000-0000-000000000000")
    with Daemon(config, "--once") as daemon:
        status = daemon.wait(60)
        assert status == 1, daemon.log()
        errors = [line for line in daemon.lines if line.startswith("error:")]
        assert len(errors) == 1 and "authentication failed" in errors[0]
        assert TOKEN_SECRET not in daemon.log()


def test_failed_observations_in_a_row_are_reported_at_error(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(
        tmp_path,
        fake,
        token="00000000-0000-0000-0000-000000000000",
        extra="log: {failed_observations: 2}\n",
    )
    with Daemon(config) as daemon:
        daemon.wait_for(r"WARNING +cannot observe the cluster: ")
        daemon.wait_for(r"ERROR +cannot observe the cluster \(2 in a row\)")
        assert daemon.stop() == 0


def test_a_history_from_a_newer_opendrs_exits_with_the_lasting_status(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake)
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        db.execute("PRAGMA application_id = 1868853875")
        db.execute("PRAGMA user_version = 99")
    with Daemon(config) as daemon:
        assert daemon.wait(30) == 3
        assert "newer than this opendrs" in daemon.log()
    assert migration_requests(fake) == 0


def test_a_lock_path_that_is_a_link_is_refused_and_its_target_kept(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake)
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    os.symlink(precious, tmp_path / "history.sqlite.lock")
    with Daemon(config) as daemon:
        assert daemon.wait(30) == 3
        assert "symbolic link" in daemon.log()
    assert precious.read_text() == "keep me\n"


def test_the_decision_log_against_proxmox_has_every_migration_and_no_secret(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = write_config(tmp_path, fake, extra="log: {decisions: decisions.jsonl}\n")
    with Daemon(config) as daemon:
        daemon.wait_for(r"done (?:\S+ \()?\d+\)? pve1 → ", timeout=60)
        assert daemon.stop() == 0
    text = (tmp_path / "decisions.jsonl").read_text()
    assert TOKEN_SECRET not in text and fake.address not in text
    items = [json.loads(line) for line in text.splitlines()]
    ended = {o["id"]: o["outcome"] for o in items if o["kind"] == "migration" and o["outcome"]}
    assert ended and {i: o for i, o in ended.items() if o} == {
        i: o for i, (_, o) in enumerate(history_rows(tmp_path), 1) if o is not None
    }
    started = [o for o in items if o.get("event") == "started"]
    assert started and all(o["handle"].startswith("UPID:pve1:") for o in started)
