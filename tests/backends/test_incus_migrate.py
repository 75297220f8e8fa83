"""The Incus backend's moves, maintenance and leader check, against a fake Incus API."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import Served
from backends.incus_fixture import served, socket_config
from fakes import FakeClock, stepped_time
from opendrs.backends.base import Backend, BackendError, Handle, Progress
from opendrs.backends.incus import IncusBackend
from opendrs.backends.incus import migration as incus_migration
from opendrs.backends.incus.rebalance import policy_defaults
from opendrs.model.cluster import Move, Settings

__all__ = ["served"]


@pytest.fixture
def backend(served: Served) -> Iterator[IncusBackend]:
    made = IncusBackend(socket_config(served, migration_timeout=30.0), Settings())
    try:
        yield made
    finally:
        made.close()


def follow(backend: IncusBackend, handle: Handle, seconds: float = 10.0) -> Progress:
    end = time.monotonic() + seconds
    while True:
        progress = backend.poll(handle)
        if progress.finished or time.monotonic() > end:
            return progress
        time.sleep(0.05)


def test_it_is_a_backend(backend: IncusBackend) -> None:
    assert isinstance(backend, Backend)


def test_a_running_vm_moves_live(served: Served, backend: IncusBackend) -> None:
    # Long enough for an observation on a loaded machine to see it in flight.
    served.fake.migration_seconds = 1.5
    cluster = backend.observe()
    assert cluster.guest("vm1").node == "m1"
    handle = backend.start_migration(Move("vm1", "m1", "m2"))
    (post,) = served.fake.calls("POST", "/1.0/instances/vm1")
    assert post[2] == {"target": "m2", "project": "default"}
    assert post[3] == {"name": "vm1", "migration": True, "live": True}
    # In flight: the observation counts it on both members.
    assert backend.observe().guest("vm1").migrating_to == "m2"
    # Incus moves it live (migration_vm_live): the guest ran throughout.
    assert follow(backend, handle) == Progress("done")
    vm1 = served.fake.instance("vm1")
    assert vm1.location == "m2"
    assert abs(int(vm1.config["volatile.rebalance.last_move"]) - time.time()) < 5
    assert backend.last_moves() == {}
    backend.observe()
    assert set(backend.last_moves()) == {"vm1"}


def test_a_live_move_made_by_a_stateful_stop_and_start_tells_its_downtime(
    served: Served, backend: IncusBackend, caplog: pytest.LogCaptureFixture
) -> None:
    # LXD 5.0 has no migration_vm_live: it makes a live move of a running VM by a stateful stop,
    # copy and start; the guest does not run for the operation's time.
    served.fake.flavour = "lxd"
    served.fake.migration_seconds = 0.6
    caplog.set_level(logging.INFO)
    progress = follow(backend, backend.start_migration(Move("vm1", "m1", "m2")))
    assert (progress.state, progress.reason) == ("done", "by a stateful stop and start")
    assert progress.downtime is not None and 0.5 < progress.downtime < 3, progress
    assert served.fake.calls("POST", "/1.0/instances/vm1")[0][3]["live"] is True
    assert "(by a stateful stop and start: the server has no migration_vm_live)" in caplog.text
    # Asked once.
    assert follow(backend, backend.start_migration(Move("vm1", "m2", "m1"))).downtime
    assert len(served.fake.calls("GET", "/1.0")) == 1


def test_a_vm_without_stateful_migration_is_refused(backend: IncusBackend) -> None:
    backend.observe()
    with pytest.raises(BackendError, match=r"migration\.stateful is not true.*restart") as caught:
        backend.start_migration(Move("vm2", "m1", "m2"))
    assert not caught.value.transient


def test_a_failed_move_says_why_in_one_line(served: Served, backend: IncusBackend) -> None:
    served.fake.instance("vm1").move_error = "Migration failed:\nqemu: device busy"
    handle = backend.start_migration(Move("vm1", "m1", "m2"))
    progress = follow(backend, handle)
    assert progress.state == "failed"
    assert progress.reason == "the move of vm1 to m2 failed: Migration failed: qemu: device busy"
    assert served.fake.instance("vm1").location == "m1"


def test_a_move_to_an_offline_member_fails(served: Served, backend: IncusBackend) -> None:
    served.fake.members["m2"].status = "Offline"
    progress = follow(backend, backend.start_migration(Move("vm1", "m1", "m2")))
    assert progress.state == "failed" and "Failed to connect to cluster member m2" in str(
        progress.reason
    )


def test_a_refused_move_is_a_backend_error(served: Served, backend: IncusBackend) -> None:
    served.fake.fail("POST", "/1.0/instances/vm1", 400, "Instance is busy", times=1)
    with pytest.raises(BackendError, match="HTTP 400: Instance is busy"):
        backend.start_migration(Move("vm1", "m1", "m2"))


def test_an_instance_elsewhere_is_not_moved(backend: IncusBackend) -> None:
    with pytest.raises(BackendError, match=r"is not on m2 \(any more\): it is on m1"):
        backend.start_migration(Move("vm1", "m2", "m3"))
    with pytest.raises(BackendError, match="does not exist"):
        backend.start_migration(Move("ghost", "m1", "m2"))


def test_a_stopped_container_moves_cold(served: Served, backend: IncusBackend) -> None:
    handle = backend.start_migration(Move("c2", "m2", "m1"))
    assert follow(backend, handle).state == "done"
    assert served.fake.calls("POST", "/1.0/instances/c2")[0][3]["live"] is False
    assert served.fake.instance("c2").location == "m1"


def test_a_running_container_needs_restart_migration(served: Served) -> None:
    refusing = IncusBackend(socket_config(served), Settings())
    try:
        with pytest.raises(BackendError, match="allow_restart_migration"):
            refusing.start_migration(Move("c1", "m1", "m2"))
    finally:
        refusing.close()
    assert served.fake.instance("c1").status == "Running"


def test_a_running_container_moves_by_restart(served: Served) -> None:
    backend = IncusBackend(socket_config(served), Settings(allow_restart_migration=True))
    try:
        backend.observe()
        handle = backend.start_migration(Move("c1", "m1", "m2"))
        assert handle.id.startswith("restart:")
        progress = follow(backend, handle)
        assert (progress.state, progress.reason) == ("done", "by a restart")
        assert progress.downtime is not None and 0 <= progress.downtime < 5
    finally:
        backend.close()
    c1 = served.fake.instance("c1")
    assert (c1.location, c1.status) == ("m2", "Running")
    actions = [c[3]["action"] for c in served.fake.calls("PUT", "/1.0/instances/c1/state")]
    assert actions == ["stop", "start"]


def test_a_failed_restart_move_starts_the_container_again(served: Served) -> None:
    served.fake.instance("c1").move_error = "Failed to transfer the rootfs"
    backend = IncusBackend(socket_config(served), Settings(allow_restart_migration=True))
    try:
        progress = follow(backend, backend.start_migration(Move("c1", "m1", "m2")))
        time.sleep(0.3)
    finally:
        backend.close()
    assert progress.state == "failed" and "at its move: Failed to transfer" in str(progress.reason)
    c1 = served.fake.instance("c1")
    assert (c1.location, c1.status) == ("m1", "Running")


def test_a_forgotten_operation_is_settled_by_where_the_instance_is(
    served: Served, backend: IncusBackend
) -> None:
    handle = backend.start_migration(Move("vm1", "m1", "m2"))
    assert follow(backend, Handle(handle.id, handle.move, handle.started)).state == "done"
    served.fake.operations.clear()
    assert backend.poll(handle).state == "done"
    lost = Handle("no-such-operation", Move("vm1", "m1", "m3"), time.time())
    progress = backend.poll(lost)
    assert progress.state == "failed" and "is on m2, not m3" in str(progress.reason)


def test_a_lost_answer_is_found_and_cancelled(served: Served, backend: IncusBackend) -> None:
    served.fake.migration_seconds = 5.0
    move = Move("vm1", "m1", "m2")
    started = backend.start_migration(move)
    found = backend.find_migration(move, time.time() - 1)
    assert found is not None and found.id == started.id
    assert backend.find_migration(Move("vm2", "m1", "m2"), 0) is None
    assert backend.cancel(found)
    progress = follow(backend, found)
    assert progress.state == "failed" and "Operation cancelled" in str(progress.reason)
    assert served.fake.instance("vm1").location == "m1"


def test_a_migration_that_runs_too_long_is_given_up(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``migration_timeout`` is measured on the monotonic clock: a wall clock stepped two hours
    forward leaves the move running; the monotonic clock past the timeout gives it up."""
    served.fake.migration_seconds = 5.0
    clock = FakeClock()
    config = socket_config(served, migration_timeout=10.0)
    backend = IncusBackend(config, Settings(), monotonic=clock.monotonic)
    try:
        handle = backend.start_migration(Move("vm1", "m1", "m2"))
        monkeypatch.setattr(incus_migration, "time", stepped_time(7200))
        assert backend.poll(handle) == Progress("running")
        clock.sleep(11)
        progress = backend.poll(handle)
    finally:
        backend.close()
    assert progress.state == "failed" and "did not end within 10s" in str(progress.reason)
    assert any(c[0] == "DELETE" and "/1.0/operations/" in c[1] for c in served.fake.requests)


