"""Every backend asks the start's gate right before the request that moves a guest, and gives up
the reads before it once the gate closes: Proxmox (a plain and an HA-managed VM), Incus (a live
move and a restart move's stop), the simulator. Against the fake APIs on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("httpx", reason="the Incus backend's client is httpx")

from backends.fakeincus import Served
from backends.fakepve_fixture import FakeCluster
from backends.incus_fixture import served, socket_config
from backends.test_proxmox import SECRET, TOKEN_ID, config_for, populate, requests_to
from opendrs.backends.base import (
    STOPPING,
    Abandoned,
    Backend,
    BackendError,
    Interrupts,
    NotStarted,
    StartGate,
    stop_reason,
)
from opendrs.backends.incus import IncusBackend
from opendrs.backends.proxmox import ProxmoxBackend
from opendrs.backends.scenario import builtin_scenario
from opendrs.backends.sim import Simulator
from opendrs.model.cluster import Move, Settings

__all__ = ["served"]

RELOAD = "the configuration is being reloaded"


@pytest.fixture
def pve(tmp_path: Path) -> Iterator[FakeCluster]:
    cluster = FakeCluster(str(tmp_path))
    cluster.pve.apitokens[TOKEN_ID] = SECRET
    populate(cluster)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def proxmox(pve: FakeCluster, tmp_path: Path) -> Iterator[ProxmoxBackend]:
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    backend = ProxmoxBackend(config_for(pve, str(token), timeout=30.0), Settings())
    backend.observe()
    try:
        yield backend
    finally:
        backend.close()


def closes_when(seen: Callable[[], bool]) -> StartGate:
    """A gate that closes (a reload) once ``seen()`` is true."""
    return StartGate(lambda: RELOAD if seen() else None)


def refused(backend: Backend, move: Move, gate: StartGate) -> tuple[BackendError, float]:
    began = time.monotonic()
    with pytest.raises(Abandoned) as raised:
        backend.start_migration(move, gate)
    error = raised.value
    assert not error.uncertain and not gate.entered
    return error, time.monotonic() - began


def test_proxmox_gives_up_a_late_precheck_when_the_gate_closes(
    pve: FakeCluster, proxmox: ProxmoxBackend
) -> None:
    pve.pve.withhold("GET", "/qemu/100/migrate", secs=20)
    gate = closes_when(lambda: bool(pve.pve.held_back))
    error, took = refused(proxmox, Move("100", "pve1", "pve2"), gate)
    assert took < 5, f"the precheck was waited for ({took:.1f}s)"
    # The call cut short names the gate's reason, not a stop.
    assert str(error).endswith(f"given up: {RELOAD}") and STOPPING not in str(error), error
    assert requests_to(pve, "POST", "/qemu/100/migrate") == 0


def test_proxmox_sends_no_request_to_the_ha_stack_once_the_gate_closed(
    pve: FakeCluster, proxmox: ProxmoxBackend
) -> None:
    # Closed once the precheck is answered: the request to the HA stack is not sent.
    gate = closes_when(lambda: requests_to(pve, "GET", "/qemu/105/migrate") > 0)
    refused(proxmox, Move("105", "pve3", "pve1"), gate)
    assert requests_to(pve, "POST", "/cluster/ha/resources/vm:105/migrate") == 0
    assert requests_to(pve, "POST", "/qemu/105/migrate") == 0


def test_proxmox_passes_an_open_gate_right_before_its_request(
    pve: FakeCluster, proxmox: ProxmoxBackend
) -> None:
    sent_when_asked: list[int] = []

    def why_not() -> str | None:
        sent_when_asked.append(requests_to(pve, "POST", "/qemu/100/migrate"))
        return None

    gate = StartGate(why_not)
    proxmox.start_migration(Move("100", "pve1", "pve2"), gate)
    assert gate.entered and sent_when_asked and set(sent_when_asked) == {0}
    assert requests_to(pve, "POST", "/qemu/100/migrate") == 1


def test_incus_sends_no_move_once_the_gate_closed(served: Served) -> None:
    backend = IncusBackend(socket_config(served), Settings(allow_restart_migration=True))
    try:
        backend.observe()
        for guest, request in (("vm1", "POST"), ("c1", "PUT")):
            path = f"/1.0/instances/{guest}"
            gate = closes_when(lambda p=path: bool(served.fake.calls("GET", p)))  # type: ignore[misc]
            error, _ = refused(backend, Move(guest, "m1", "m2"), gate)
            assert isinstance(error, NotStarted) and RELOAD in str(error)
            assert served.fake.calls(request, path if request == "POST" else f"{path}/state") == []
        handle = backend.start_migration(Move("vm1", "m1", "m2"), StartGate())
        assert handle.move == Move("vm1", "m1", "m2")
    finally:
        backend.close()
    assert served.fake.instance("c1").status == "Running"


def test_incus_names_the_gate_s_reason_for_a_read_it_cut_short(served: Served) -> None:
    backend = IncusBackend(socket_config(served, timeout=30.0), Settings())
    try:
        backend.observe()
        path = "/1.0/instances/vm1"
        served.fake.hang("GET", path, 5.0)  # the fake ends it before it closes
        gate = closes_when(lambda: bool(served.fake.calls("GET", path)))
        error, took = refused(backend, Move("vm1", "m1", "m2"), gate)
        assert took < 3, f"the read was waited for ({took:.1f}s)"
        assert not isinstance(error, NotStarted)
        assert str(error).endswith(f"given up: {RELOAD}") and STOPPING not in str(error), error
        assert served.fake.calls("POST", path) == []
    finally:
        backend.close()


def test_interrupts_say_why_calls_end() -> None:
    """A stop says :data:`STOPPING`; a closed gate of the start under way, its own reason."""
    stopping = False
    interrupts = Interrupts(lambda: stopping)
    assert interrupts.reason() is None and stop_reason(interrupts) is None
    with interrupts.starting(StartGate(lambda: RELOAD)):
        assert interrupts() and interrupts.reason() == stop_reason(interrupts) == RELOAD
        stopping = True
        assert interrupts.reason() == STOPPING
    assert stop_reason(lambda: True) == STOPPING and stop_reason(lambda: False) is None


def test_the_simulator_starts_nothing_through_a_closed_gate() -> None:
    sim = Simulator(builtin_scenario("demo"))
    guest = sim.observe().guests[0]
    target = next(n.name for n in sim.observe().nodes if n.name != guest.node)
    move = Move(guest.id, guest.node, target)
    error, _ = refused(sim, move, StartGate(lambda: RELOAD))
    assert isinstance(error, NotStarted)
    assert sim.migrations == ()
    gate = StartGate()
    sim.start_migration(move, gate)
    assert gate.entered and len(sim.migrations) == 1
