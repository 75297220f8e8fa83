"""``POST /api/place`` of the daemon, run as a command against the fake Proxmox API: a bearer token
is needed, bad requests get a JSON 4xx, and the answer — from the daemon's last observation —
honours the rule of a resource pool (``backend.pools``) the new guest joins."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon import Daemon, send, served

pytest.importorskip("aiohttp", reason="the fake API is an aiohttp server")

GiB = 1024**3
HTTP_TOKEN = "place-token-0123456789"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    """A shadow daemon with a token-protected HTTP server (:func:`place_daemon`)."""
    with place_daemon(tmp_path_factory.mktemp("place")) as (running, address, _cluster):
        yield running, address


@contextlib.contextmanager
def place_daemon(folder: Path) -> Iterator[tuple[Daemon, str, Any]]:
    """A shadow daemon with a token-protected HTTP server: VMs 100 (pve1) and 101 (pve2) in the
    pool ``web`` kept apart, 102 on pve3 in no pool; the address it serves on, once it has
    observed the cluster, and the fake cluster."""
    pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
    pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")
    from backends.fakepve_fixture import three_nodes
    from pve_daemon import secret_file, shadow_config

    cluster = three_nodes(str(folder))
    for vmid, node, pool in ((100, "pve1", "web"), (101, "pve2", "web"), (102, "pve3", None)):
        add_vm(cluster, vmid, node, pool)
    token = secret_file(folder / "http-token", HTTP_TOKEN)
    config = shadow_config(folder / "run", cluster, http_token=token)
    _add_backend_keys(config, "  pools: {web: anti-affinity}\n")
    try:
        with Daemon(config) as running:
            address = served(running)
            _wait_for_observation(address)
            yield running, address, cluster
    finally:
        cluster.stop()


def add_vm(cluster: Any, vmid: int, node: str, pool: str | None) -> None:
    """A running VM of 2 vCPUs and 4 GiB (3 GiB used) added to the fake cluster."""
    config = {"cores": 2, "memory": 4096, "scsi0": f"ceph:vm-{vmid}-disk-0,size=8G"}
    vm = cluster.pve.add_vm(
        vmid, f"vm{vmid}", node=node, status="running", config=config, pool=pool
    )
    vm.stats.update(cpu=0.2, mem=3 * GiB)


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
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    status, text, got = send(
        address, "/api/place", method=method, token=token, body=data, headers=sent
    )
    return status, json.loads(text), got


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


def test_a_hard_affinity_brings_its_partners_rules(daemon: tuple[Daemon, str]) -> None:
    """With VM 100 (the pool ``web``'s, apart from 101): the two run together, never beside
    101; joining the pool as well contradicts the affinity, and the pool's rule is dropped."""
    _, address = daemon
    status, answer, _ = post(address, {"cpu": 1, "memory": "1GiB", "affinity": [100]})
    assert status == 200, answer
    assert answer["members"] == ["100"] and answer["rules"] == ["request affinity"]
    nodes = {row["node"]: row for row in answer["nodes"]}
    assert nodes["pve1"]["fits"] and nodes["pve3"]["fits"] and not nodes["pve2"]["fits"]
    (reason,) = nodes["pve2"]["reasons"]
    assert reason.startswith("hard anti-affinity with") and "101" in reason, reason
    both = {"cpu": 1, "memory": "1GiB", "affinity": [100], "pool": "web"}
    status, answer, _ = post(address, both)
    assert status == 200, answer
    assert answer["members"] == ["100"]
    assert all(row["fits"] for row in answer["nodes"]), answer["nodes"]


def test_the_answer_after_a_new_observation_reads_it(tmp_path: Path) -> None:
    request = {"cpu": 2, "memory": "4GiB", "pool": "web"}
    with place_daemon(tmp_path) as (_running, address, cluster):
        status, first, _ = post(address, request)
        assert status == 200 and first["best"] == "pve3", first
        assert post(address, request)[1] == first  # the same observation, the same answer
        (vm101,) = [vm for vm in cluster.pve.vms if vm.vmid == 101]
        vm101.node = "pve3"  # moved by hand: pve2 is free of the pool now
        deadline = time.monotonic() + 60
        while (answer := post(address, request)[1])["observed_at"] == first["observed_at"]:
            assert time.monotonic() < deadline, "no new observation within 60 s"
            time.sleep(0.2)
    assert answer["best"] == "pve2", answer
    reasons = {row["node"]: row["reasons"] for row in answer["nodes"]}
    assert "101" in reasons["pve3"][0] and "pool web" in reasons["pve3"][0], reasons


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
    assert send(address, "/api/state", token=HTTP_TOKEN, body=b"{}")[0] == 405


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


# -- answers from the observation, as the rebuilt constraints give them ----------------------

RULED = """\
version: 1
nodes:
  pve1: {cpu: 16, memory: 64GiB}
  pve2: {cpu: 16, memory: 64GiB}
  pve3: {cpu: 16, memory: 64GiB}
  pve4: {cpu: 8, memory: 32GiB, maintenance: true}
  arm1: {cpu: 16, memory: 64GiB, arch: aarch64}
guests:
  - {id: 100, node: pve1, cpu: 2, memory: 4GiB}
  - {id: 101, node: pve2, cpu: 2, memory: 4GiB}
  - {id: 102, node: pve3, cpu: 4, memory: 40GiB}
  - {id: 103, node: pve1, cpu: 2, memory: 8GiB}
  - {id: 104, node: pve1, cpu: 2, memory: 2GiB, state: stopped}
  - {id: 105, node: arm1, cpu: 2, memory: 2GiB, arch: aarch64}
rules:
  - {type: anti-affinity, name: pool web, guests: [100, 101], origin: pool}
  - {type: anti-affinity, name: plb_anti_affinity_dns, guests: [100, 102], origin: tag, hard: false}
  - {type: affinity, name: plb_affinity_db, guests: [103, 105], origin: tag, hard: false}
  - {type: affinity, name: pool db, guests: [103, 104], origin: pool}
  - {type: anti-affinity, name: spread, guests: [100, 101, 102, 103, 105]}
  - {type: pin, guests: [102], nodes: [pve3]}
"""

#: (request, whether the constraints are built again for it: only when a node-affinity rule
#: names the new guest's id or a guest a hard affinity joins it to).
RULED_REQUESTS: list[tuple[dict[str, Any], bool]] = [
    ({"memory": "4GiB"}, False),
    ({"cpu": 3, "memory": "6GiB", "name": "app1", "cpu_used": 1, "memory_used": "2GiB"}, False),
    ({"memory": "2GiB", "kind": "ct", "priority": 3}, False),
    ({"memory": "2GiB", "arch": "aarch64"}, False),
    ({"memory": "2GiB", "arch": "riscv64"}, False),
    ({"cpu": 4, "memory": "60GiB"}, False),
    ({"memory": "1GiB", "id": "100"}, False),
    ({"memory": "4GiB", "pool": "web"}, False),
    ({"memory": "4GiB", "pool": "nothing"}, False),
    ({"memory": "4GiB", "tags": ["plb_anti_affinity_dns", "other"]}, False),
    ({"memory": "4GiB", "tags": ["plb_affinity_db"]}, False),
    ({"memory": "4GiB", "anti_affinity": ["102", "103"], "pool": "web"}, False),
    ({"memory": "4GiB", "pool": "db"}, False),
    ({"memory": "4GiB", "affinity": ["101"]}, False),
    ({"memory": "4GiB", "affinity": ["101"], "tags": ["plb_affinity_db"]}, False),
    ({"memory": "4GiB", "affinity": ["100", "103"], "pool": "web"}, False),
    ({"memory": "4GiB", "affinity": ["104"], "anti_affinity": ["100"]}, False),
    ({"memory": "4GiB", "affinity": ["102"]}, True),
    ({"memory": "4GiB", "tags": ["spread"]}, False),
    ({"memory": "4GiB", "id": "pinned"}, True),
    ({"memory": "1GiB", "anti_affinity": ["999"]}, False),
    ({"memory": "1GiB", "tags": "web"}, False),
    ({"memory": 4096}, False),
]


def _ruled() -> Any:
    """:data:`RULED`, with a pin of the id ``pinned`` (no guest has it yet)."""
    from dataclasses import replace

    from opendrs.model.rules import NodeAffinity
    from opendrs.model.snapshot import loads

    cluster = loads(RULED)
    pin = NodeAffinity("pin-pinned", ("pinned",), {"pve2": 1}, strict=True)
    rules = replace(cluster.rules, node_affinity=(*cluster.rules.node_affinity, pin))
    return replace(cluster, rules=rules)


def _outcome(cluster: Any, request: dict[str, Any], observed: Any = None) -> object:
    """The answer as JSON text, or the refusal's status and message."""
    from opendrs.controller.place_api import PlaceError, place_for

    try:
        return json.dumps(place_for(cluster, request, observed))
    except PlaceError as refused:
        return refused.status, str(refused)


@pytest.mark.parametrize(("request_", "rebuilt"), RULED_REQUESTS)
def test_the_observation_answers_each_request_as_constraints_built_for_it_do(
    monkeypatch: pytest.MonkeyPatch, request_: dict[str, Any], rebuilt: bool
) -> None:
    from opendrs.engine import observed_placement

    cluster = _ruled()
    observed = observed_placement.ObservedPlacement.build(cluster)
    expected = _outcome(cluster, request_)
    built = []
    place_new = observed_placement.place_new
    monkeypatch.setattr(
        observed_placement, "place_new", lambda *args: built.append(args) or place_new(*args)
    )
    assert _outcome(cluster, request_, observed) == expected
    assert bool(built) == rebuilt


def test_on_a_generated_cluster_every_rule_joined_answers_alike() -> None:
    from bench.generate import generate

    from opendrs.engine.observed_placement import ObservedPlacement

    cluster = generate("M", seed=3, rules=True)
    observed = ObservedPlacement.build(cluster)
    ids = [g.id for g in cluster.guests]
    requests: list[dict[str, Any]] = [
        {"cpu": 4, "memory": "8GiB"},
        {"cpu": 200, "memory": "2TiB"},
        {"memory": "1GiB", "anti_affinity": ids[:4]},
        {"memory": "1GiB", "affinity": ids[10:12]},
    ]
    requests += [{"memory": "2GiB", "tags": [r.name]} for r in cluster.rules.guest_affinity[:40]]
    for request in requests:
        assert _outcome(cluster, request, observed) == _outcome(cluster, request), request


def test_each_observation_is_built_once_and_read_by_the_answers_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading
    from dataclasses import replace

    from opendrs.controller import place_api
    from opendrs.controller.loop import Cycle
    from opendrs.controller.place_api import PlaceView
    from opendrs.engine.observed_placement import ObservedPlacement

    built: list[object] = []

    class Counted(ObservedPlacement):
        @classmethod
        def build(cls, cluster: Any) -> ObservedPlacement:
            built.append(cluster)
            return ObservedPlacement.build(cluster)

    monkeypatch.setattr(place_api, "ObservedPlacement", Counted)
    cluster = _ruled()
    view = PlaceView()
    body = json.dumps({"memory": "4GiB", "pool": "web"}).encode()
    assert view.answer(body)[0] == 503
    view.cycle(Cycle(1.0, cluster, None))
    answers: list[tuple[Any, bytes]] = []
    threads = [threading.Thread(target=lambda: answers.append(view.answer(body))) for _ in "1234"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({a for a in answers}) == 1 and answers[0][0] == 200
    assert json.loads(answers[0][1])["best"] == "pve3" and built == [cluster]
    moved = tuple(replace(g, node="pve3") if g.id == "101" else g for g in cluster.guests)
    view.cycle(Cycle(2.0, replace(cluster, guests=moved), None))
    status, text = view.answer(body)
    assert status == 200 and json.loads(text)["best"] == "pve2", text
    assert len(built) == 2 and view.answer(body)[0] == 200 and len(built) == 2
