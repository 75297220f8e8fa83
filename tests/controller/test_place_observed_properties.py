"""``POST /api/place`` answered from the observation (:class:`ObservedPlacement`) gives the
answer of the constraints built for the request alone, whatever the rules: random clusters of a
few nodes and guests, random guest and node rules (some naming the new guest's id), random
requests joining them (tags, pools, hard affinity and anti-affinity with existing guests)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendrs.controller.place_api import PlaceError, place_for
from opendrs.engine.observed_placement import ObservedPlacement
from opendrs.model.cluster import Cluster
from opendrs.model.rules import POOL_RULE_PREFIX, GuestAffinity, NodeAffinity
from opendrs.model.snapshot import loads

NODES = {
    "pve1": "{cpu: 16, memory: 64GiB}",
    "pve2": "{cpu: 16, memory: 48GiB}",
    "pve3": "{cpu: 8, memory: 32GiB}",
    "pve4": "{cpu: 8, memory: 32GiB, maintenance: true}",
    "arm1": "{cpu: 16, memory: 64GiB, arch: aarch64}",
}
#: The new guest's id when the request names none: rules may name it already.
NEW = "new"


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    """A cluster of :data:`NODES` with 4 to 10 guests and random rules."""
    count = draw(st.integers(4, 10))
    lines = ["version: 1", "nodes:", *(f"  {n}: {spec}" for n, spec in NODES.items()), "guests:"]
    for j in range(count):
        node = draw(st.sampled_from(sorted(NODES)))
        arch = ", arch: aarch64" if node == "arm1" else ""
        state = draw(st.sampled_from(["running", "running", "stopped"]))
        cpu, memory = draw(st.integers(1, 6)), draw(st.integers(1, 24))
        lines.append(
            f"  - {{id: {100 + j}, node: {node}, cpu: {cpu}, memory: {memory}GiB, "
            f"state: {state}{arch}}}"
        )
    cluster = loads("\n".join(lines) + "\n")
    ids = [g.id for g in cluster.guests]
    named = st.lists(st.sampled_from([*ids, NEW]), min_size=2, max_size=4, unique=True)
    guest_rules = [
        GuestAffinity(
            POOL_RULE_PREFIX + f"p{i}" if origin == "pool" else f"r{i}",
            tuple(draw(named)),
            draw(st.booleans()),
            draw(st.booleans()),
            origin,
        )
        for i, origin in enumerate(draw(st.lists(st.sampled_from(["config", "pool", "tag"]))))
    ]
    pinned = st.lists(st.sampled_from([*ids, NEW]), min_size=1, max_size=2, unique=True)
    priorities = st.dictionaries(st.sampled_from(sorted(NODES)), st.integers(0, 2), min_size=1)
    node_rules = [
        NodeAffinity(f"n{i}", tuple(draw(pinned)), draw(priorities), draw(st.booleans()))
        for i in range(draw(st.integers(0, 2)))
    ]
    rules = replace(
        cluster.rules, guest_affinity=tuple(guest_rules), node_affinity=tuple(node_rules)
    )
    return replace(cluster, rules=rules)


@st.composite
def requests(draw: st.DrawFn, cluster: Cluster) -> dict[str, Any]:
    """A request for a new guest joining some of ``cluster``'s rules and partners."""
    ids = [g.id for g in cluster.guests]
    names = [r.name for r in cluster.rules.guest_affinity]
    request: dict[str, Any] = {
        "cpu": draw(st.integers(1, 8)),
        "memory": f"{draw(st.integers(1, 40))}GiB",
    }
    tags = draw(st.lists(st.sampled_from([*names, "none"]), max_size=3, unique=True))
    if tags:
        request["tags"] = tags
    for key in ("affinity", "anti_affinity"):
        partners = draw(st.lists(st.sampled_from(ids), max_size=3, unique=True))
        if partners:
            request[key] = partners
    if draw(st.booleans()):
        request["arch"] = draw(st.sampled_from(["x86_64", "aarch64"]))
    return request


def _outcome(cluster: Cluster, request: dict[str, Any], observed: Any = None) -> object:
    try:
        return json.dumps(place_for(cluster, request, observed))
    except PlaceError as refused:
        return refused.status, str(refused)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_observation_answers_as_a_rebuild_whatever_the_rules(data: st.DataObject) -> None:
    cluster = data.draw(clusters())
    observed = ObservedPlacement.build(cluster)
    for _ in range(3):
        request = data.draw(requests(cluster))
        assert _outcome(cluster, request, observed) == _outcome(cluster, request), request
