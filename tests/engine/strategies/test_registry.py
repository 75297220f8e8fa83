"""The registry: each strategy's typed options and runner, against its library function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from opendrs.engine.constraints import committed_for
from opendrs.engine.strategies import REGISTRY, Proposal, get_strategy
from opendrs.engine.strategies.balance.strategy import propose_balance
from opendrs.engine.strategies.base import Request
from opendrs.engine.strategies.greedy import propose_greedy
from opendrs.engine.strategies.incus import propose_incus
from opendrs.engine.strategies.optimal import propose_optimal
from opendrs.engine.strategies.pressure import propose_pressure
from opendrs.engine.strategies.proxlb_greedy import propose_proxlb_greedy
from opendrs.engine.strategies.pve import propose_bruteforce, propose_topsis
from opendrs.engine.strategies.registry import LISTED
from opendrs.engine.usage import MeasuredUsage
from opendrs.engine.view import CycleView
from opendrs.model.cluster import Cluster, Guest, Node

GiB = 1024**3


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "balance": propose_balance,
    "static-greedy": propose_greedy,
    "incus": propose_incus,
    "optimal": propose_optimal,
    "drs-pressure": propose_pressure,
    "proxlb-greedy": propose_proxlb_greedy,
    "pve-bruteforce": propose_bruteforce,
    "pve-topsis": propose_topsis,
}
#: The strategies whose function reads the typed options: ``function(view, request, options)``.
TYPED = frozenset(
    {
        "drs-pressure",
        "incus",
        "optimal",
        "proxlb-greedy",
        "pve-bruteforce",
        "pve-topsis",
        "static-greedy",
    }
)


def _skewed() -> Cluster:
    nodes = tuple(Node(f"n{i}", 16, 64 * GiB) for i in range(1, 4))
    guests = tuple(
        Guest(f"g{j}", "n1", cpu=2, memory=4 * GiB, cpu_used=1.5, memory_used=3 * GiB)
        for j in range(8)
    )
    return Cluster(nodes, guests)


def test_every_registered_strategy_has_a_function_here() -> None:
    assert set(REGISTRY) == set(FUNCTIONS)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_the_runner_answers_as_the_function(name: str) -> None:
    info, function = get_strategy(name), FUNCTIONS[name]
    cluster = _skewed()
    forbidden = frozenset({("g0", "n2")})
    if name in TYPED:
        options = info.options()
        direct = function(CycleView(cluster), Request(forbidden=forbidden), options)
    else:
        direct = function(cluster, forbidden=forbidden)
    assert info.propose(cluster, Request(forbidden=forbidden)).moves == direct.moves


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_each_option_is_declared_once_in_its_options_type(name: str) -> None:
    """A strategy's function takes its typed options object: no option is a keyword of its own."""
    import inspect

    params = inspect.signature(FUNCTIONS[name]).parameters
    assert "options" in params
    assert not set(params) & set(get_strategy(name).options.names())


def test_options_are_checked_when_parsed_with_one_line_naming_strategy_and_option() -> None:
    with pytest.raises(ValueError, match=r"^strategy balance: wide: expected a whole number ≥ 1"):
        get_strategy("balance").options.parse("balance", {"wide": 0})
    with pytest.raises(ValueError, match=r"^strategy incus has no option 'batch' \(options: "):
        get_strategy("incus").options.parse("incus", {"batch": 2})
    with pytest.raises(ValueError, match=r"^strategy optimal option workers: expected a whole"):
        get_strategy("optimal").options.parse("optimal", {"workers": "two"})


def test_the_request_yields_to_an_option_set_explicitly() -> None:
    incus = get_strategy("incus")
    asked = Request(max_moves=3)
    assert incus.propose(_skewed(), asked).options["max_moves"] == 3
    assert incus.propose(_skewed(), asked, {"max_moves": 1}).options["max_moves"] == 1
    assert incus.propose(_skewed()).options["max_moves"] == 1  # its own default


