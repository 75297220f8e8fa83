"""The Incus backend's observation, against a fake Incus API on loopback."""

from __future__ import annotations

import logging
import time

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")

from backends.fakeincus import GiB, MiB, Served
from backends.incus_fixture import served, socket_config
from opendrs.backends.incus.assemble import CpuSample, cpu_rate
from opendrs.backends.incus.client import Client
from opendrs.backends.incus.observe import Observer
from opendrs.backends.incus.values import cpu_limit, incus_duration, memory_limit
from opendrs.engine.constraints import check_rules
from opendrs.model.cluster import Cluster, Settings

__all__ = ["served"]


def observe(server: Served, **fields: object) -> tuple[Cluster, Observer]:
    client = Client(socket_config(server, **fields))
    observer = Observer(client, socket_config(server, **fields), Settings())
    try:
        return observer.observe(), observer
    finally:
        client.close()


# -- values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4", (4.0, ())),
        ("0-3,5", (5.0, (0, 1, 2, 3, 5))),
        ("2,", (1.0, (2,))),
        ("", (None, ())),
        ("3-1", (None, ())),
        ("many", (None, ())),
    ],
)
def test_cpu_limits(text: str, expected: tuple[float | None, tuple[int, ...]]) -> None:
    assert cpu_limit(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * GiB),
        ("512MB", 512 * 10**6),
        ("512MiB", 512 * MiB),
        ("1073741824", GiB),
        ("50%", 32 * GiB),
        ("150%", None),
        ("lots", None),
    ],
)
def test_memory_limits(text: str, expected: int | None) -> None:
    assert memory_limit(text, 64 * GiB) == expected


def test_incus_durations() -> None:
    assert incus_duration("6H") == 6 * 3600
    assert incus_duration("1d 3H") == 27 * 3600
    assert incus_duration("1H 2H") is None
    assert incus_duration("6h") is None


def test_cpu_rates_between_two_observations() -> None:
    row = {"status": "Running", "state": {"cpu": {"usage": 30 * 10**9}}, "last_used_at": ""}
    assert cpu_rate(row, CpuSample(10 * 10**9, 100.0), 110.0) == pytest.approx(2.0)
    assert cpu_rate(row, None, 110.0) is None
    stopped = dict(row, status="Stopped")
    assert cpu_rate(stopped, CpuSample(0, 100.0), 110.0) is None


# -- the observation -------------------------------------------------------------------------


def test_members_become_nodes(served: Served) -> None:
    cluster, observer = observe(served)
    assert [n.name for n in cluster.nodes] == ["m1", "m2", "m3"]
    m1, _, m3 = cluster.nodes
    assert (m1.cpu, m1.memory, m1.arch) == (16.0, 64 * GiB, "x86_64")
    assert m3.arch == "aarch64" and m3.tags == ("arm",)
    assert m1.storage == {"local": 500 * GiB}
    # The host's own load: the load average and the used memory, less its instances'.
    guests_m1 = [g for g in cluster.guests if g.node == "m1" and g.state == "running"]
    assert m1.base_memory == 20 * GiB - sum(g.memory_used or 0 for g in guests_m1)
    assert m1.base_cpu == pytest.approx(2.0 - sum(g.cpu_used or 0 for g in guests_m1), abs=0.05)
    assert (observer.local, observer.leader) == ("m1", "m1")


def test_instances_become_guests(served: Served) -> None:
    cluster, _ = observe(served)
    assert [g.id for g in cluster.guests] == ["c1", "c2", "vm1", "vm2"]
    vm1 = cluster.guest("vm1")
    assert (vm1.kind, vm1.node, vm1.cpu, vm1.memory) == ("vm", "m1", 4.0, 8 * GiB)
    assert vm1.disks[0].pool == "ceph" and vm1.disks[0].shared
    assert vm1.memory_used == 6 * GiB
    # No earlier observation: the counter over the hour since it started.
    assert vm1.cpu_used == pytest.approx(0.0, abs=0.01)
    vm2 = cluster.guest("vm2")
    assert (vm2.cpu, vm2.memory) == (3.0, 32 * GiB)
    # Without migration.stateful Incus cannot move it live: it is held as locked.
    assert (vm1.lock, vm2.lock) == (None, "migration.stateful is not true")
    c1, c2 = cluster.guest("c1"), cluster.guest("c2")
    assert (c1.kind, c1.memory) == ("ct", 512 * 10**6)
    assert (c2.state, c2.cpu_used, c2.memory_used) == ("stopped", 0.0, 0)


