"""The executor as ``opendrs run`` drives it (active, a subprocess against the fake Proxmox API on
loopback). The wall clock stepped while it follows a migration: durations are measured on the
monotonic clock, so a forward step longer than ``executor.timeout`` does not make the migration
"time out" (and opendrs ask the platform to stop it), nor fail a request to the HA stack the HA
manager has not acted on yet; the wall clock is still what the history records. ``run --once``
held back by a migration it did not start says what it waits for."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, proxmox_config
from daemon import Daemon, run_once, stepped_clock
from pve_daemon import fake_cluster

#: Fake seconds a migration takes: 6 s of real time at the fake's scale (0.01).
MIGRATION = 600


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path, vms=2) as cluster:
        cluster.pve.migrate_secs = MIGRATION
        yield cluster


def _one_migration_across_a_forward_step(tmp_path: Path, fake: FakeCluster, config: Path) -> str:
    """The log of a daemon on ``config`` whose wall clock steps two hours forward once it has
    started a migration from pve1, stopped when that migration is done (the guest has moved)."""
    env, stepped = stepped_clock(tmp_path, -7200)
    with Daemon(config, env=env) as daemon:
        started = daemon.wait_for(r"started vm\d \(\d+\) pve1 → pve\d", timeout=60)
        stepped.touch()
        guest = started.split("started ")[1].split(" ")[0]
        daemon.wait_for(rf"done {guest} \(\d+\) pve1 → pve\d in ", timeout=60)
        assert daemon.stop() == 0
    vm = next(v for v in fake.pve.vms if v.name == guest)
    assert vm.node != "pve1"
    return daemon.log()


def test_a_clock_stepped_forward_past_the_timeout_does_not_stop_a_migration_in_flight(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = proxmox_config(
        tmp_path, fake, mode="active", executor="{max_parallel: 1, poll_interval: 1s, timeout: 1h}"
    )
    log = _one_migration_across_a_forward_step(tmp_path, fake, config)
    assert "timed out" not in log and "asked to stop" not in log, log
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        rows = db.execute("SELECT outcome, started, ended FROM migrations ORDER BY id").fetchall()
    outcome, began, ended = rows[0]
    # The history keeps the wall clock: the migration ended two hours "after" it began.
    assert outcome == "done" and ended - began >= 7200, rows


def test_a_clock_stepped_forward_does_not_fail_a_request_to_the_ha_stack_in_flight(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """The HA manager acts on a request 6 s after it (600 fake seconds); meanwhile the wall
    clock steps two hours forward. The HA manager's 5 minutes to start are measured on the
    monotonic clock: the request is followed to its task and the guest moves."""
    for vm in fake.pve.vms:
        vm.ha_state = "started"
    fake.pve.ha_delay = MIGRATION
    log = _one_migration_across_a_forward_step(
        tmp_path, fake, proxmox_config(tmp_path, fake, mode="active")
    )
    assert "the HA manager did not start moving" not in log, log
    assert "asked the HA manager to migrate" in log, log


def test_run_once_says_once_what_migration_it_did_not_start_it_waits_for(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """An operator's ``qm migrate`` in flight fills ``max_parallel`` (1): ``run --once`` waits
    for it, and says so in one line instead of waiting silently."""
    fake.run(fake.pve.migrate(101, "pve3", secs=MIGRATION))
    config = proxmox_config(tmp_path, fake, mode="active")
    result = run_once(config)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "did not start" in line]
    assert len(said) == 1, result.stderr
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    assert re.search(
        rf"INFO +waiting for migrations opendrs did not start \(they count against "
        rf"max_parallel\): vm1 \(101\) on pve1 → pve3, migrating since {stamp} at least; the "
        rf"plan waits until {stamp} at most \(executor.stall_timeout\)",
        said[0],
    ), said[0]
    assert re.search(r"started vm[023] \(10[023]\) pve1 → pve\d", result.stderr), result.stderr
