"""The Incus backend against real two-member clusters on loopback (:mod:`backends.real_cluster`):
LXD 5.0 and Incus 6.0 LTS, the same tests on each, driven as an operator drives them: a
configuration file with ``backend: {type: incus, flavour: lxd|incus, socket: …}`` and ``opendrs
snapshot``, ``opendrs run --once``, ``opendrs place`` and ``opendrs maintenance`` as subprocesses;
the backend and the executor in process where no command shows what is checked (CPU rates, a
member that goes down under a move). On LXD, where KVM is usable, a small running VM is moved
too.

Skipped, with the reason, without root, the packages (``tools/install-test-packages``) or where the
daemons cannot start. Each test makes its own instances and deletes them; one cluster of each
server serves the whole session and is always torn down, leaving no process, mount or folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")

from backends.incus_fixture import history, opendrs
from backends.real_cluster import (
    FLAVOURS,
    INCUS,
    OWNER,
    PREFIX,
    ClusterUnavailable,
    RealCluster,
    clean_aborted_runs,
    leftovers,
)
from opendrs.backends.base import SystemClock
from opendrs.backends.incus import IncusBackend, IncusConfig
from opendrs.backends.incus.observe import LAST_MOVE_KEYS
from opendrs.controller.executor import Executor, ExecutorConfig
from opendrs.controller.history import History
from opendrs.engine.planner.plan import Plan, PlannedMove
from opendrs.model import snapshot
from opendrs.model.cluster import Cluster, Move, Settings

MiB = 1024**2


@pytest.fixture(scope="session", params=sorted(FLAVOURS))
def cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """One real cluster of each server (``incus``, ``lxd``) for the session."""
    real = RealCluster(FLAVOURS[request.param])
    try:
        try:
            real.start()
        except ClusterUnavailable as exc:
            pytest.skip(f"no {request.param} cluster here: {exc}")
        yield real
    finally:
        root = str(real.root) if real.root is not None else None
        real.close()
        if root is not None:
            assert leftovers(root) == [], f"the {request.param} cluster's teardown left these"


def test_an_aborted_runs_leftovers_are_cleaned(tmp_path: Path) -> None:
    # A run killed outright leaves its folder, its processes and (as root) its mounts; the next
    # start removes them, and leaves a folder whose run is still going.
    dead = subprocess.Popen(["true"])
    dead.wait()
    aborted = Path(tempfile.mkdtemp(prefix=f"{PREFIX}test-"))
    going = Path(tempfile.mkdtemp(prefix=f"{PREFIX}test-"))
    (aborted / OWNER).write_text(str(dead.pid))
    (going / OWNER).write_text(str(os.getpid()))
    stray = subprocess.Popen(["sh", "-c", "sleep 60", str(aborted / "lxd1")])
    try:
        if os.geteuid() == 0:
            (aborted / "shmounts").mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "none", str(aborted / "shmounts")], check=True)
        assert str(aborted) in clean_aborted_runs()
        assert stray.wait(5) != 0
        assert leftovers(str(aborted)) == []
        assert going.is_dir()
    finally:
        stray.kill()
        stray.wait()
        shutil.rmtree(going, ignore_errors=True)


@pytest.fixture
def real(cluster: RealCluster) -> RealCluster:
    """The session's cluster with both members up and online (a test may have changed that)."""
    cluster.ensure_up()
    return cluster


@contextmanager
def instances(real: RealCluster, *specs: tuple[str, str, bool]) -> Iterator[None]:
    """Containers ``(name, member, running)`` in the project ``default``, deleted afterwards
    whatever happened."""
    try:
        for name, member, running in specs:
            real.create_container(name, member, run=running)
        yield
    finally:
        for name, _, _ in specs:
            real.cli("delete", "--force", name, check=False)


def write_config(
    tmp_path: Path, real: RealCluster, *, mode: str = "active", extra: str = "", backend: str = ""
) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        "version: 1\n"
        f"mode: {mode}\n"
        f"backend: {{type: incus, flavour: {real.flavour.name}, socket: {real.socket()}, "
        f"timeout: 10s, retries: 1{backend}}}\n"
        "history: history.sqlite\n"
        "executor: {poll_interval: 1s}\n"
        "log: {level: info}\n" + extra
    )
    return path


#: Restart moves allowed, and capacity by configured sizes: both members are this one machine,
#: whose load average (Incus's member state) every member reports as its own — on a busy test
#: machine it fills both, and no move would fit.
RESTART = "settings: {allow_restart_migration: true, mode: static}\n"
STATIC_RESTART = Settings(allow_restart_migration=True, mode="static")


