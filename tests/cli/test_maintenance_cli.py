"""``opendrs maintenance enter|leave NODE --config FILE`` against a fake Incus API (the real LXD and
Incus clusters' test is in ``tests/backends/test_real_cluster.py``), and its one-line refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import FakeIncus, Served, socket_path
from backends.incus_fixture import small_cluster
from opendrs.cli.main import main
from opendrs.cli.maintenance_command import run_maintenance, show_outcome
from opendrs.model.cluster import Cluster, Guest, Node

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    incus = small_cluster(FakeIncus())
    incus.migration_seconds = 0.05
    server = Served(incus, socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def config_file(tmp_path: Path, backend: str) -> str:
    path = tmp_path / "opendrs.yaml"
    # Shadow: the command acts all the same (an explicit request, not a policy's decision).
    path.write_text(f"version: 1\nmode: shadow\nbackend: {backend}\nlog: {{level: warning}}\n")
    return str(path)


def incus_config(tmp_path: Path, fake: Served) -> str:
    return config_file(tmp_path, f"{{type: incus, socket: {fake.socket}, timeout: 5s}}")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_enter_evacuates_the_member_and_reports_the_moves(
    tmp_path: Path, fake: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    config = incus_config(tmp_path, fake)
    status, out, err = run(
        capsys, "maintenance", "enter", "m2", "--config", config, "--format", "json"
    )
    assert status == 0, err
    report = json.loads(out)
    assert {k: report[k] for k in ("node", "action", "changed", "maintenance")} == {
        "node": "m2",
        "action": "enter",
        "changed": True,
        "maintenance": True,
    }
    assert report["moved"] == [{"guest": "c2", "from": "m2", "to": "m1"}]
    assert report["on_node"] == [] and report["seconds"] >= 0.05
    assert fake.fake.members["m2"].status == "Evacuated"
    posted = [r for r in fake.fake.requests if r[0] == "POST"]
    assert [(r[1], r[3]) for r in posted] == [
        ("/1.0/cluster/members/m2/state", {"action": "evacuate"})
    ]


def test_leave_restores_the_member_and_guests_come_back(
    tmp_path: Path, fake: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    config = incus_config(tmp_path, fake)
    assert run(capsys, "maintenance", "enter", "m2", "--config", config)[0] == 0
    status, out, err = run(capsys, "maintenance", "leave", "m2", "--config", config)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("node m2: out of maintenance (restored by the platform in ")
    assert lines[1:] == ["  c2  m1 → m2"]
    assert fake.fake.members["m2"].status == "Online"
    assert fake.fake.instance("c2").location == "m2"


def test_a_node_already_in_that_state_is_left_alone(
    tmp_path: Path, fake: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    config = incus_config(tmp_path, fake)
    status, out, _ = run(capsys, "maintenance", "leave", "m1", "--config", config)
    assert (status, out) == (0, "node m1 is not in maintenance: nothing done\n")
    fake.fake.members["m3"].status = "Evacuated"
    status, out, _ = run(capsys, "maintenance", "enter", "m3", "--config", config)
    assert (status, out) == (0, "node m3 is already in maintenance: nothing done\n")
    assert not [r for r in fake.fake.requests if r[0] == "POST"]


def test_an_unknown_node_exits_2_before_anything_is_asked(
    tmp_path: Path, fake: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(
        capsys, "maintenance", "enter", "m9", "--config", incus_config(tmp_path, fake)
    )
    assert (status, out) == (2, "")
    assert err == "error: NODE: no node 'm9' in the cluster (its nodes: m1, m2, m3)\n"
    assert not [r for r in fake.fake.requests if r[0] == "POST"]


def test_a_failed_evacuation_exits_1_with_its_reason(
    tmp_path: Path, fake: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.fake.fail("POST", "/1.0/cluster/members/m2/state", 500, "Failed to migrate instance c2")
    status, out, err = run(
        capsys, "maintenance", "enter", "m2", "--config", incus_config(tmp_path, fake)
    )
    assert (status, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith(
        "error: node m2: the platform's evacuation failed: POST /1.0/cluster/members/m2/state"
    )
    assert "Failed to migrate instance c2" in err


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        (
            "{type: sim, scenario: 'builtin:demo', days: 0.1}",
            "backend sim: opendrs cannot put a node into maintenance through it (the incus "
            "backend can): the simulator's maintenance comes from its scenario",
        ),
        (
            "{type: proxmox, hosts: ['127.0.0.1:9'], user: 'opendrs@pve!drs', token_file: token}",
            "backend proxmox: opendrs cannot put a node into maintenance through it (the incus "
            "backend can): Proxmox VE's API has no call for node maintenance: run "
            "'ha-manager crm-command node-maintenance disable pve1' on a cluster node",
        ),
    ],
)
def test_a_backend_without_platform_maintenance_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str, reason: str
) -> None:
    (tmp_path / "token").write_text("secret\n")
    (tmp_path / "token").chmod(0o600)
    config = config_file(tmp_path, backend)
    status, out, err = run(capsys, "maintenance", "leave", "pve1", "--config", config)
    assert (status, out, err) == (2, "", f"error: {config}: {reason}\n")


def test_a_bad_action_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["maintenance", "start", "m1", "--config", "x.yaml"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'start'" in err


GIB = 1024**3


class _NamedGuests:
    """A platform that moves guest 101, named db1, off ``pve2`` and leaves 102 (web1) stopped
    there: the report names them as the operator knows them."""

    name = "named"

    def __init__(self) -> None:
        self.evacuated = False

    def observe(self) -> Cluster:
        nodes = (Node("pve1", 8, 16 * GIB), Node("pve2", 8, 16 * GIB, maintenance=self.evacuated))
        moved = Guest("101", "pve1" if self.evacuated else "pve2", name="db1", memory=GIB)
        return Cluster(nodes, (moved, Guest("102", "pve2", name="web1", memory=GIB)))

    def evacuate(self, node: str) -> None:
        self.evacuated = True

    def restore(self, node: str) -> None:
        self.evacuated = False


def test_the_report_names_guests_and_json_keeps_their_ids() -> None:
    platform = _NamedGuests()
    outcome = run_maintenance(platform, "opendrs.yaml", "pve2", enter=True)  # type: ignore[arg-type]
    lines = show_outcome(outcome).splitlines()
    assert lines[1:] == ["  db1 (101)  pve2 → pve1", "  left on pve2: web1 (102)"]
    data = outcome.as_dict()
    assert data["moved"] == [{"guest": "101", "from": "pve2", "to": "pve1"}]
    assert data["on_node"] == ["102"]
