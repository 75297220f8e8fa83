"""The quick reading of a guest of the common shape builds the very guest the full reading does,
and leaves to it (``None``) every guest it would refuse or that has another shape."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from opendrs.model.cluster import Guest, Node
from opendrs.model.document import DocumentError, parse
from opendrs.model.snapshot.quick_guest import quick_guest
from opendrs.model.snapshot.reader import SnapshotReader

NODES = {"n1": Node("n1", 8, 2**34), "n 2": Node("n 2", 8, 2**34)}
SHARED = frozenset({"ceph"})
BASE: dict[str, Any] = {"id": 101, "node": "n1", "memory": "1GiB"}
#: Values of each field, sound and not, tried one field at a time over BASE.
VALUES: dict[str, list[Any]] = {
    "id": [0, -1, 2**63, 2**63 - 1, True, "a", " a", "", "x" * 256, "x" * 255, "a\n", 1.0, None],
    "node": ["n 2", "n3", 1, None, " n1"],
    "cpu": [1, 0, -1, 2.5, 100_000, 100_001, float("nan"), True, "2", None],
    "memory": [0, 1, 4096, 2**20, -1, 2**53, 2**53 + 1, 1.5, "x", True, None, "0B", "8PiB", "9PiB"],
    "usage": [
        {},
        {"cpu": 0, "memory": 0},
        {"cpu": -0.1},
        {"cpu": None, "memory": None},
        {"cpu": 1, "memory": "1GiB"},
        {"x": 1},
        {"cpu": 100_001},
        {"memory": -5},
        [],
        None,
    ],
    "uptime": ["1d", 0, -1, "1d 2h", 1.5, "x", True, None, 36500 * 86400, 36500 * 86400 + 1],
    "disks": [
        [],
        [{"pool": "ceph", "size": "1GiB"}, {"pool": "local", "size": 0}],
        [{"pool": 1, "size": 1}],
        [{"pool": "local"}],
        [{"pool": " ", "size": 1}],
        [{"pool": "local", "size": 1, "x": 1}],
        None,
        "x",
    ],
    "tags": [[], ["a", "b"], ["a", 1], [" "], ["a\tb"], None, "a"],
    "kind": ["ct"],
    "lock": ["backup"],
}


def _full(value: object) -> Guest | None:
    try:
        return SnapshotReader("t.json").guest(value, ("guests", 0), NODES, SHARED)
    except DocumentError:
        return None


def _variants() -> list[dict[str, Any]]:
    out = [dict(BASE)]
    for key, values in VALUES.items():
        out.extend({**BASE, key: value} for value in values)
    out.append({**BASE, "cpu": 4, "usage": {"cpu": 0.5, "memory": 10}, "uptime": "2h"})
    out.extend({k: v for k, v in BASE.items() if k != drop} for drop in BASE)
    return out


@pytest.mark.parametrize("as_json", [False, True])
def test_quick_reading_is_the_full_reading(as_json: bool) -> None:
    quick = 0
    for variant in _variants():
        value = parse(json.dumps(variant), filename="t.json") if as_json else variant
        guest = quick_guest(value, NODES, SHARED)
        if guest is not None:
            quick += 1
            assert guest == _full(value), variant
    assert quick >= 20  # the common shapes are read quickly


def test_other_shapes_and_bad_values_are_left_to_the_full_reading() -> None:
    for key, value in itertools.chain(
        [("kind", "ct"), ("lock", "backup"), ("name", "web")],
        [("memory", -1), ("cpu", 0), ("id", " a"), ("node", "n3"), ("uptime", "x")],
    ):
        assert quick_guest({**BASE, key: value}, NODES, SHARED) is None, key
    twice = parse('{"id": 1, "id": 2, "node": "n1", "memory": 1}', filename="t.json")
    assert quick_guest(twice, NODES, SHARED) is None
