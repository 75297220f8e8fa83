"""What a command imports, not how fast (that is bench/startup.py): a command line builds its own
command's parser alone, and ``opendrs plan`` of a small snapshot loads neither the other commands'
modules nor the libraries it has no use for."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opendrs.cli.main import COMMANDS, PARSER_MODULES, build_parser, named_command

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.yaml"

#: What ``opendrs plan`` of a snapshot by the default strategy never uses: the solver, the
#: reports' charts and templates, the daemon's metrics, the backends' clients, the other
#: commands and strategies (the policy's presets name some), the proxlb compatibility layer (a
#: snapshot is no scenario), the policy's decisions (a plan needs its repair alone), numpy's
#: masked arrays (``np.unique`` imports them: the engine asks ``engine.distinct``), the migration
#: windows and their time zones (a snapshot has none), rich's emoji
#: table and the "did you mean" of a mistake.
NOT_FOR_PLAN = (
    "ortools",
    "matplotlib",
    "jinja2",
    "markupsafe",
    "prometheus_client",
    "proxmoxer",
    "requests",
    "httpx",
    "starlark",
    "opendrs.backends",
    "opendrs.controller",
    "opendrs.compat",
    "opendrs.report.charts",
    "opendrs.report.render",
    "opendrs.cli.simulate_command",
    "opendrs.cli.status_command",
    "opendrs.engine.strategies.optimal",
    "opendrs.engine.strategies.pressure",
    "opendrs.engine.strategies.greedy",
    "opendrs.engine.strategies.incus",
    "opendrs.engine.strategies.pve",
    "opendrs.engine.strategies.proxlb_greedy",
    "opendrs.engine.policy.decide",
    "opendrs.engine.policy.decision",
    "opendrs.engine.policy.smoothing",
    "opendrs.engine.policy.why",
    "opendrs.engine.policy.windows",
    "opendrs.engine.headroom",
    "zoneinfo",
    "numpy.ma",
    "rich._emoji_codes",
    "difflib",
)


def _imported_by(*argv: str) -> tuple[int, set[str]]:
    """``opendrs ARGV``'s exit status in a fresh interpreter, and the modules it imported."""
    code = (
        "import contextlib, io, json, sys\n"
        "from opendrs.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    status = main(sys.argv[1:])\n"
        "print(json.dumps([status, sorted(sys.modules)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    )
    status, modules = json.loads(proc.stdout)
    return status, set(modules)


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(f"{name}.") for m in modules)


def test_plan_of_a_small_snapshot_imports_only_what_it_uses() -> None:
    status, modules = _imported_by("plan", str(SMALL))
    assert status == 0
    assert "opendrs.engine.strategies.balance.strategy" in modules  # it did plan
    assert [name for name in NOT_FOR_PLAN if _loaded(modules, name)] == []


def test_listing_the_strategies_imports_no_strategy_it_lists_only() -> None:
    status, modules = _imported_by("strategies")
    assert status == 0
    for name in ("optimal", "pressure", "greedy", "incus", "pve", "proxlb_greedy"):
        assert not _loaded(modules, f"opendrs.engine.strategies.{name}")


def _help(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opendrs", *argv, "--help"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("command", [*COMMANDS, "proxlb check", "pve decide"])
def test_every_command_has_its_help_in_a_fresh_process(command: str) -> None:
    """A command's parser is built alone, its module imported first: nothing it needs may come
    from another command's module. Its help says what the command does, and sends nobody to
    a docs/ file, which an installed opendrs does not have."""
    proc = _help(*command.split())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: opendrs {command}")
    assert proc.stderr == ""
    description = proc.stdout.split("\n\n")[1]
    assert not description.startswith(("options:", "positional arguments:")), proc.stdout
    assert "docs/" not in proc.stdout


def test_the_help_of_opendrs_lists_every_command() -> None:
    proc = _help()
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^    (\S+)", proc.stdout, re.MULTILINE)
    assert listed == list(COMMANDS)
    assert "docs/" not in proc.stdout


def _added_by(module: str, function: str) -> set[str]:
    sub = argparse.ArgumentParser().add_subparsers()
    getattr(importlib.import_module(f"opendrs.cli.{module}"), function)(sub)
    return set(sub.choices)


@pytest.mark.parametrize(("module", "function"), PARSER_MODULES)
def test_the_command_table_names_what_each_module_adds(module: str, function: str) -> None:
    assert _added_by(module, function) == {c for c, m in COMMANDS.items() if m == module}


def test_the_full_parser_has_every_command_of_the_table() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["plan", "x.yaml"], "plan"),
        (["--debug", "plan", "--strategy", "optimal", "x"], "plan"),
        (["--help"], None),
        ([], None),
        (["plann", "x"], None),
        (["x.yaml", "plan"], None),
    ],
)
def test_the_command_named_is_the_first_argument_not_an_option(
    argv: list[str], command: str | None
) -> None:
    assert named_command(argv) == command


def test_a_command_alone_parses_as_in_the_full_parser() -> None:
    argv = ["--debug", "plan", str(SMALL), "--strategy", "incus", "-O", "max_moves=3"]
    alone, full = build_parser("plan").parse_args(argv), build_parser().parse_args(argv)
    assert vars(alone) == vars(full)


def _policy_names_after(first: str) -> dict[str, str]:
    """In a fresh interpreter that imports ``first``, then the policy package: each name of the
    package, as what it is and where it is defined."""
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({first!r})\n"
        "import opendrs.engine.policy as policy\n"
        "out = {}\n"
        "for name in policy.__all__:\n"
        "    value = getattr(policy, name)\n"
        "    where = policy._DEFINED_IN[name]\n"
        "    module = importlib.import_module(f'opendrs.engine.policy.{where}')\n"
        "    assert value is getattr(module, name), name\n"
        "    out[name] = type(value).__name__\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "first",
    ["opendrs.engine.policy", "opendrs.engine.policy.decide", "opendrs.engine.policy.repair"],
)
def test_the_policy_package_gives_each_name_from_its_module_whatever_came_first(first: str) -> None:
    """The package imports a module when one of its names is asked for; its functions ``decide``
    and ``repair`` stay functions when their modules (of the same names) are imported first."""
    names = _policy_names_after(first)
    assert names["decide"] == names["repair"] == "function"


def test_the_policy_package_lists_what_it_defines() -> None:
    import opendrs.engine.policy as policy

    assert sorted(policy.__all__) == sorted(policy._DEFINED_IN)
    assert set(policy.__all__) <= set(dir(policy))
    with pytest.raises(AttributeError):
        _ = policy.no_such_name
