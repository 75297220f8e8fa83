"""A member in maintenance (Incus's ``Evacuated``) is never left without a word (issue 26, items 3
and 4): ``opendrs run --once`` as a subprocess against the fake Incus API on a unix socket.

m2 is evacuated and keeps instances Incus's evacuation left there and opendrs may not move — a VM
with a GPU passed through, a VM without ``migration.stateful`` (no live migration), a running
container (restart migration not allowed), an instance opendrs is told to ignore — and a VM
started two minutes ago, under the policy's ``min_uptime`` and the cluster's. The daemon moves the
young VM and warns of each other one."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import FakeIncus, GiB, Served, socket_path
from backends.incus_fixture import opendrs
from repairs import left_on

#: Why each instance stays on m2, as the daemon says it (in the order it observes them).
STAYS = {
    "c1": "container: restart migration not allowed",
    "gpu": "local device gpu0 (gpu)",
    "pinned": "ignored by a rule",
    "stateless": "locked (migration.stateful is not true)",
}


SAID = left_on("m2", STAYS)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Served]:
    incus = FakeIncus("m1")
    incus.migration_seconds = 0.1
    for name in ("m1", "m2", "m3"):
        incus.add_member(name, threads=16, memory=64 * GiB, load1=0.0, used_memory=GiB)
    incus.members["m2"].status = "Evacuated"
    live = {"limits.cpu": "2", "limits.memory": "4GiB", "migration.stateful": "true"}
    root = {"root": {"type": "disk", "pool": "ceph", "path": "/"}}
    just_now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=2)
    incus.add_instance(
        "gpu", "m2", config=live, devices={**root, "gpu0": {"type": "gpu"}}, cpu_rate=0.0
    )
    incus.add_instance("stateless", "m2", config={"limits.memory": "4GiB"}, devices=root)
    incus.add_instance("c1", "m2", type="container", config={"limits.memory": "1GiB"})
    incus.add_instance("pinned", "m2", config={**live, "user.opendrs.ignore": "true"}, devices=root)
    incus.add_instance(
        "young",
        "m2",
        config=live,
        devices=root,
        last_used_at=just_now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    incus.add_instance("other", "m1", config=live, devices=root)
    server = Served(incus, socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def test_run_once_moves_the_young_vm_and_warns_of_each_instance_left(
    tmp_path: Path, fake: Served
) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "version: 1\n"
        "mode: active\n"
        f"backend: {{type: incus, socket: {fake.socket}, timeout: 5s}}\n"
        "history: history.sqlite\n"
        "settings: {min_uptime: 10m}\n"
        "executor: {max_parallel: 2, poll_interval: 1s}\n"
    )
    done = opendrs("run", "--config", str(config), "--once")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"WARNING repair stuck: (.*)", done.stderr) == [SAID[n] for n in STAYS]
    (reason,) = re.findall(r"decision \(active\): (.*)", done.stderr)
    assert reason.startswith("repair: young is on m2, in maintenance; 1 migration")
    assert fake.fake.instance("young").location != "m2"
    assert {n: fake.fake.instance(n).location for n in STAYS} == dict.fromkeys(STAYS, "m2")
