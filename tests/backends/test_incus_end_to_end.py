"""``opendrs run --once`` and ``opendrs snapshot`` as subprocesses against a fake Incus API on a
unix socket: shadow, active, leader-only and Incus's own balancer settings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import FakeIncus, GiB, Served, socket_path
from backends.incus_fixture import history, opendrs, packed
from daemon import Daemon, eventually
from opendrs.model import snapshot

VMS = [f"vm{i}" for i in range(1, 7)]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    incus = packed(FakeIncus("m1"), VMS)
    incus.migration_seconds = 0.1
    server = Served(incus, socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def write_config(
    tmp_path: Path, server: Served, *, mode: str, backend: str = "", extra: str = ""
) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        "version: 1\n"
        f"mode: {mode}\n"
        f"backend: {{type: incus, socket: {server.socket}, timeout: 5s{backend}}}\n"
        "history: history.sqlite\n"
        "executor: {max_parallel: 2, poll_interval: 1s}\n"
        "log: {level: debug}\n" + extra
    )
    return path


def placement(server: Served) -> dict[str, str]:
    return {name: server.fake.instance(name).location for name in VMS}


def moves_posted(server: Served) -> int:
    return sum(
        1
        for r in server.fake.requests
        if r[0] == "POST" and r[1] in {f"/1.0/instances/{n}" for n in VMS}
    )


def test_shadow_decides_and_moves_nothing(tmp_path: Path, fake: Served) -> None:
    result = opendrs("run", "--config", str(write_config(tmp_path, fake, mode="shadow")), "--once")
    assert result.returncode == 0, result.stderr
    (row,) = history(tmp_path, "SELECT mode, action, moves FROM decisions")
    assert row[0] == "shadow" and row[1] != "none" and row[2] >= 2
    assert "shadow: would migrate" in result.stderr
    assert moves_posted(fake) == 0
    assert set(placement(fake).values()) == {"m1"}


def test_active_moves_live_and_records_the_moves(tmp_path: Path, fake: Served) -> None:
    result = opendrs("run", "--config", str(write_config(tmp_path, fake, mode="active")), "--once")
    assert result.returncode == 0, result.stderr
    rows = history(tmp_path, "SELECT guest, source, target, outcome FROM migrations")
    assert len(rows) >= 2 and all(r[3] == "done" for r in rows), rows
    where = placement(fake)
    for guest, _, target, _ in rows:
        assert where[str(guest)] == target
        assert "volatile.rebalance.last_move" in fake.fake.instance(str(guest)).config
    assert len({where[g] for g in VMS}) == 3
    posted = [
        r for r in fake.fake.requests if r[0] == "POST" and r[1].startswith("/1.0/instances/")
    ]
    assert all(r[3]["live"] is True for r in posted)


def test_a_failed_move_is_recorded_and_worked_around(tmp_path: Path, fake: Served) -> None:
    for name in VMS:
        fake.fake.instance(name).move_error = "Migration failed: target refused the memory"
    result = opendrs("run", "--config", str(write_config(tmp_path, fake, mode="active")), "--once")
    assert result.returncode == 0, result.stderr
    rows = history(tmp_path, "SELECT outcome, error FROM migrations")
    assert rows and all(r[0] == "failed" for r in rows)
    assert any("target refused the memory" in str(r[1]) for r in rows)
    assert set(placement(fake).values()) == {"m1"}


def test_leader_only_stays_idle_on_other_members(tmp_path: Path, fake: Served) -> None:
    fake.fake.set_leader("m2")
    config = write_config(tmp_path, fake, mode="active", backend=", leader_only: true")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert "standing by: member m1 is not the database leader (m2): idle" in result.stderr
    assert history(tmp_path, "SELECT * FROM decisions") == []
    assert moves_posted(fake) == 0
    fake.fake.set_leader("m1")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert moves_posted(fake) >= 2


def test_incus_balancer_settings_become_the_policy_and_warn(tmp_path: Path, fake: Served) -> None:
    fake.fake.config.update({"cluster.rebalance.interval": "15", "cluster.rebalance.batch": "1"})
    # The policy section's own keys win: a margin of 0 lets a single move through.
    config = write_config(tmp_path, fake, mode="active", extra="policy: {margin: 0, batch: 5}\n")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert "Incus's own balancer is enabled (cluster.rebalance.interval=15)" in result.stderr
    assert "from the platform's settings: policy interval = 900" in result.stderr
    assert "policy batch" not in result.stderr
    assert len(history(tmp_path, "SELECT * FROM migrations")) >= 2
    # Without a policy section the server's batch of 1 holds: one move, or none for the margin.
    (tmp_path / "history.sqlite").unlink()
    config = write_config(tmp_path, fake, mode="shadow")
    result = opendrs("run", "--config", str(config), "--once")
    assert "from the platform's settings: policy batch = 1" in result.stderr
    assert "with 1 migration" in result.stderr


def test_snapshot_of_the_incus_cluster(tmp_path: Path, fake: Served) -> None:
    result = opendrs("snapshot", "--config", str(write_config(tmp_path, fake, mode="active")))
    assert result.returncode == 0, result.stderr
    live = snapshot.loads(result.stdout, filename="live.yaml")
    assert [(n.name, n.cpu, n.memory) for n in live.nodes] == [
        (name, 16.0, 64 * GiB) for name in ("m1", "m2", "m3")
    ]
    assert [g.id for g in live.guests] == VMS
    assert moves_posted(fake) == 0


def test_a_bad_backend_section_exits_2(tmp_path: Path, fake: Served) -> None:
    config = write_config(tmp_path, fake, mode="shadow", backend=", project: 'a b'")
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 2
    assert "backend.project: not a project name" in result.stderr
    assert "Traceback" not in result.stderr


def test_moves_incus_recorded_start_a_cooldown(tmp_path: Path, fake: Served) -> None:
    for name in VMS:
        fake.fake.instance(name).config["volatile.rebalance.last_move"] = str(int(time.time()) - 60)
    result = opendrs("run", "--config", str(write_config(tmp_path, fake, mode="active")), "--once")
    assert result.returncode == 0, result.stderr
    assert moves_posted(fake) == 0
    ((action, reason),) = history(tmp_path, "SELECT action, reason FROM decisions")
    assert action == "none" and "cooldown" in str(reason), reason


def leader_only_daemon_config(tmp_path: Path, server: Served, *, max_parallel: int = 2) -> Path:
    """Active, ``leader_only``, a decision every second (for ``opendrs run`` as a daemon)."""
    config = write_config(
        tmp_path,
        server,
        mode="active",
        backend=", leader_only: true",
        extra="policy: {interval: 1s, hold: 1, smoothing: 0}\n",
    )
    text = config.read_text().replace("max_parallel: 2", f"max_parallel: {max_parallel}")
    config.write_text(text)
    return config


def test_one_daemon_idles_while_another_member_leads_and_acts_again(
    tmp_path: Path, fake: Served
) -> None:
    """``opendrs run`` as an operator runs it, leadership moving between cycles: idle while m2
    leads (nothing decided, nothing moved), acting again when m1 leads once more."""
    fake.fake.set_leader("m2")
    config = leader_only_daemon_config(tmp_path, fake)
    idle = r"standing by: member m1 is not the database leader \(m2\): idle"
    with Daemon(config) as daemon:
        daemon.wait_for(idle)
        # Some more cycles while m2 leads: still idle, and the standby is logged only once.
        eventually(lambda: len(fake.fake.calls("GET", "/1.0/cluster/members")) >= 4)
        assert daemon.count("standing by") == 1
        assert daemon.count(r"decision \(") == 0 and moves_posted(fake) == 0
        assert history(tmp_path, "SELECT * FROM decisions") == []
        fake.fake.set_leader("m1")
        mark = daemon.mark
        daemon.wait_for("acting again: this instance may act on the cluster", after=mark)
        daemon.wait_for(r"decision \(active\)", after=mark)
        eventually(lambda: moves_posted(fake) >= 2)
        # Leadership lost again: idle again, whatever is left to decide.
        fake.fake.set_leader("m3")
        daemon.wait_for(r"standing by: member m1 is not the database leader \(m3\)", after=mark)
        assert daemon.stop() == 0
    assert len(history(tmp_path, "SELECT * FROM decisions WHERE action != 'none'")) >= 1
    assert len({fake.fake.instance(name).location for name in VMS}) >= 2


def test_a_member_that_stops_leading_mid_plan_starts_no_more_of_it(
    tmp_path: Path, fake: Served
) -> None:
    """Leadership moves on while the plan runs (one migration at a time): the migration in flight
    is followed to its end, the rest of the queue is skipped — the new leader decides now."""
    fake.fake.migration_seconds = 1.5
    config = leader_only_daemon_config(tmp_path, fake, max_parallel=1)
    with Daemon(config) as daemon:
        eventually(lambda: moves_posted(fake) >= 1)
        fake.fake.set_leader("m3")
        skipped = daemon.wait_for(r"skipped vm\d .*not the database leader \(m3\)")
        daemon.wait_for(r"done vm\d m1 → m[23]")
        # Some more cycles and executor ticks: nothing more starts or is decided.
        eventually(lambda: len(fake.fake.calls("GET", "/1.0/cluster/members")) >= 12)
        assert daemon.count(r"decision \(") == 1 and daemon.count(r"done vm\d") == 1, skipped
        assert daemon.count("standing by") == 1
        assert daemon.stop() == 0
    assert moves_posted(fake) == 1
    assert [r[0] for r in history(tmp_path, "SELECT outcome FROM migrations")] == ["done"]
