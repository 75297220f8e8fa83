"""``settings.balance_source`` in a snapshot: ``usage`` (the default) or ``pressure``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from opendrs.cli.main import main
from opendrs.model.snapshot import SnapshotError, dumps, loads

DOCUMENT = """\
version: 1
settings: {balance_source: pressure, mode: static, weights: {cpu: 0}}
nodes:
  a: {cpu: 8, memory: 32GiB}
  b: {cpu: 8, memory: 32GiB}
guests:
  - {id: 1, node: a, memory: 4GiB, pressure: {memory: 12.5}}
  - {id: 2, node: a, memory: 4GiB, pressure: {memory: 2}, priority: 3}
  - {id: 3, node: b, memory: 4GiB, pressure: {memory: 7, cpu: 50}}
"""


def test_it_is_read_and_written_back() -> None:
    cluster = loads(DOCUMENT)
    assert cluster.settings.balance_source == "pressure"
    text = dumps(cluster)
    assert yaml.safe_load(text)["settings"]["balance_source"] == "pressure"
    again = loads(text)
    assert again.settings == cluster.settings
    assert dumps(again) == text
    assert loads(dumps(cluster, "json")).settings == cluster.settings


def test_usage_is_the_default_and_is_not_written() -> None:
    cluster = loads(DOCUMENT.replace("balance_source: pressure, ", ""))
    assert cluster.settings.balance_source == "usage"
    assert "balance_source" not in dumps(cluster)
    explicit = loads(DOCUMENT.replace("balance_source: pressure", "balance_source: usage"))
    assert explicit.settings == cluster.settings


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("psi", "expected one of usage, pressure, got 'psi'"),
        ("presure", "unknown value 'presure' (did you mean 'pressure'?)"),
        ("1", "expected one of usage, pressure, got 1"),
    ],
)
def test_an_unknown_value_is_a_one_line_error(value: str, message: str) -> None:
    with pytest.raises(SnapshotError) as info:
        loads(
            DOCUMENT.replace("balance_source: pressure", f"balance_source: {value}"),
            filename="t.yaml",
        )
    text = str(info.value)
    assert text.splitlines() == [text]
    assert text == f"t.yaml: settings.balance_source: {message}"


def test_the_cli_refuses_it_with_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(DOCUMENT.replace("balance_source: pressure", "balance_source: psi"))
    for command in ("validate", "show", "plan"):
        assert main([command, str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert len(err.strip().splitlines()) == 1, err
        assert f"{path}: settings.balance_source: expected one of usage, pressure" in err


def test_show_and_plan_balance_pressure(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Memory pressure 12.5 + 2 × 3/2 on a, 7 on b: guest 2 (3 at priority 3) evens it best;
    what show and plan report is pressure, and no memory counts as moved in the bound."""
    path = tmp_path / "p.yaml"
    path.write_text(DOCUMENT)
    assert main(["show", str(path), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [n["load"]["memory"] for n in shown["nodes"]] == [
        pytest.approx(0.155),
        pytest.approx(0.07),
    ]
    assert main(["plan", str(path), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(m["guest"], m["target"]) for m in plan["moves"]] == [("2", "b")]
    assert plan["metrics"]["after"]["memory"]["spread"] == pytest.approx(0.025)
    assert plan["bounds"]["moved_bytes"] == 0
