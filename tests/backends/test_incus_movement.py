"""How Incus lets an instance move (``cluster.evacuate``, ``migration.stateful``, the boot state),
``limits.cpu`` topologies, and the values a placement scriptlet receives, checked value by value
(``test_incus_rules_honoured.py`` runs them through ``opendrs run --once``)."""

from __future__ import annotations

import json

import pytest

from opendrs.backends.incus.movement import live_refusal, project_hold, records_boot_state
from opendrs.backends.incus.values import cpu_limit

BOOTED = json.dumps({"version": 1, "machine_type": "pc-q35-9.2"})


@pytest.mark.parametrize(
    ("environment", "checked"),
    [
        ({"server": "incus", "server_version": "7.0"}, True),
        ({"server": "incus", "server_version": "7.3"}, True),
        ({"server": "incus", "server_version": "6.0.4"}, False),
        ({"server": "incus", "server_version": "6.13"}, False),
        ({"server": "lxd", "server_version": "7.0"}, False),
        ({"server": "incus"}, False),
        ({"server": "incus", "server_version": "dev"}, False),
    ],
)
def test_which_servers_check_the_boot_state(environment: dict[str, str], checked: bool) -> None:
    assert records_boot_state(environment) is checked


@pytest.mark.parametrize(
    ("config", "checked", "refusal"),
    [
        ({"migration.stateful": "true"}, False, None),
        ({"migration.stateful": "true", "cluster.evacuate": "live-migrate"}, False, None),
        ({"migration.stateful": "true", "cluster.evacuate": "auto"}, False, None),
        ({}, False, "migration.stateful is not true"),
        ({"migration.stateful": "true", "cluster.evacuate": "stop"}, False, "evacuate=stop"),
        ({"migration.stateful": "true", "cluster.evacuate": "migrate"}, False, "evacuate=migrate"),
        ({"migration.stateful": "true"}, True, "was set after it started"),
        ({"migration.stateful": "true", "volatile.vm.boot_state": BOOTED}, True, None),
        ({"migration.stateful": "true", "volatile.vm.definition": "pc-q35-8.2"}, True, None),
        ({"migration.stateful": "true", "volatile.vm.boot_state": "{"}, True, "after it started"),
        (
            {"migration.stateful": "true", "volatile.vm.boot_state": '{"version": 1}'},
            True,
            "after it started",
        ),
    ],
)
def test_live_refusal(config: dict[str, str], checked: bool, refusal: str | None) -> None:
    found = live_refusal(config, boot_state_checked=checked)
    assert (found is None) == (refusal is None)
    if refusal is not None:
        assert refusal in str(found)


@pytest.mark.parametrize(
    ("config", "held"),
    [
        ({}, False),
        ({"restricted": "false", "restricted.cluster.target": "block"}, False),
        ({"restricted": "true"}, True),
        ({"restricted": "true", "restricted.cluster.target": "block"}, True),
        ({"restricted": "true", "restricted.cluster.target": "allow"}, False),
    ],
)
def test_projects_that_block_choosing_a_member(config: dict[str, str], held: bool) -> None:
    assert (project_hold("web", config) is not None) is held


@pytest.mark.parametrize(
    ("value", "vcpus"),
    [
        ("sockets=2,cores=4,threads=2", 16.0),
        ("cores=4", 4.0),
        (" sockets=2 , threads=2 ", 4.0),
        ("sockets=0", None),
        ("sockets=2,sockets=2", None),
        ("dies=2", None),
        ("cores=x", None),
        ("cores", None),
    ],
)
def test_cpu_topologies(value: str, vcpus: float | None) -> None:
    assert cpu_limit(value) == (vcpus, ())


def test_a_scriptlet_receives_config_values_exactly() -> None:
    pytest.importorskip("starlark", reason="the placement scriptlet runs in starlark-pyo3")
    from opendrs.backends.incus.scriptlet import Observed, Scriptlet, request

    odd = 'quote " backslash \\ newline \n tab \t unicode é 😀 ${x} {}'
    row = {
        "name": "vm1",
        "type": "virtual-machine",
        "project": "default",
        "expanded_config": {"user.note": odd, "limits.cpu": "2"},
        "expanded_devices": {"root": {"type": "disk", "path": "/", "pool": "ceph"}},
    }
    members = [
        {"server_name": n, "status": "Online", "config": {}, "groups": []} for n in ("m1", "m2")
    ]
    source = (
        "def instance_placement(request, candidate_members):\n"
        f"    if request.config['user.note'] != {json.dumps(odd, ensure_ascii=False)}:\n"
        "        fail('changed: ' + request.config['user.note'])\n"
        "    if request.devices['root']['pool'] != 'ceph' or request.reason != 'rebalance':\n"
        "        fail('request')\n"
        "    set_target(candidate_members[-1].server_name)\n"
    )
    scriptlet = Scriptlet(source, 5.0)
    scriptlet.observe(Observed(members, {}, {}, [row], {}))
    verdict = scriptlet.run(request(row), ["m1", "m2"], {"cpu_cores": 2})
    assert verdict.error is None
    assert verdict.chose == "m2"


def test_data_that_is_no_text_fails_the_runs_not_the_observation() -> None:
    pytest.importorskip("starlark", reason="the placement scriptlet runs in starlark-pyo3")
    from opendrs.backends.incus.scriptlet import Observed, Scriptlet

    scriptlet = Scriptlet("def instance_placement(request, candidate_members):\n    pass\n", 5.0)
    members = [{"server_name": "m1", "status": "Online", "config": {"user.x": "\ud800"}}]
    scriptlet.observe(Observed(members, {}, {}, [], {}))
    verdict = scriptlet.run({"name": "vm1"}, ["m1"], {})
    assert verdict.chose is None and "cannot be given to it" in str(verdict.error)
    scriptlet.observe(Observed([{"server_name": "m1"}], {}, {}, [], {}))
    assert scriptlet.run({"name": "vm1", "config": {"k": "\ud800"}}, ["m1"], {}).error
    assert scriptlet.run({"name": "vm1"}, ["m1"], {}) == (None, None, False)
