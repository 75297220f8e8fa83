"""``json_text`` writes what ``json.dumps(finite(data), indent=2, …)`` writes, byte for byte."""

from __future__ import annotations

import json
import random
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from opendrs.json_data import finite, json_text

SCALARS: list[Any] = [
    None, True, False, 0, -3, 10**20, 1.5, -0.0, 1e300, float("nan"), float("inf"),
    "a", 'é\n"x', "", np.float64(2.5), np.int64(4), np.float64("nan"),
]  # fmt: skip


def _reference(data: Any, sort_keys: bool) -> str:
    return json.dumps(finite(data), indent=2, sort_keys=sort_keys, allow_nan=False, default=str)


def _value(rng: random.Random, depth: int) -> Any:
    if depth > 3 or rng.random() < 0.4:
        return rng.choice(SCALARS)
    members = [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    kind = rng.random()
    if kind < 0.3:
        return members
    if kind < 0.45:
        return tuple(members)
    keys = rng.sample(["b", "a", "zz", "Ä", "c", "x y"], len(members))
    mapping = dict(zip(keys, members, strict=True))
    return MappingProxyType(mapping) if kind < 0.55 else mapping


@pytest.mark.parametrize("sort_keys", [True, False])
def test_json_text_is_json_dumps_indented(sort_keys: bool) -> None:
    rng = random.Random(7)
    for _ in range(2000):
        data = _value(rng, 0)
        assert json_text(data, sort_keys=sort_keys) == _reference(data, sort_keys) + "\n"


def test_json_text_keys_and_refusals_as_json_dumps() -> None:
    data = {1: [1.5, {2.5: "x", True: None}], "moves": [{"b": 1, "a": float("nan")}]}
    assert json_text(data, sort_keys=False) == _reference(data, False) + "\n"
    with pytest.raises(TypeError):
        json_text({1: 1, "a": 2})  # keys that do not sort, as json.dumps