def test_cpu_use_is_a_rate_between_observations(served: Served) -> None:
    client = Client(socket_config(served))
    observer = Observer(client, socket_config(served), Settings())
    try:
        observer.observe()
        time.sleep(0.5)
        cluster = observer.observe()
    finally:
        client.close()
    assert cluster.guest("vm1").cpu_used == pytest.approx(2.0, rel=0.2)
    assert cluster.guest("vm2").cpu_used == pytest.approx(1.0, rel=0.2)


def test_every_project(served: Served) -> None:
    cluster, _ = observe(served, all_projects=True)
    assert "web/w1" in {g.id for g in cluster.guests}
    cluster, _ = observe(served, project="web")
    assert [g.id for g in cluster.guests] == ["web/w1"]


def test_member_state_501_falls_back(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    served.fake.member_state = False
    caplog.set_level(logging.INFO)
    cluster, _ = observe(served)
    assert cluster.node("m1").base_cpu == 0.0
    assert cluster.node("m1").base_memory > 0
    assert (
        len(served.fake.calls("GET", "/1.0/cluster/members/m1/state"))
        + len(served.fake.calls("GET", "/1.0/cluster/members/m2/state"))
        + len(served.fake.calls("GET", "/1.0/cluster/members/m3/state"))
        <= 4
    )
    assert "no member state (HTTP 501)" in caplog.text


def test_evacuated_and_offline_members(served: Served) -> None:
    served.fake.members["m2"].status = "Evacuated"
    served.fake.members["m3"].status = "Offline"
    cluster, _ = observe(served)
    m2, m3 = cluster.node("m2"), cluster.node("m3")
    assert m2.online and m2.maintenance and not m2.usable
    assert not m3.online and m3.cpu == 0.0


def test_offline_members_keep_their_last_capacity(served: Served) -> None:
    client = Client(socket_config(served))
    observer = Observer(client, socket_config(served), Settings())
    try:
        observer.observe()
        served.fake.members["m3"].status = "Offline"
        cluster = observer.observe()
    finally:
        client.close()
    assert (cluster.node("m3").online, cluster.node("m3").cpu) == (False, 8.0)


def test_a_member_that_is_down_is_asked_once_and_counts_as_offline(served: Served) -> None:
    # LXD 5.0's answer for a member whose daemon stopped, before the heartbeat marks it
    # Offline (~20 s): 500 after a 10 s wait, every time — not worth asking again.
    down = "Missing event connection with target cluster member"
    # aimed at m1: the members are read side by side, in no fixed order
    served.fake.fail("GET", "/1.0/resources", 500, down, times=1, target="m1")
    cluster, _ = observe(served)
    assert [n.online for n in cluster.nodes] == [False, True, True]
    assert len(served.fake.calls("GET", "/1.0/resources")) == 3  # once per member


def test_a_member_the_server_does_not_answer_for_in_time_counts_as_offline(
    served: Served,
) -> None:
    # LXD 5.0 answers for a stopped member only after about 10 s: a timeout of that read makes
    # the member unreachable for this observation, not the whole observation fail.
    served.fake.hang("GET", "/1.0/resources", 2.0, target="m2")
    cluster, _ = observe(served, timeout=1.0, retries=0)
    assert [n.online for n in cluster.nodes] == [True, False, True]
    assert [g.id for g in cluster.guests if g.node == "m2"] == ["c2"]


def test_pinning_devices_and_local_disks(served: Served) -> None:
    fake = served.fake
    fake.add_instance("gpu1", "m2", devices={"gpu0": {"type": "gpu", "pci": "0000:01:00.0"}})
    fake.add_instance(
        "local1",
        "m2",
        devices={
            "root": {"type": "disk", "pool": "local", "path": "/", "size": "20GiB"},
            "data": {"type": "disk", "source": "/srv/data", "path": "/data"},
        },
    )
    cluster, _ = observe(served)
    assert cluster.guest("gpu1").devices == ("gpu0 (gpu)",)
    local1 = cluster.guest("local1")
    assert local1.devices == ("data (host path)",)
    assert local1.disks[0].local and local1.disks[0].size == 20 * GiB


def test_rules_from_incus_and_user_keys(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    fake = served.fake
    fake.members["m2"].groups = ["default", "fast"]
    fake.instance("vm1").config.update(
        {"user.opendrs.pin": "m1,m2,nowhere", "user.opendrs.anti_affinity": "db"}
    )
    fake.instance("vm2").config.update(
        {"user.opendrs.anti_affinity": "db", "user.opendrs.priority": "3"}
    )
    fake.instance("c1").config.update(
        {"user.opendrs.ignore": "true", "volatile.cluster.group": "fast"}
    )
    fake.instance("c2").config["limits.cpu"] = "0-11"
    cluster, _ = observe(served)
    rules = {r.name: r for r in cluster.rules.node_affinity}
    assert dict(rules["user.opendrs.pin vm1"].nodes) == {"m1": 0, "m2": 0}
    assert rules["user.opendrs.pin vm1"].strict
    assert set(rules["cluster group fast"].nodes) == {"m2"}
    assert set(rules["limits.cpu c2"].nodes) == {"m1", "m2"}
    (apart,) = cluster.rules.guest_affinity
    assert (apart.guests, apart.positive) == (("vm1", "vm2"), False)
    assert cluster.rules.ignored == frozenset({"c1"})
    assert cluster.guest("vm2").priority == 3
    assert "names no member of the cluster: nowhere" in caplog.text


def test_a_group_name_belongs_to_its_project(served: Served) -> None:
    fake = served.fake
    for name, project in (("vm1", "default"), ("vm2", "default"), ("w1", "web")):
        fake.instance(name, project).config["user.opendrs.anti_affinity"] = "db"
    fake.add_instance("w2", "m1", project="web", config={"user.opendrs.anti_affinity": "db"})
    cluster, _ = observe(served, all_projects=True)
    groups = {r.name: r.guests for r in cluster.rules.guest_affinity}
    assert groups == {
        "user.opendrs.anti_affinity db": ("vm1", "vm2"),
        "user.opendrs.anti_affinity web/db": ("web/w1", "web/w2"),
    }


def test_manual_members_take_no_automatic_placement(served: Served) -> None:
    served.fake.members["m2"].config["scheduler.instance"] = "manual"
    served.fake.add_instance("vm9", "m2")
    cluster, _ = observe(served)
    assert "vm9" in cluster.rules.ignored
    (rule,) = [r for r in cluster.rules.node_affinity if r.name == "scheduler.instance: m2 manual"]
    assert set(rule.nodes) == {"m1", "m3"} and "vm9" not in rule.guests


def test_restricted_projects_keep_to_their_groups(served: Served) -> None:
    served.fake.projects["web"] = {"restricted": "true", "restricted.cluster.groups": "arm"}
    cluster, _ = observe(served, all_projects=True)
    (rule,) = [r for r in cluster.rules.node_affinity if "web/w1" in r.guests]
    assert set(rule.nodes) == {"m3"} and rule.strict


def test_last_moves_are_read_from_both_keys(served: Served) -> None:
    served.fake.instance("vm1").config["volatile.rebalance.last_move"] = "1700000000"
    served.fake.instance("vm2").config["user.opendrs.last_move"] = "1700000500"
    _, observer = observe(served)
    assert observer.last_moves == {"vm1": 1700000000.0, "vm2": 1700000500.0}


def test_a_server_that_is_not_clustered(served: Served) -> None:
    served.fake.fail("GET", "/1.0/cluster/members", 500, "Server is not clustered", times=1)
    cluster, _ = observe(served)
    assert [n.name for n in cluster.nodes] == ["m1"]
    assert cluster.node("m1").cpu == 16.0
    # Neither a target nor the member state is asked of a server that is not clustered.
    assert all("target" not in r[2] for r in served.fake.calls("GET", "/1.0/resources"))
    assert not served.fake.calls("GET", "/1.0/cluster/members/m1/state")


def test_an_api_that_stops_answering_fails_the_observation_in_one_line(served: Served) -> None:
    from opendrs.backends.base import BackendError

    served.fake.hang("GET", "/1.0/instances", 3.0)
    client = Client(socket_config(served, timeout=1.0, retries=1))
    client.sleep = lambda seconds: None
    observer = Observer(client, socket_config(served), Settings())
    try:
        with pytest.raises(BackendError) as caught:
            observer.observe()
    finally:
        client.close()
    assert str(caught.value).endswith(": no answer within 1s (after 2 tries)")
    assert str(caught.value).startswith("GET /1.0/instances at unix:")
    assert caught.value.transient


def test_a_pin_key_against_incus_own_rule_is_ignored_and_the_rule_holds(served: Served) -> None:
    """vm2 pins CPU 4 (m1, m2 only: Incus's rule) and its key pins it to m3: the key is a tag, so
    it is ignored with a warning and Incus's rule holds; vm1's pin, against nothing, holds."""
    served.fake.instance("vm1").config["user.opendrs.pin"] = "m3"
    served.fake.instance("vm2").config["user.opendrs.pin"] = "m3"
    served.fake.members["m3"].threads = 4
    cluster, _ = observe(served)
    kept, problems = check_rules(cluster)
    assert {r.name for r in kept.node_rules_for("vm2")} == {"limits.cpu vm2"}
    (rule,) = kept.node_rules_for("vm1")
    assert set(rule.nodes) == {"m3"} and rule.strict
    (problem,) = problems
    assert problem.ignored and "tag rule 'user.opendrs.pin vm2'" in str(problem)
    assert "platform rule 'limits.cpu vm2' holds" in str(problem)