def backend_of(real: RealCluster, settings: Settings | None = None) -> IncusBackend:
    # Above the server's own 10 s wait for a member that is down: its answer comes at the first
    # try.
    config = IncusConfig(
        flavour=real.flavour.name, socket=str(real.socket()), timeout=15.0, retries=1
    )
    return IncusBackend(config, settings or Settings(), cluster_name=real.flavour.name)


def host_resources(real: RealCluster, member: str) -> tuple[int, int]:
    """A member's CPU threads and memory, as the server reports them."""
    resources = real.query(f"/1.0/resources?target={member}")
    return int(resources["cpu"]["total"]), int(resources["memory"]["total"])


def why_not(tmp_path: Path, config: Path, guest: str) -> str:
    """``opendrs place`` on the live snapshot: where ``guest`` could go, and why not."""
    live = tmp_path / "live.yaml"
    taken = opendrs("snapshot", "--config", str(config), "-o", str(live))
    assert taken.returncode == 0, taken.stderr
    return opendrs("place", str(live), "--guest", guest).stdout


# -- observe -----------------------------------------------------------------------------------


def test_snapshot_shows_members_capacity_and_containers(tmp_path: Path, real: RealCluster) -> None:
    one, two = real.names
    with instances(real, ("obs-run", one, True), ("obs-stop", two, False)):
        real.cli("config", "set", "obs-stop", "limits.cpu=2", "limits.memory=512MiB")
        result = opendrs("snapshot", "--config", str(write_config(tmp_path, real)))
    assert result.returncode == 0, result.stderr
    live = snapshot.loads(result.stdout, filename="live.yaml")
    assert [(n.name, n.online, n.maintenance) for n in live.nodes] == [
        (one, True, False),
        (two, True, False),
    ]
    for node in live.nodes:
        threads, memory = host_resources(real, node.name)
        assert (node.cpu, node.memory) == (threads, memory)
    running, stopped = live.guest("obs-run"), live.guest("obs-stop")
    assert (running.node, running.kind, running.state) == (one, "ct", "running")
    assert (running.cpu, running.memory) == (1, 256 * MiB)
    assert running.memory_used is not None and 0 < running.memory_used < 256 * MiB
    assert (stopped.node, stopped.kind, stopped.state) == (two, "ct", "stopped")
    assert (stopped.cpu, stopped.memory) == (2, 512 * MiB)
    # LXD 5.0 has no member state (501): asked once, then the load average is left out.
    assert "Traceback" not in result.stderr


def cpu_counter(real: RealCluster, name: str) -> tuple[float, float]:
    """The instance's CPU counter (seconds) as the server shows it, and when it was read."""
    state = real.query(f"/1.0/instances/{name}/state")
    return state["cpu"]["usage"] / 1e9, time.monotonic()


#: A shell that spins for 9 s.
SPIN = ("timeout", "9", "sh", "-c", "while :; do :; done")


