"""Manual mode driven from outside: ``opendrs run`` in a subprocess against the fake Proxmox API on
loopback, and ``opendrs proposals``, ``approve``, ``reject`` and ``balance-now`` as an operator
types them."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, proxmox_config, running_on_pve1, three_nodes
from daemon import Daemon, eventually, opendrs, send, served

PROPOSED = r"proposal ([0-9a-f]{8}) \(balance\) waits for approval"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    """Three nodes, eight running VMs all on pve1: a balancer plans about five moves."""
    with three_nodes(str(tmp_path)) as cluster:
        running_on_pve1(cluster.pve, range(100, 108))
        yield cluster


def manual_config(tmp_path: Path, fake: FakeCluster, extra: str = "") -> Path:
    return proxmox_config(tmp_path, fake, mode="manual", extra=extra)


def proposals(config: Path, *options: str) -> list[dict[str, Any]]:
    done = opendrs("proposals", "--config", str(config), "--format", "json", *options)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["proposals"])


def proposal(config: Path, pid: str) -> dict[str, Any]:
    """Proposal ``pid`` as ``opendrs proposals --all`` lists it."""
    (kept,) = [p for p in proposals(config, "--all") if p["id"] == pid]
    return kept


def history(config: Path) -> dict[str, Any]:
    """``opendrs history --format json``."""
    return dict(json.loads(opendrs("history", "--config", str(config), "--format", "json").stdout))


def moved_by_hand(fake: FakeCluster, move: dict[str, Any], node: str) -> None:
    """The VM of ``move`` put on ``node`` behind the daemon's back."""
    (vm,) = [v for v in fake.pve.vms if str(v.vmid) == move["guest"]]
    vm.node = node


