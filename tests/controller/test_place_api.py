"""``POST /api/place`` of the daemon, run as a command against the fake Proxmox API: a bearer token
is needed, bad requests get a JSON 4xx, and the answer — from the daemon's last observation —
honours the rule of a resource pool (``backend.pools``) the new guest joins."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import Daemon, served

pytest.importorskip("aiohttp", reason="the fake API is an aiohttp server")

GiB = 1024**3
HTTP_TOKEN = "place-token-0123456789"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    """A shadow daemon with a token-protected HTTP server: VMs 100 (pve1) and 101 (pve2) in the
    pool ``web`` kept apart, 102 on pve3 in no pool; the address it serves on."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes
    from pve_daemon import secret_file, shadow_config

    folder = tmp_path_factory.mktemp("place")
    cluster = three_nodes(str(folder))
    for vmid, node, pool in ((100, "pve1", "web"), (101, "pve2", "web"), (102, "pve3", None)):
        config = {"cores": 2, "memory": 4096, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"}
        vm = cluster.pve.add_vm(
            vmid, f"vm{vmid}", node=node, status="running", config=config, pool=pool
        )
        vm.stats.update(cpu=0.2, mem=3 * GiB)
    token = secret_file(folder / "http-token", HTTP_TOKEN)
    config = shadow_config(folder / "run", cluster, http_token=token)
    _add_backend_keys(config, "  pools: {web: anti-affinity}\n")
    try:
        with Daemon(config) as running:
            address = served(running)
            _wait_for_observation(address)
            yield running, address
    finally:
        cluster.stop()


def _add_backend_keys(config: Path, keys: str) -> None:
    """``keys`` added to the backend section of ``config`` (after its ``retries``)."""
    text = config.read_text()
    config.write_text(text.replace("  retries: 1\n", "  retries: 1\n" + keys, 1))


def _wait_for_observation(address: str) -> None:
    deadline = time.monotonic() + 60
    while post(address, {"memory": "1G"})[0] == 503:
        assert time.monotonic() < deadline, "no observation within 60 s"
        time.sleep(0.2)


def post(
    address: str,
    body: object,
    *,
    token: str | None = HTTP_TOKEN,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, JSON body and headers of one request to ``/api/place`` (loopback only)."""
    assert address.startswith("127."), address
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"http://{address}/api/place",
        data=data if method == "POST" else None,
        headers=sent,
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def test_a_pool_anti_affinity_keeps_the_new_guest_off_its_members_nodes(
    daemon: tuple[Daemon, str],
) -> None:
    _, address = daemon
    status, answer, headers = post(address, {"cpu": 2, "memory": "4GiB", "pool": "web"})
    assert status == 200, answer
    assert headers["Content-Type"] == "application/json"
    assert answer["best"] == "pve3"
    assert answer["rules"] == ["pool web"]
    nodes = {row["node"]: row for row in answer["nodes"]}
    assert set(nodes) == {"pve1", "pve2", "pve3"}
    assert nodes["pve3"]["fits"] and nodes["pve3"]["rank"] == 1
    for node, partner in (("pve1", "100"), ("pve2", "101")):
        assert not nodes[node]["fits"]
        (reason,) = nodes[node]["reasons"]
        assert "pool web" in reason and partner in reason, reason


def test_without_the_pool_every_node_is_ranked(daemon: tuple[Daemon, str]) -> None:
    _, address = daemon
    status, answer, _ = post(address, {"cpu": "1", "memory": "2G", "name": "web9"})
    assert status == 200, answer
    assert answer["rules"] == [] and answer["guest"]["name"] == "web9"
    assert sorted(row["rank"] for row in answer["nodes"]) == [1, 2, 3]
    assert answer["best"] == next(r["node"] for r in answer["nodes"] if r["rank"] == 1)


def test_capacity_is_a_reason(daemon: tuple[Daemon, str]) -> None:
    _, address = daemon
    status, answer, _ = post(address, {"cpu": 2, "memory": "40GiB"})
    assert status == 200, answer
    assert answer["best"] is None
    assert all(r["reasons"][0].startswith("capacity: ") for r in answer["nodes"]), answer


def test_a_request_without_the_token_is_refused(daemon: tuple[Daemon, str]) -> None:
    _, address = daemon
    for token in (None, "not-the-token"):
        status, answer, headers = post(address, {"memory": "1G"}, token=token)
        assert status == 401, answer
        assert answer == {"error": "a bearer token is needed"}
        assert headers["WWW-Authenticate"] == 'Bearer realm="opendrs"'


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "not JSON: "),
        (b"[1, 2]", 400, "expected a JSON object"),
        ({"cpu": 2}, 422, "memory is required"),
        ({"memory": 4096}, 422, "memory=4096: give a unit, e.g. 4096M or 4G"),
        ({"memory": "4 parsecs"}, 422, "memory: "),
        ({"memory": "1G", "colour": "red"}, 400, "unknown key 'colour'"),
        ({"memory": "1G", "cpu": True}, 422, "cpu: expected a number or a string"),
        ({"memory": "1G", "anti_affinity": ["999"]}, 422, "anti_affinity: no guest '999'"),
        ({"memory": "1G", "pool": 7}, 422, "pool: expected a pool id"),
    ],
)
def test_bad_input_is_a_json_4xx(
    daemon: tuple[Daemon, str], body: object, status: int, error: str
) -> None:
    _, address = daemon
    got, answer, _ = post(address, body)
    assert got == status, answer
    assert answer["error"].startswith(error), answer


def test_get_a_foreign_origin_and_another_type_are_refused(daemon: tuple[Daemon, str]) -> None:
    _, address = daemon
    status, answer, headers = post(address, None, method="GET")
    assert (status, headers["Allow"]) == (405, "POST"), answer
    status, answer, _ = post(address, {"memory": "1G"}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "origin" in answer["error"], answer
    same = {"Origin": f"http://{address}"}
    assert post(address, {"memory": "1G"}, headers=same)[0] == 200
    status, answer, _ = post(address, {"memory": "1G"}, headers={"Content-Type": "text/plain"})
    assert status == 415, answer


def test_the_rest_of_the_server_stays_read_only(daemon: tuple[Daemon, str]) -> None:
    _, address = daemon
    request = urllib.request.Request(
        f"http://{address}/api/state",
        data=b"{}",
        headers={"Authorization": f"Bearer {HTTP_TOKEN}"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405


def test_without_an_http_token_the_place_api_is_off(tmp_path: Path) -> None:
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes
    from pve_daemon import shadow_config

    cluster = three_nodes(str(tmp_path))
    try:
        config = shadow_config(tmp_path / "run", cluster, http=True)
        with Daemon(config) as running:
            status, answer, _ = post(served(running), {"memory": "1G"}, token=None)
    finally:
        cluster.stop()
    assert status == 403 and answer == {"error": "/api/place needs http.token_file"}


# -- the answer, without the daemon ---------------------------------------------------------

SNAPSHOT = """\
version: 1
nodes:
  pve1: {cpu: 16, memory: 64GiB}
  pve2: {cpu: 16, memory: 64GiB}
  pve3: {cpu: 16, memory: 64GiB, maintenance: true}
guests:
  - {id: 100, node: pve1, cpu: 2, memory: 4GiB}
  - {id: 101, node: pve2, cpu: 2, memory: 4GiB}
rules:
  - {type: anti-affinity, name: plb_anti_affinity_dns, guests: [100, 101], origin: tag, hard: false}
"""


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    from opendrs.controller.place_api import place_for
    from opendrs.model.snapshot import loads

    return place_for(loads(SNAPSHOT), request)


def test_a_tag_joins_its_rule_and_a_soft_break_is_a_reason() -> None:
    answer = _answer({"memory": "2GiB", "tags": ["plb_anti_affinity_dns", "other"]})
    assert answer["rules"] == ["plb_anti_affinity_dns"]
    assert answer["notes"] == ["no rule 'other' in the daemon's view"]
    rows = {row["node"]: row for row in answer["nodes"]}
    soft = "breaks anti-affinity 'plb_anti_affinity_dns' (soft, origin tag)"
    assert rows["pve1"]["fits"] and rows["pve1"]["reasons"] == [soft]
    assert rows["pve3"] == {"node": "pve3", "fits": False, "reasons": ["node in maintenance"]}


def test_a_hard_affinity_names_the_partner_that_moves_with_it() -> None:
    answer = _answer({"memory": "2GiB", "affinity": [100]})
    assert answer["members"] == ["100"] and answer["rules"] == ["request affinity"]
    assert answer["best"] in ("pve1", "pve2")


def test_a_bug_placing_is_a_json_500_and_the_server_goes_on() -> None:
    from opendrs.controller.config import HttpConfig
    from opendrs.controller.http_server import MetricsServer
    from opendrs.controller.metrics import DaemonMetrics
    from opendrs.controller.place_api import PlaceView

    class Broken(PlaceView):
        def answer(self, body: bytes) -> Any:
            raise RuntimeError("a bug")

    server = MetricsServer(HttpConfig("127.0.0.1", 0), DaemonMetrics(), HTTP_TOKEN, None, Broken())
    server.start()
    try:
        status, answer, _ = post(server.address, {"memory": "1G"})
        assert (status, answer) == (500, {"error": "cannot place: see the log"})
        assert post(server.address, {"memory": "1G"})[0] == 500  # still answering
    finally:
        server.stop()