def test_cpu_use_is_the_rate_between_two_observations(real: RealCluster) -> None:
    one, two = real.names
    with instances(real, ("cpu-busy", one, True), ("cpu-idle", two, True)):
        backend = backend_of(real)
        spin = subprocess.Popen(
            [real.flavour.client, "exec", "cpu-busy", "--", *SPIN],
            env=real.member_env(one),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(1)
            before = cpu_counter(real, "cpu-busy")
            backend.observe()
            time.sleep(3)
            second = backend.observe()
            after = cpu_counter(real, "cpu-busy")
        finally:
            spin.kill()
            spin.wait()
            backend.close()
    busy, idle = second.guest("cpu-busy"), second.guest("cpu-idle")
    # The spinning shell's use over the observations' interval, in cores (limits.cpu=1: at most
    # one; less on a busy machine), as the server's own counter read around them gives it.
    measured = (after[0] - before[0]) / (after[1] - before[1])
    assert measured > 0.1, measured
    assert busy.cpu_used is not None and abs(busy.cpu_used - measured) < 0.1 + 0.3 * measured
    assert busy.cpu_used <= 1.05
    assert idle.cpu_used is not None and idle.cpu_used < 0.05 < measured
    assert busy.memory_used and idle.memory_used


# -- moves -------------------------------------------------------------------------------------


def test_a_stopped_container_moves_cold(real: RealCluster) -> None:
    # opendrs's policy moves running guests only (a stopped one loads nothing): the backend.
    one, two = real.names
    with instances(real, ("cold", one, False)):
        backend = backend_of(real)
        try:
            backend.observe()
            handle = backend.start_migration(Move("cold", one, two))
            deadline = time.monotonic() + 60
            while (progress := backend.poll(handle)).state == "running":
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            backend.close()
        assert progress.state == "done", progress.reason
        assert real.location("cold") == (two, "Stopped")
        config = real.query("/1.0/instances/cold")["config"]
    # The move's time, in the key the server takes (LXD 5.0 and Incus 6.0 refuse Incus's later
    # volatile key: opendrs's own).
    recorded = [config[key] for key in LAST_MOVE_KEYS if key in config]
    assert len(recorded) == 1 and abs(int(recorded[0]) - time.time()) < 120, config


def test_a_running_container_moves_only_by_restart_when_allowed(
    tmp_path: Path, real: RealCluster
) -> None:
    one, two = real.names
    with instances(real, ("warm", one, True)):
        real.cli("config", "set", "warm", f"user.opendrs.pin={two}")
        config = write_config(tmp_path, real)
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("warm") == (one, "Running")
        assert history(tmp_path, "SELECT * FROM migrations") == []
        why = why_not(tmp_path, config, "warm")
        assert "cannot move: container: restart migration not allowed" in why, why

        config = write_config(tmp_path, real, extra=RESTART)
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("warm") == (two, "Running"), result.stderr
        # Followed to its end without an error on the way (Incus answers a wait that runs out
        # of time with one).
        assert "WARNING" not in result.stderr, result.stderr
    assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
        ("warm", two, "done")
    ]


# -- maintenance -------------------------------------------------------------------------------


def test_maintenance_evacuates_and_restores_a_member(tmp_path: Path, real: RealCluster) -> None:
    one, two = real.names
    config = str(write_config(tmp_path, real, mode="shadow"))
    with instances(real, ("ev-run", two, True), ("ev-stop", two, False)):
        result = opendrs("maintenance", "enter", two, "--config", config, "--format", "json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["node"] == two and report["maintenance"] is True
        assert sorted(m["guest"] for m in report["moved"]) == ["ev-run", "ev-stop"]
        assert real.members()[two] == "Evacuated"
        assert real.location("ev-run") == (one, "Running")
        live = opendrs("snapshot", "--config", config)
        assert live.returncode == 0, live.stderr
        assert snapshot.loads(live.stdout, filename="live.yaml").node(two).maintenance

        again = opendrs("maintenance", "enter", two, "--config", config)
        assert again.returncode == 0 and "already in maintenance" in again.stdout

        result = opendrs("maintenance", "leave", two, "--config", config)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].startswith(f"node {two}: out of maintenance (restored by the platform in")
        assert sorted(line.split() for line in lines[1:]) == [
            ["ev-run", one, "→", two],
            ["ev-stop", one, "→", two],
        ]
        assert real.members()[two] == "Online"
        assert real.location("ev-run") == (two, "Running")
        assert real.location("ev-stop")[0] == two

        unknown = opendrs("maintenance", "enter", "nine", "--config", config)
        assert unknown.returncode == 2
        assert unknown.stderr.strip().splitlines()[-1] == (
            f"error: NODE: no node 'nine' in the cluster (its nodes: {one}, {two})"
        )


# -- a member that goes down -------------------------------------------------------------------


class _LastLook:
    """The real backend, whose observations stop at the last one taken before :attr:`frozen`:
    the executor saw the target online, and it went down before the request."""

    def __init__(self, backend: IncusBackend) -> None:
        self.backend = backend
        self.name, self.read_only = backend.name, backend.read_only
        self.frozen: Cluster | None = None

    def observe(self) -> Cluster:
        return self.frozen if self.frozen is not None else self.backend.observe()

    def __getattr__(self, name: str) -> object:
        return getattr(self.backend, name)