def test_a_move_taken_over_after_a_restart_gets_its_timeout_from_then(served: Served) -> None:
    """A move started by another process (its handle's wall-clock start long past) is given
    ``migration_timeout`` from when this process first polls it."""
    served.fake.migration_seconds = 5.0
    clock = FakeClock()
    config = socket_config(served, migration_timeout=10.0)
    starter = IncusBackend(config, Settings())
    backend = IncusBackend(config, Settings(), monotonic=clock.monotonic)
    try:
        handle = starter.start_migration(Move("vm1", "m1", "m2"))
        old = Handle(handle.id, handle.move, handle.started - 3600)
        assert backend.poll(old) == Progress("running")
        clock.sleep(9)
        assert backend.poll(old) == Progress("running")
        clock.sleep(2)
        progress = backend.poll(old)
    finally:
        starter.close()
        backend.close()
    assert progress.state == "failed" and "did not end within 10s" in str(progress.reason)


@pytest.mark.parametrize("status", [500, 400])
def test_lxd_refuses_the_volatile_key_so_the_user_key_is_written(
    served: Served, backend: IncusBackend, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    # LXD 5.0.2 refuses an unknown key with HTTP 500 ("Invalid config: Unknown configuration
    # key: …"), as the real cluster's tests showed; 400 is refused the same way.
    served.fake.flavour = "lxd"
    served.fake.unknown_key_status = status
    caplog.set_level(logging.INFO)
    for move in (Move("vm1", "m1", "m2"), Move("c2", "m2", "m1")):
        assert follow(backend, backend.start_migration(move)).state == "done"
    assert "volatile.rebalance.last_move" not in served.fake.instance("vm1").config
    assert "user.opendrs.last_move" in served.fake.instance("vm1").config
    assert "user.opendrs.last_move" in served.fake.instance("c2").config
    patched = [c[3] for c in served.fake.requests if c[0] == "PATCH"]
    assert len(patched) == 3  # the volatile key was tried once
    assert "recording moves in user.opendrs.last_move" in caplog.text


def test_evacuate_and_restore(served: Served, backend: IncusBackend) -> None:
    backend.set_maintenance("m1", True)
    cluster = backend.observe()
    assert cluster.node("m1").maintenance and not cluster.node("m1").usable
    assert all(g.node != "m1" for g in cluster.guests)
    backend.set_maintenance("m1", False)
    cluster = backend.observe()
    assert not cluster.node("m1").maintenance
    assert cluster.guest("vm1").node == "m1"


def test_leader_only(served: Served) -> None:
    backend = IncusBackend(socket_config(served, leader_only=True), Settings())
    try:
        backend.observe()
        assert backend.standby() is None
        served.fake.set_leader("m2")
        backend.observe()
        assert backend.standby() == "member m1 is not the database leader (m2): idle"
    finally:
        backend.close()


def test_rebalance_keys_become_policy_defaults(served: Served, backend: IncusBackend) -> None:
    served.fake.config.update(
        {
            "cluster.rebalance.interval": "15",
            "cluster.rebalance.cooldown": "1d 3H",
            "cluster.rebalance.batch": "2",
            "cluster.rebalance.threshold": "30",
        }
    )
    fields, notes = backend.policy_defaults("incus")
    assert fields == {
        "interval": 900,
        "cooldown": 27 * 3600,
        "batch": 2,
        "options": {"threshold": 30.0},
    }
    assert "Incus's own balancer is enabled" in notes[0]
    fields, notes = policy_defaults({"cluster.rebalance.threshold": "30"}, "balance")
    assert fields == {} and "unused" in notes[0]
    assert policy_defaults({"cluster.rebalance.cooldown": "soon"}, "incus")[0] == {}


@pytest.mark.parametrize("moved", [True, False])
def test_a_restart_move_lost_by_a_restart_of_opendrs_starts_the_container(
    served: Served, moved: bool
) -> None:
    c1 = served.fake.instance("c1")
    c1.status = "Stopped"
    if moved:
        c1.location = "m2"
    backend = IncusBackend(socket_config(served), Settings(allow_restart_migration=True))
    try:
        progress = backend.poll(Handle("restart:gone", Move("c1", "m1", "m2"), time.time()))
        time.sleep(0.3)
    finally:
        backend.close()
    assert progress.state == ("done" if moved else "failed")
    assert c1.status == "Running"
