"""Shared test fixtures and paths, and the Hypothesis profiles.

Two profiles, chosen by the ``HYPOTHESIS_PROFILE`` environment variable:

* ``ci`` (the default): every property runs the examples its ``@settings`` asks for (Hypothesis's
  100 where it asks for none), drawn from a seed fixed per test (``derandomize``) — the same
  examples on every run and every clone, so a property cannot fail one run in N and block
  landing at random. Finding new failures is the deep profile's job.
* ``deep`` (``make properties``): a random seed on every run, and every property's count
  scaled by ``HYPOTHESIS_DEEP_EXAMPLES`` / 100 (default 25,000 / 100: a property asking for 80
  examples runs 20,000, one asking for none 25,000). A failure prints its seed and a
  ``@reproduce_failure`` blob, and is kept in ``.hypothesis/`` to be tried first next time; pin
  it with ``@example(...)`` on the property.

Counts set with ``@settings(max_examples=...)`` on a test would override a profile's; the deep
profile therefore scales each test's own count (in :func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
#: Read-only peer test data, beside the checkout (``../shared/compat``); may be absent.
COMPAT = ROOT.parent / "shared" / "compat"

#: The Hypothesis profile of this run: ``ci`` (deterministic) or ``deep`` (large, random).
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
#: Examples per property in the deep profile, for a property at Hypothesis's default count.
DEEP_EXAMPLES = int(os.environ.get("HYPOTHESIS_DEEP_EXAMPLES", "25000"))

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile(
    "deep",
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
if PROFILE not in ("ci", "deep"):
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE: expected ci or deep, got {PROFILE!r}")
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In the deep profile, scale every property's own example count (see the module)."""
    if PROFILE != "deep":
        return
    scaled: set[int] = set()
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)
        if not getattr(test, "is_hypothesis_test", False) or id(test) in scaled:
            continue
        scaled.add(id(test))
        if hasattr(test, "_hypothesis_state_machine_class"):
            # A state machine's TestCase: its settings are the class's ``settings``.
            holder, name = item.cls, "settings"  # type: ignore[attr-defined]
        else:
            # Where Hypothesis keeps a @given test's settings; it reads them on every call.
            holder, name = test, "_hypothesis_internal_use_settings"
        own: settings = getattr(holder, name)
        count = max(1, round(own.max_examples * DEEP_EXAMPLES / 100))
        setattr(holder, name, settings(own, max_examples=count))


#: The test files that share something of the machine's or the checkout's, by the group whose
#: files one worker runs, in order, under pytest-xdist (``make unit``: ``--dist loadgroup``):
#: the session's real clusters (started once each, and no other worker's start cleans a scratch
#: folder before its owner is written), and ``make dist`` (the checkout's ``.venv`` with its build
#: tool, and its ``src/opendrs.egg-info``), which the wheel's and the Debian packages' tests run.
ONE_WORKER = {
    "tests/backends/test_real_cluster.py": "real-clusters",
    "tests/install/test_deb.py": "checkout-builds",
    "tests/install/test_wheel.py": "checkout-builds",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` with the groups of :data:`ONE_WORKER` (the largest first), every
    other test on its own. (pytest-xdist's ``xdist_group`` mark renames a test's id, which
    pytest 9 no longer lets it do: the mark would be ignored.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class OneWorkerGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = ONE_WORKER.get(nodeid.split("::", 1)[0])
            return group if group is not None else super()._split_scope(nodeid)

    return OneWorkerGroups(config, log)


def compat_dir(sub: str) -> Path:
    """Return ``COMPAT/sub`` or skip the calling test when it is not there."""
    path = COMPAT / sub
    if not path.is_dir():
        pytest.skip(f"{path} not present")
    return path


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The logging set-up as it was before the test, for every test: one that runs a command in
    process has its ``setup_logging`` replace the root logger's handler with one on the captured
    stderr and set the root's level, ``simulate`` quiets the ``opendrs`` logger — either would
    otherwise hide every later test's warnings from ``caplog``."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # ``opendrs simulate`` and ``demo`` quiet the ``opendrs`` logger in process
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore", "opendrs")}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, saved in levels.items():
            logging.getLogger(name).setLevel(saved)