def test_a_move_to_a_member_that_went_down_fails_and_is_worked_around(
    tmp_path: Path, real: RealCluster
) -> None:
    one, two = real.names
    with instances(real, ("orphan", one, True)):
        backend = _LastLook(backend_of(real, STATIC_RESTART))
        history_db = History(str(tmp_path / "history.sqlite"))
        config = ExecutorConfig(poll_interval=1)
        executor = Executor(backend, SystemClock(), history_db, config)  # type: ignore[arg-type]
        try:
            backend.frozen = backend.observe()
            assert backend.frozen.node(two).online
            real.shutdown_daemon(two)
            executor.submit(Plan((PlannedMove("orphan", one, two, 1),), feasible=True))
            deadline = time.monotonic() + 90
            while executor.busy and time.monotonic() < deadline:
                executor.tick()
                time.sleep(0.5)
            kinds = [(e.kind, e.detail) for e in executor.events]
            assert not executor.busy, kinds
            backend.frozen = None
            now = backend.observe()
        finally:
            backend.close()
            history_db.close()
        failed = [detail for kind, detail in kinds if kind == "failed"]
        assert len(failed) == 1 and "\n" not in failed[0], kinds
        # The server's own reason, naming the member that is gone.
        assert failed[0].startswith("the restart move of orphan failed at its move: "), failed
        assert f"{real.address(two)}:{real.port}" in failed[0], failed
        # Nothing half done: the container is where it was, once, and running again.
        assert real.location("orphan") == (one, "Running")
        names = [row["name"] for row in real.query("/1.0/instances?recursion=1")]
        assert names.count("orphan") == 1
    rows = history(tmp_path, "SELECT guest, target, outcome, error FROM migrations")
    assert [r[:3] for r in rows] == [("orphan", two, "failed")]
    assert history(tmp_path, "SELECT guest, node FROM avoid") == [("orphan", two)]
    # A fresh look sees the member gone: the executor will not choose it.
    assert not now.node(two).online


# -- Incus's own placement rules ---------------------------------------------------------------


@contextmanager
def member_key(real: RealCluster, member: str, key: str, value: str) -> Iterator[None]:
    """A member's config ``key`` set to ``value``, and unset afterwards whatever happened."""

    def patch(to: str) -> None:
        # With the member's other fields: a PATCH without them would clear them (and a member
        # must stay in a group and a failure domain).
        now = real.query(f"/1.0/cluster/members/{member}")
        fields = ("description", "roles", "failure_domain", "groups")
        body = json.dumps({"config": {key: to}, **{f: now[f] for f in fields}})
        real.cli("query", "-X", "PATCH", f"/1.0/cluster/members/{member}", "--data", body)

    patch(value)
    try:
        yield
    finally:
        patch("")


def pin(real: RealCluster, name: str, member: str, project: str = "default") -> None:
    real.cli("config", "set", name, f"user.opendrs.pin={member}", "--project", project)


#: Balancing at the first observation, and of instances that have just started.
BALANCE_NOW = RESTART + "policy: {hold: 1, min_uptime: 0s}\n"


@contextmanager
def lopsided(real: RealCluster, *, big_target: str | None = None) -> Iterator[None]:
    """Running containers of one vCPU each, by configured memory in eighths of a member's:
    ``big-ct`` 3, ``small-ct`` 1 and ``still-ct`` 2 on the first member, ``anchor-ct`` (256 MiB)
    on the second; ``still-ct`` and ``anchor-ct`` ignored by opendrs. Balancing moves ``big-ct``
    (3 eighths and 2 vCPUs on each side after it), or ``small-ct`` where ``big-ct`` may not
    move. ``big_target`` places ``big-ct`` (``@GROUP``: for a cluster group)."""
    one, two = real.names
    eighth = host_resources(real, one)[1] // 8 // MiB
    specs = (
        ("big-ct", one, f"{3 * eighth}MiB", big_target),
        ("small-ct", one, f"{eighth}MiB", None),
        ("still-ct", one, f"{2 * eighth}MiB", None),
        ("anchor-ct", two, "256MiB", None),
    )
    made = []
    try:
        for name, member, memory, target in specs:
            made.append(name)
            real.create_container(name, member, memory=memory, target=target)
        for name in ("still-ct", "anchor-ct"):
            real.cli("config", "set", name, "user.opendrs.ignore=true")
        real.cli("start", *made)
        yield
    finally:
        for name in made:
            real.cli("delete", "--force", name, check=False)


def test_a_manual_member_takes_nothing_automatically(tmp_path: Path, real: RealCluster) -> None:
    two = real.names[1]
    config = write_config(tmp_path, real, extra=BALANCE_NOW)
    with lopsided(real):
        with member_key(real, two, "scheduler.instance", "manual"):
            result = opendrs("run", "--config", str(config), "--once")
            assert result.returncode == 0, result.stderr
            assert history(tmp_path, "SELECT * FROM migrations") == []
            why = why_not(tmp_path, config, "big-ct")
            assert f"{two}: strict node affinity (scheduler.instance: {two} manual)" in why, why
        # The member back to `all`: balancing moves the big one there.
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("big-ct") == (two, "Running")
    assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
        ("big-ct", two, "done")
    ]