def _full_first() -> Cluster:
    """n1 holds eight guests (7 GiB in use each, 56 of 64 GiB), n2 and n3 nothing."""
    nodes = tuple(Node(f"n{i}", 16, 64 * GiB) for i in range(1, 4))
    guests = tuple(
        Guest(f"g{j}", "n1", cpu=2, memory=8 * GiB, cpu_used=1.5, memory_used=7 * GiB, uptime=86400)
        for j in range(8)
    )
    return Cluster(nodes, guests)


def _second_node_full(cluster: Cluster) -> MeasuredUsage:
    """A recent usage in which the host n2 itself uses all but 2 GiB of its memory."""
    own = MeasuredUsage.of(cluster)
    base_memory = np.where(np.array(own.node_names) == "n2", 62.0 * GiB, own.base_memory)
    return replace(own, base_memory=base_memory)


def _targets(proposal: Proposal) -> set[str]:
    return {m.target for m in proposal.net_moves()}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_strategy_checks_capacity_on_the_usage_the_view_checks(name: str) -> None:
    """One capacity view end to end: on the smoothed usage n2 is empty, and every strategy
    sends guests there; on the recent usage it is full, and no strategy given the view does."""
    info, cluster = get_strategy(name), _full_first()
    # the guests are not HA resources: Proxmox's rebalancers are asked about every guest
    options = {"scope": "all"} if "scope" in info.options.names() else {}
    assert "n2" in _targets(info.propose(cluster, options=options))
    view = CycleView(cluster, recent=_second_node_full(cluster))
    proposal = info.propose(view, options=options)
    assert proposal.net_moves() and "n2" not in _targets(proposal)
    placement = view.assign.copy()
    for move in proposal.net_moves():
        placement[cluster.guest_index[move.guest]] = cluster.node_index[move.target]
    assert not view.constraints.capacity.over(committed_for(view.constraints, placement)).any()


def test_the_runner_refuses_the_request_forbidden_placements_on_the_view_constraints() -> None:
    cluster = _full_first()
    view = CycleView(cluster, recent=_second_node_full(cluster))
    forbidden = frozenset({(f"g{j}", "n3") for j in range(8)})
    balance = get_strategy("balance")
    assert not balance.propose(view, Request(forbidden=forbidden)).net_moves()
    # The view's own constraints keep nothing forbidden: the next request may go to n3.
    assert _targets(balance.propose(view)) == {"n3"}


def _defined_strategies() -> dict[str, Any]:
    """Every strategy some module of the package defines in its ``STRATEGIES``, by name."""
    import importlib
    import pkgutil

    import opendrs.engine.strategies as package

    found: dict[str, Any] = {}
    for module_info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(module_info.name)
        for strategy in getattr(module, "STRATEGIES", ()):
            found[strategy.name] = strategy
    return found


def test_the_listing_says_what_each_module_defines() -> None:
    """The registry lists names and summaries without importing the modules: they are the
    strategies' own, every strategy defined is listed, and from the module that holds it."""
    import importlib

    defined = _defined_strategies()
    assert {e.name: e.summary for e in LISTED} == {s.name: s.summary for s in defined.values()}
    for entry in LISTED:
        assert defined[entry.name] in importlib.import_module(entry.module).STRATEGIES
        assert REGISTRY.summary(entry.name) == entry.summary
        assert get_strategy(entry.name).strategy is defined[entry.name]


def test_the_registry_lists_names_and_summaries_without_importing_a_strategy() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from opendrs.engine.strategies import REGISTRY\n"
        "listed = [(name, REGISTRY.summary(name)) for name in REGISTRY]\n"
        "print(len(listed), sorted(m for m in sys.modules if m.startswith('opendrs.engine.st')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = "['opendrs.engine.strategies', 'opendrs.engine.strategies.base', "
    assert proc.stdout == f"{len(LISTED)} {imported}'opendrs.engine.strategies.registry']\n"