def migrations(tmp_path: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(tmp_path / "history.sqlite") as db:
        return db.execute("SELECT guest, source, target FROM migrations ORDER BY id").fetchall()


def first_proposal(daemon: Daemon) -> str:
    match = re.search(PROPOSED, daemon.wait_for(PROPOSED, timeout=60))
    assert match is not None
    return match.group(1)


def test_manual_mode_proposes_and_migrates_only_what_is_approved(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = manual_config(tmp_path, fake)
    with Daemon(config) as daemon:
        daemon.wait_for(r"manual mode.*proposes, migrates what an operator approves")
        pid = first_proposal(daemon)
        daemon.wait_for(r"decision \(manual\)", after=daemon.mark)  # later cycles: same proposal
        assert fake.pve.migrations == [] and migrations(tmp_path) == []
        (listed,) = proposals(config)
        assert listed["id"] == pid and listed["state"] == "open"
        text = opendrs("proposals", "--config", str(config))
        assert pid in text.stdout and "vm10" in text.stdout and "pve1 →" in text.stdout
        first = listed["moves"][0]
        done = opendrs("approve", pid, "--moves", f"1,{first['name']}", "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert "approved by" in done.stdout and "(1 of" in done.stdout
        assert "takes it now" in done.stdout
        daemon.wait_for(rf"proposal {pid} approved by \S+@cli: checked again, starting")
        daemon.wait_for(r"done .*pve1 → ")
        assert daemon.stop() == 0
    assert migrations(tmp_path) == [(first["guest"], "pve1", first["target"])]
    kept = proposal(config, pid)
    assert kept["state"] == "started" and kept["chosen"] == [1] and kept["by"].endswith("@cli")
    assert kept["decided"] is not None


def assert_verdict_recorded(tmp_path: Path, config: Path, pid: str, by: str) -> None:
    """The rejection of ``pid`` by ``by`` in ``opendrs history`` (text, JSON, JSON Lines) and
    in the decision log."""
    logged = [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]
    (verdict,) = [item for item in logged if item["kind"] == "verdict"]
    assert verdict["event"] == "rejected" and verdict["proposal"] == pid and verdict["by"] == by
    assert verdict["activity"] == "balance" and verdict["moves"] and verdict["time"].endswith("Z")
    shown = history(config)
    assert shown["verdicts"] == [verdict]
    lines = opendrs("history", "--config", str(config), "--format", "jsonl").stdout.splitlines()
    assert json.dumps(verdict, ensure_ascii=False, separators=(",", ":")) in lines
    text = opendrs("history", "--config", str(config), columns=250).stdout
    assert "Verdicts on proposals (1)" in text
    assert re.search(rf"rejected +{re.escape(by)} +{pid} +balance", text)


def test_a_rejected_proposal_starts_nothing_and_is_not_proposed_again(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = manual_config(tmp_path, fake, extra="log: {decisions: decisions.jsonl}\n")
    with Daemon(config) as daemon:
        pid = first_proposal(daemon)
        done = opendrs("reject", pid, "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert f"proposal {pid} rejected by" in done.stdout
        by = done.stdout.split(" rejected by ")[1].split(":")[0]
        assert_verdict_recorded(tmp_path, config, pid, by)
        mark = daemon.mark
        for _ in range(3):  # three more decisions: the same plan, not proposed again
            mark = daemon.mark
            daemon.wait_for(r"decision \(manual\)", after=mark)
        assert daemon.count(PROPOSED) == 1
        again = opendrs("approve", pid, "--config", str(config))
        assert again.returncode == 2
        assert again.stderr.strip() == f"error: proposal {pid} is rejected, not open"
        assert daemon.stop() == 0
    assert fake.pve.migrations == [] and migrations(tmp_path) == []


def test_an_approved_proposal_made_stale_expires_at_the_restart(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = manual_config(tmp_path, fake)
    with Daemon(config) as daemon:
        pid = first_proposal(daemon)
        assert daemon.stop() == 0
    (listed,) = proposals(config)
    done = opendrs("approve", pid, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert "the daemon does not run" in done.stdout
    # Meanwhile, someone moves the first guest of the proposal by hand.
    moved = listed["moves"][0]
    elsewhere = "pve3" if moved["target"] == "pve2" else "pve2"
    moved_by_hand(fake, moved, elsewhere)
    with Daemon(config) as daemon:
        line = daemon.wait_for(rf"proposal {pid} expired: ", timeout=60)
        assert f"the guest is on {elsewhere} now" in line
        first_proposal(daemon)  # the daemon proposes afresh on the cluster as it is
        assert daemon.stop() == 0
    assert migrations(tmp_path) == []
    kept = proposal(config, pid)
    assert kept["state"] == "expired" and "now" in kept["note"]


def approved_alone(tmp_path: Path, fake: FakeCluster) -> tuple[Path, str, dict[str, Any], str]:
    """A proposal made by a daemon since stopped, its first move alone approved: the config, the
    proposal's id, the move (pve1 → X) and the node it does not go to."""
    config = manual_config(tmp_path, fake)
    with Daemon(config) as daemon:
        pid = first_proposal(daemon)
        assert daemon.stop() == 0
    (listed,) = proposals(config)
    assert len(listed["moves"]) > 1
    move = listed["moves"][0]
    done = opendrs("approve", pid, "--moves", "1", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return config, pid, move, "pve3" if move["target"] == "pve2" else "pve2"


def busy_on(fake: FakeCluster, node: str, vmids: range, memory_mib: int, cpu: float) -> None:
    """Running VMs ``vmids`` of one core and ``memory_mib`` MiB on ``node``, ``cpu`` busy."""
    for vmid in vmids:
        vm = fake.pve.add_vm(
            vmid,
            f"vm{vmid}",
            node=node,
            status="running",
            config={"cores": 1, "memory": memory_mib, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"},
        )
        vm.stats.update(cpu=cpu, mem=memory_mib * 2**20)


def test_an_approved_part_that_leaves_the_spread_but_evens_the_load_is_carried_out(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config, pid, move, other = approved_alone(tmp_path, fake)
    # Meanwhile the other node became the busiest and an idle pve4 joined: the move touches
    # neither the busiest nor the idlest node, so the spread stays; the load is evener after it.
    busy_on(fake, other, range(200, 207), memory_mib=3584, cpu=0.6)
    fake.pve.add_node("pve4", cpu=8, memory=32 * 2**30, base_memory=2**30)
    with Daemon(config) as daemon:
        daemon.wait_for(rf"proposal {pid} approved by \S+@cli: checked again, starting", timeout=60)
        daemon.wait_for(rf"done .*pve1 → {move['target']}")
        assert daemon.count(rf"proposal {pid} expired") == 0
        assert daemon.stop() == 0
    assert migrations(tmp_path) == [(move["guest"], "pve1", move["target"])]
    assert proposal(config, pid)["state"] == "started"


@pytest.mark.parametrize("meanwhile", ["target filled", "guest moved"])
def test_an_approved_part_is_refused_with_the_true_reason(
    tmp_path: Path, fake: FakeCluster, meanwhile: str
) -> None:
    config, pid, move, other = approved_alone(tmp_path, fake)
    if meanwhile == "target filled":  # 30 of its 31 GiB taken: the guest's 3 GiB overload it
        busy_on(fake, move["target"], range(200, 208), memory_mib=3840, cpu=0.1)
        why = rf"the moves would break: node {move['target']} over capacity in memory$"
    else:
        moved_by_hand(fake, move, other)
        label = rf"{move['name']} \({move['guest']}\) pve1 → {move['target']}"
        why = rf"{label}: the guest is on {other} now$"
    with Daemon(config) as daemon:
        line = daemon.wait_for(rf"proposal {pid} expired: ", timeout=60)
        assert re.search(why, line.rstrip()), line
        assert "imbalance" not in line
        assert daemon.stop() == 0
    assert migrations(tmp_path) == []
    assert proposal(config, pid)["state"] == "expired"


def test_an_open_proposal_expires_when_its_guest_moves(tmp_path: Path, fake: FakeCluster) -> None:
    config = manual_config(tmp_path, fake)
    with Daemon(config) as daemon:
        pid = first_proposal(daemon)
        (listed,) = proposals(config)
        moved = listed["moves"][0]
        moved_by_hand(fake, moved, moved["target"])
        line = daemon.wait_for(rf"proposal {pid} expired: ", timeout=60)
        assert "the guest is on" in line
        assert daemon.stop() == 0
    assert migrations(tmp_path) == []


def test_an_open_proposal_expires_when_older_than_proposal_ttl(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = manual_config(tmp_path, fake, extra="proposal_ttl: 2s\n")
    with Daemon(config) as daemon:
        daemon.wait_for(r"a proposal expires after 2s")
        pid = first_proposal(daemon)
        line = daemon.wait_for(rf"proposal {pid} expired: ", timeout=60)
        assert line.rstrip().endswith("expired: older than 2s (proposal_ttl)")
        assert daemon.stop() == 0
    assert fake.pve.migrations == [] and migrations(tmp_path) == []
    kept = proposal(config, pid)
    assert kept["state"] == "expired" and kept["note"] == "older than 2s (proposal_ttl)"


def test_automatic_balance_acts_without_approval(tmp_path: Path, fake: FakeCluster) -> None:
    config = manual_config(tmp_path, fake, extra="automatic: [balance]\n")
    with Daemon(config) as daemon:
        daemon.wait_for(r"started .*pve1 → ", timeout=60)
        assert daemon.count(PROPOSED) == 0
        assert daemon.stop() == 0
    assert migrations(tmp_path)


@pytest.mark.parametrize(
    ("mode", "said"), [("manual", "proposed (manual mode)"), ("active", "acted on (active mode)")]
)
def test_balance_now_decides_at_once_whatever_the_interval(
    tmp_path: Path, fake: FakeCluster, mode: str, said: str
) -> None:
    config = proxmox_config(tmp_path, fake, mode=mode)
    text = config.read_text().replace("interval: 1s, hold: 1", "interval: 1h, hold: 6")
    config.write_text(text)
    with Daemon(config) as daemon:
        daemon.wait_for(rf"decision \({mode}\): .*(hold|observation)")
        assert daemon.count(PROPOSED) == 0 and daemon.count(r"started .*pve1 → ") == 0
        done = opendrs("balance-now", "--config", str(config))
        assert done.returncode == 0, done.stderr
        assert said in done.stdout and "takes it now" in done.stdout
        daemon.wait_for(r"balance now, asked by \S+@cli")
        if mode == "manual":
            first_proposal(daemon)
        else:
            daemon.wait_for(r"started .*pve1 → ")
        assert daemon.stop() == 0
    assert (migrations(tmp_path) == []) == (mode == "manual")


def test_cli_errors_are_one_line(tmp_path: Path, fake: FakeCluster) -> None:
    config = manual_config(tmp_path, fake)
    done = opendrs("approve", "abcd1234", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and "no history" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    with Daemon(config) as daemon:
        pid = first_proposal(daemon)
        assert daemon.stop() == 0
    for args, message in (
        (("approve", "abcd1234"), f"error: ID: no proposal 'abcd1234' (open ones: {pid})"),
        (("reject", "zz"), f"error: ID: no proposal 'zz' (open ones: {pid})"),
        (("approve", pid, "--moves", "99"), f"error: --moves: proposal {pid} has no move '99'"),
    ):
        done = opendrs(*args, "--config", str(config))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(message) and len(done.stderr.strip().splitlines()) == 1
    assert proposals(config)[0]["state"] == "open"
    status = opendrs("status", "--config", str(config), "--format", "json")
    assert json.loads(status.stdout)["history"]["proposals"] == [pid]
    text = opendrs("status", "--config", str(config)).stdout
    assert f"waiting for approval: {pid}" in text
    eventually(lambda: fake.pve.migrations == [])


# -- the dashboard's writes (http.write) ---------------------------------------------------------

WRITE_TOKEN = "s3cret-dashboard-token"


def http_config(tmp_path: Path, fake: FakeCluster, write: str = "true") -> Path:
    (tmp_path / "http.token").write_text(WRITE_TOKEN + "\n")
    (tmp_path / "http.token").chmod(0o600)
    http = (
        f"http: {{listen: '127.0.0.1:0', token_file: http.token, write: {write}, "
        "token_name: ops}\nlog: {decisions: decisions.jsonl}\n"
    )
    return manual_config(tmp_path, fake, extra=http)


def request(
    address: str, path: str, *, token: str | None = WRITE_TOKEN, **options: Any
) -> tuple[int, str]:
    """The status and body of one request (a POST unless ``method`` says), with the token."""
    return send(address, path, token=token, **options)[:2]


def test_the_dashboard_approves_with_the_token_from_its_own_origin(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = http_config(tmp_path, fake)
    with Daemon(config) as daemon:
        address = served(daemon)
        pid = first_proposal(daemon)
        status, body = request(address, "/api/proposals", method="GET")
        assert status == 200 and [p["id"] for p in json.loads(body)["proposals"]] == [pid]
        # The page without the token: its frame and token field, no data of the cluster.
        for token in (None, "wrong"):
            status, frame = request(address, "/", method="GET", token=token)
            assert status == 401 and 'id="token"' in frame and 'id="panel"' in frame, frame
            assert "pve1" not in frame and "vm10" not in frame and "manual mode" not in frame
        status, page = request(address, "/", method="GET")
        assert status == 200 and 'id="token"' in page and "vm10" in page
        approve = f"/api/proposals/{pid}/approve"
        # No token, a wrong one, a cookie alone, another origin: refused, nothing recorded.
        assert request(address, approve, token=None)[0] == 401
        assert request(address, approve, token="wrong")[0] == 401
        cookie = {"Cookie": f"token={WRITE_TOKEN}"}
        assert request(address, approve, token=None, headers=cookie)[0] == 401
        evil = {"Origin": "http://evil.example"}
        status, body = request(address, approve, headers=evil)
        assert status == 403 and "evil.example" in body
        assert request(address, "/api/proposals/ffffffff/approve")[0] == 404
        assert request(address, approve, body=b'{"moves": [99]}')[0] == 409
        assert request(address, approve, body=b"not json")[0] == 400
        assert proposals(config)[0]["state"] == "open"
        # The write paths take no other method; every other path stays read-only.
        assert request(address, approve, method="PUT")[0] == 405
        for path in ("/", "/api/state", "/metrics", "/healthz"):
            assert request(address, path, method="POST")[0] == 405
        own = {"Origin": f"http://{address}", "Content-Type": "application/json"}
        status, body = request(address, approve, headers=own, body=b'{"moves": [1]}')
        assert status == 200, body
        assert json.loads(body) == {"by": "ops@http", "chosen": [1], "id": pid, "state": "approved"}
        daemon.wait_for(rf"proposal {pid} approved by ops@http: checked again, starting")
        daemon.wait_for(r"done .*pve1 → ")
        assert request(address, approve)[0] == 409  # no longer open
        status, body = request(address, "/api/balance-now")
        assert status == 202 and json.loads(body)["by"] == "ops@http"
        daemon.wait_for(r"balance now, asked by ops@http")
        assert daemon.stop() == 0
    assert len(migrations(tmp_path)) == 1
    shown = history(config)
    (verdict,) = shown["verdicts"]
    assert (verdict["event"], verdict["by"], verdict["proposal"]) == ("approved", "ops@http", pid)
    assert len(verdict["moves"]) == 1
    logged = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in logged if '"kind":"verdict"' in line] == [verdict]


def test_the_dashboard_rejects_and_stays_read_only_without_write(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = http_config(tmp_path, fake)
    with Daemon(config) as daemon:
        address = served(daemon)
        pid = first_proposal(daemon)
        status, body = request(address, f"/api/proposals/{pid}/reject")
        assert status == 200 and json.loads(body)["state"] == "rejected"
        assert daemon.stop() == 0
    kept = proposal(config, pid)
    assert kept["state"] == "rejected" and kept["by"] == "ops@http"
    config = http_config(tmp_path, fake, write="false")
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(manual\)")
        assert request(address, "/api/balance-now")[0] == 405
        assert request(address, "/api/proposals", method="GET")[0] == 404
        assert daemon.stop() == 0
    assert migrations(tmp_path) == []