def test_a_group_member_takes_no_balancing_target(tmp_path: Path, real: RealCluster) -> None:
    # Incus: a member whose scheduler.instance is `group` takes instances only when they target
    # its cluster group, and is left out of automatic placement and rebalancing.
    two = real.names[1]
    config = write_config(tmp_path, real, extra=BALANCE_NOW)
    with lopsided(real), member_key(real, two, "scheduler.instance", "group"):
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert history(tmp_path, "SELECT * FROM migrations") == []
        why = why_not(tmp_path, config, "big-ct")
        assert f"strict node affinity (scheduler.instance: {two} group)" in why, why


@contextmanager
def cluster_group(real: RealCluster, group: str, member: str) -> Iterator[None]:
    """A cluster group of ``member`` alone (still in ``default`` too), removed afterwards."""
    real.cli("cluster", "group", "create", group)
    try:
        real.cli("cluster", "group", "assign", member, f"default,{group}")
        yield
    finally:
        real.cli("cluster", "group", "assign", member, "default", check=False)
        real.cli("cluster", "group", "delete", group, check=False)


@contextmanager
def project(real: RealCluster, name: str, *config: str) -> Iterator[None]:
    """A project with ``config`` (``KEY=VALUE``) whose default profile has the root disk on the
    pool ``default``, and the default project's images; its instances and itself deleted
    afterwards."""
    settings = ["features.images=false", *config]
    real.cli("project", "create", name, *(arg for c in settings for arg in ("-c", c)))
    root = ("root", "disk", "path=/", "pool=default")
    real.cli("profile", "device", "add", "default", *root, "--project", name)
    try:
        yield
    finally:
        for url in real.query(f"/1.0/instances?project={name}"):
            instance = url.split("?", 1)[0].rsplit("/", 1)[-1]
            real.cli("delete", "--force", instance, "--project", name)
        real.cli("project", "delete", name)


def test_cluster_groups_and_restricted_projects_keep_their_instances(
    tmp_path: Path, real: RealCluster
) -> None:
    one, two = real.names
    config = write_config(tmp_path, real, extra=BALANCE_NOW, backend=", all_projects: true")
    fence = ("restricted=true", "restricted.cluster.groups=solo", "restricted.cluster.target=allow")
    with (
        cluster_group(real, "solo", one),
        project(real, "fenced", *fence),
        lopsided(real, big_target="@solo"),
    ):
        real.create_container("fenced-ct", one, run=True, project="fenced")
        # Incus records the group an instance was created for; LXD 5.0 does not, and nothing
        # then binds it there.
        recorded = real.query("/1.0/instances/big-ct")["config"].get("volatile.cluster.group")
        assert recorded == ("solo" if real.flavour is INCUS else None)
        live = snapshot.loads(
            opendrs("snapshot", "--config", str(config)).stdout, filename="live.yaml"
        )
        assert live.node(one).tags == ("default", "solo")
        assert live.guest("fenced/fenced-ct").node == one
        why = why_not(tmp_path, config, "fenced/fenced-ct")
        assert f"{two}: strict node affinity (project fenced groups)" in why, why
        why = why_not(tmp_path, config, "big-ct")
        assert (f"{two}: strict node affinity (cluster group solo)" in why) == bool(recorded), why

        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("fenced-ct", "fenced") == (one, "Running")
        moved = "small-ct" if recorded else "big-ct"
        assert real.location(moved) == (two, "Running")
    assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
        (moved, two, "done")
    ]


def test_a_project_is_observed_and_acted_in_alone(tmp_path: Path, real: RealCluster) -> None:
    one, two = real.names
    config = write_config(tmp_path, real, extra=RESTART, backend=", project: web")
    with project(real, "web"), instances(real, ("outside-ct", one, True)):
        real.create_container("site", one, run=True, project="web")
        pin(real, "site", two, "web")
        pin(real, "outside-ct", two)
        live = snapshot.loads(
            opendrs("snapshot", "--config", str(config)).stdout, filename="live.yaml"
        )
        assert [g.id for g in live.guests] == ["web/site"]
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("site", "web") == (two, "Running")
        assert real.location("outside-ct") == (one, "Running")
    assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
        ("web/site", two, "done")
    ]


@pytest.mark.parametrize(("target", "moves"), [("block", False), (None, False), ("allow", True)])
def test_a_project_that_blocks_targets_keeps_its_instances(
    tmp_path: Path, real: RealCluster, target: str | None, moves: bool
) -> None:
    # A restricted project's restricted.cluster.target is `block` unless set (`None`: unset):
    # no one may choose a member for its instances. Created while `allow`, then blocked.
    one, two = real.names
    config = write_config(tmp_path, real, extra=RESTART, backend=", project: locked")
    with project(real, "locked", "restricted=true", "restricted.cluster.target=allow"):
        real.create_container("kept-ct", one, run=True, project="locked")
        pin(real, "kept-ct", two, "locked")
        if target is None:
            real.cli("project", "unset", "locked", "restricted.cluster.target")
        else:
            real.cli("project", "set", "locked", f"restricted.cluster.target={target}")
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        if moves:
            assert real.location("kept-ct", "locked") == (two, "Running"), result.stderr
            return
        assert real.location("kept-ct", "locked") == (one, "Running")
        assert history(tmp_path, "SELECT * FROM migrations") == []
        why = why_not(tmp_path, config, "locked/kept-ct")
        assert (
            "project locked has restricted.cluster.target=block: Incus keeps it where it is" in why
        ), why
        # opendrs holds it itself, as Incus's balancer does: the server lets an administrator
        # (this socket) name a member there all the same.
        named = real.run_client(
            "init", "--empty", "probe-ct", "--target", two, "--project", "locked"
        )
        assert named.returncode == 0, named.stderr


@pytest.mark.parametrize("evacuate", ["stop", "migrate", "auto"])
def test_cluster_evacuate_on_a_running_container(
    tmp_path: Path, real: RealCluster, evacuate: str
) -> None:
    # A running container never moves live (no CRIU), whatever cluster.evacuate says: a
    # restart move with allow_restart_migration, held without it.
    one, two = real.names
    with instances(real, ("evac-ct", one, True)):
        real.cli("config", "set", "evac-ct", f"cluster.evacuate={evacuate}")
        pin(real, "evac-ct", two)
        held = write_config(tmp_path, real, extra="settings: {mode: static}\n")
        result = opendrs("run", "--config", str(held), "--once")
        assert result.returncode == 0, result.stderr
        assert real.location("evac-ct") == (one, "Running")
        why = why_not(tmp_path, held, "evac-ct")
        assert "cannot move: container: restart migration not allowed" in why, why

        result = opendrs(
            "run", "--config", str(write_config(tmp_path, real, extra=RESTART)), "--once"
        )
        assert result.returncode == 0, result.stderr
        assert real.location("evac-ct") == (two, "Running"), result.stderr
    assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
        ("evac-ct", two, "done")
    ]


def test_maintenance_leaves_a_stop_instance_stopped_on_its_member(
    tmp_path: Path, real: RealCluster
) -> None:
    # Incus's evacuation stops a `cluster.evacuate: stop` instance and leaves it; the restore
    # starts it again.
    one, two = real.names
    config = str(write_config(tmp_path, real, mode="shadow"))
    with instances(real, ("stays-ct", two, True), ("goes-ct", two, True)):
        real.cli("config", "set", "stays-ct", "cluster.evacuate=stop")
        result = opendrs("maintenance", "enter", two, "--config", config)
        assert result.returncode == 0, result.stderr
        assert real.location("stays-ct") == (two, "Stopped")
        assert real.location("goes-ct") == (one, "Running")
        lines = result.stdout.splitlines()
        assert lines[1].split() == ["goes-ct", two, "→", one], lines
        assert lines[-1] == f"  left on {two}: stays-ct", lines
        result = opendrs("maintenance", "leave", two, "--config", config)
        assert result.returncode == 0, result.stderr
        assert real.location("stays-ct") == (two, "Running")
        assert real.location("goes-ct") == (two, "Running")


def test_a_pinned_cpu_set_and_a_memory_share_are_counted(tmp_path: Path, real: RealCluster) -> None:
    # limits.cpu as a set of CPUs counts them (both members have them: no rule); limits.memory
    # as a percentage is that share of the member's memory.
    one = real.names[0]
    threads, memory = host_resources(real, one)
    if threads < 2:
        pytest.skip(f"the members have {threads} CPU thread: no set of two to pin")
    with instances(real, ("pinned-ct", one, False)):
        real.cli("config", "set", "pinned-ct", "limits.cpu=0-1", "limits.memory=50%")
        real.cli("start", "pinned-ct")
        result = opendrs("snapshot", "--config", str(write_config(tmp_path, real)))
    assert result.returncode == 0, result.stderr
    live = snapshot.loads(result.stdout, filename="live.yaml")
    guest = live.guest("pinned-ct")
    assert (guest.state, guest.cpu, guest.memory) == (
        "running",
        2,
        memory // 2,
    )
    assert live.rules.node_affinity == (), live.rules


#: The API extension of a ``limits.cpu`` written as a topology.
TOPOLOGY = "instance_limits_cpu_topology"


def test_a_cpu_topology_counts_its_vcpus_where_the_server_takes_one(
    tmp_path: Path, real: RealCluster
) -> None:
    one = real.names[0]
    extensions = real.query("/1.0")["api_extensions"]
    with instances(real, ("topo-ct", one, False)):
        taken = real.run_client("config", "set", "topo-ct", "limits.cpu=sockets=1,cores=2")
        if TOPOLOGY not in extensions:
            # The server refuses it: opendrs can never read one there.
            assert taken.returncode != 0, taken.stdout
            pytest.skip(
                f"the {real.flavour.name} server has no API extension {TOPOLOGY}: "
                f"it refuses limits.cpu as a topology ({taken.stderr.strip()[:120]})"
            )
        assert taken.returncode == 0, taken.stderr
        result = opendrs("snapshot", "--config", str(write_config(tmp_path, real)))
    assert result.returncode == 0, result.stderr
    assert snapshot.loads(result.stdout, filename="live.yaml").guest("topo-ct").cpu == 2


# -- a running virtual machine -----------------------------------------------------------------


@pytest.fixture
def vm(real: RealCluster) -> Iterator[str]:
    """A running VM ``vm-move`` on the first member (LXD, where KVM is usable), pinned by
    opendrs's key to the second, deleted afterwards whatever happened."""
    if real.vm_unavailable is not None:
        pytest.skip(f"no VM on the {real.flavour.name} cluster: {real.vm_unavailable}")
    one, two = real.names
    try:
        real.create_vm("vm-move", one, config=[f"user.opendrs.pin={two}"])
        yield "vm-move"
    finally:
        real.cli("delete", "--force", "vm-move", check=False)


def test_a_running_vm_moves_and_its_downtime_is_told(
    tmp_path: Path, real: RealCluster, vm: str
) -> None:
    one, two = real.names
    # The dir pool is local to each member: its disks are copied.
    config = write_config(
        tmp_path, real, extra="settings: {mode: static, allow_local_disks: true}\n"
    )
    result = opendrs("run", "--config", str(config), "--once")
    assert result.returncode == 0, result.stderr
    assert real.location(vm) == (two, "Running"), result.stderr
    # Sent as a live move; LXD 5.0 (no migration_vm_live) makes it a stateful stop and start,
    # and opendrs says so, with how long the guest was stopped, not that it moved live.
    assert (
        f"moving instance {vm} from {one} to {two} (by a stateful stop and start: the server has "
        "no migration_vm_live)" in result.stderr
    ), result.stderr
    ((started, ended, outcome, downtime),) = history(
        tmp_path, "SELECT started, ended, outcome, downtime FROM migrations"
    )
    assert outcome == "done" and 0 < downtime <= ended - started + 1, (downtime, ended - started)
    done = [line for line in result.stderr.splitlines() if f"done {vm} {one} → {two}" in line]
    assert len(done) == 1, result.stderr
    assert done[0].endswith(
        f", by a stateful stop and start: the guest was stopped for {downtime:.1f} s"
    ), done
    shown = opendrs("history", "--config", str(config))
    assert f"done, guest stopped {downtime:.1f} s" in shown.stdout, shown.stdout


def test_maintenance_evacuates_a_member_running_a_vm(
    tmp_path: Path, real: RealCluster, vm: str
) -> None:
    one, two = real.names
    config = str(write_config(tmp_path, real, mode="shadow"))
    result = opendrs("maintenance", "enter", one, "--config", config)
    assert result.returncode == 0, result.stderr
    assert real.location(vm) == (two, "Running")
    assert real.members()[one] == "Evacuated"
    result = opendrs("maintenance", "leave", one, "--config", config)
    assert result.returncode == 0, result.stderr
    assert real.location(vm) == (one, "Running")
    assert real.members()[one] == "Online"


@pytest.mark.parametrize(
    ("keys", "held"),
    [
        (("cluster.evacuate=stop",), "cluster.evacuate=stop: Incus never moves it live"),
        (("cluster.evacuate=migrate",), "cluster.evacuate=migrate: Incus never moves it live"),
        (("migration.stateful=false",), "migration.stateful is not true"),
        (("cluster.evacuate=live-migrate",), None),
    ],
)
def test_a_running_vm_moves_live_only_where_the_server_would(
    tmp_path: Path, real: RealCluster, keys: tuple[str, ...], held: str | None
) -> None:
    # cluster.evacuate and migration.stateful decide whether Incus moves a running VM live;
    # without restart moves, one it would not is held, and the why-not says why.
    if real.vm_unavailable is not None:
        pytest.skip(f"no VM on the {real.flavour.name} cluster: {real.vm_unavailable}")
    one, two = real.names
    config = write_config(
        tmp_path, real, extra="settings: {mode: static, allow_local_disks: true}\n"
    )
    try:
        real.create_vm("vm-rule", one, config=[f"user.opendrs.pin={two}", *keys])
        result = opendrs("run", "--config", str(config), "--once")
        assert result.returncode == 0, result.stderr
        if held is None:
            assert real.location("vm-rule") == (two, "Running"), result.stderr
            assert history(tmp_path, "SELECT guest, target, outcome FROM migrations") == [
                ("vm-rule", two, "done")
            ]
            return
        assert real.location("vm-rule") == (one, "Running")
        assert history(tmp_path, "SELECT * FROM migrations") == []
        why = why_not(tmp_path, config, "vm-rule")
        assert held in why, why
    finally:
        real.cli("delete", "--force", "vm-rule", check=False)


def test_an_evacuated_member_is_online_and_takes_nothing(tmp_path: Path, real: RealCluster) -> None:
    # Evacuated by the server itself (not through opendrs): online, in maintenance, no target.
    one, two = real.names
    config = write_config(tmp_path, real, extra=BALANCE_NOW)
    with instances(real, ("waiting-ct", one, True)):
        pin(real, "waiting-ct", two)
        real.cli("cluster", "evacuate", two, "--force")
        try:
            assert real.members()[two] == "Evacuated"
            result = opendrs("run", "--config", str(config), "--once")
            assert result.returncode == 0, result.stderr
            assert f"elsewhere: {two}: node in maintenance" in result.stderr, result.stderr
            assert real.location("waiting-ct") == (one, "Running")
            assert history(tmp_path, "SELECT * FROM migrations") == []
            live = snapshot.loads(
                opendrs("snapshot", "--config", str(config)).stdout, filename="live.yaml"
            )
            assert (live.node(two).online, live.node(two).maintenance) == (True, True)
            why = why_not(tmp_path, config, "waiting-ct")
            assert f"{two}: node in maintenance" in why, why
        finally:
            real.cli("cluster", "restore", two, "--force")


def test_a_member_that_is_down_is_offline_and_takes_nothing(
    tmp_path: Path, real: RealCluster
) -> None:
    # A member whose daemon is gone: the servers call it Online for some seconds (its reads
    # fail: unreachable), then Offline (not read); to opendrs it is offline either way, and
    # nothing moves to it.
    one, two = real.names
    config = write_config(tmp_path, real, extra=BALANCE_NOW)
    with instances(real, ("stranded-ct", one, True)):
        pin(real, "stranded-ct", two)
        real.shutdown_daemon(two)
        seen = []
        for _ in range(2):
            seen.append(real.members()[two])
            result = opendrs("run", "--config", str(config), "--once")
            assert result.returncode == 0, result.stderr
            assert real.location("stranded-ct") == (one, "Running")
            assert (
                f"stranded-ct is on {one}, which its rules exclude; elsewhere: {two}: node "
                "offline" in result.stderr
            ), result.stderr
            unreachable = f"member {two} is unreachable" in result.stderr
            assert unreachable == (seen[-1] == "Online"), (seen, result.stderr)
            deadline = time.monotonic() + 60
            while real.members()[two] != "Offline":
                assert time.monotonic() < deadline, real.members()
                time.sleep(1)
        assert seen[-1] == "Offline", seen
        assert history(tmp_path, "SELECT * FROM migrations") == []
        shown = opendrs("status", "--config", str(config)).stdout
        assert [line.split()[:2] for line in shown.splitlines() if line.startswith(two)] == [
            [two, "offline"]
        ], shown
