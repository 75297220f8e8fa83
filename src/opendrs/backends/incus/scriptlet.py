"""Incus's instance placement scriptlet (``instances.placement.scriptlet``), honoured for the
targets opendrs chooses.

Incus runs the operator's Starlark function ``instance_placement(request, candidate_members)`` to
place an instance, and its own balancer runs it for each instance it would move, with the reason
``rebalance`` and the compatible members other than the source, least loaded first: a member the
scriptlet names with ``set_target`` becomes the target; when it names none Incus chooses; when it
fails nothing moves (``clusterRebalanceServers`` in ``cmd/incusd/api_cluster_rebalance.go``;
the contract in ``internal/server/scriptlet/instance_placement.go`` and
``doc/explanation/clustering.md``).

opendrs runs it the same way, once per observation for each instance that may move (see
:func:`placement_verdicts`), and its verdict enters the cluster as rules, so the engine stays
pure: a member the scriptlet chose is the only one the instance may go to (a strict node rule
``instances.placement.scriptlet chose M``, where it is now allowed too); a scriptlet that fails
keeps the instance where it is (it is observed as locked, with the scriptlet's reason).

The scriptlet gets what Incus gives it, read from the same observation: ``set_target``,
``log_info``/``log_warn``/``log_error`` (into opendrs's log), ``get_cluster_member_resources``
(``/1.0/resources`` of the member), ``get_cluster_member_state``, ``get_instance_resources``
(``cpu_cores``, ``memory_size``, ``root_disk_size``), ``get_instances``,
``get_instances_count``, ``get_cluster_members`` and ``get_project``; objects have the JSON field
names as attributes (``request.name``, ``candidate_members[0].server_name``), maps (``config``,
``devices``) are dicts. It runs in starlark-rust (the ``starlark-pyo3`` package) with nothing
else: no ``load``, no files, no network, no clock; a run is cut off after ``scriptlet_timeout``.
"""

from __future__ import annotations

import json
import keyword
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from opendrs.backends.incus.values import memory_limit

log = logging.getLogger(__name__)

#: The server config key holding the scriptlet.
KEY: Final = "instances.placement.scriptlet"
#: Field names whose values are Go maps (dicts in Starlark), and those whose values are maps too.
_MAPS: Final = frozenset({"config", "expanded_config", "environment", "used_by_map"})
_MAPS_OF_MAPS: Final = frozenset({"devices", "expanded_devices"})
_MAPS_OF_OBJECTS: Final = frozenset({"storage_pools"})
#: Names Starlark reserves, which cannot be keyword arguments of ``struct``.
_RESERVED: Final = frozenset({*keyword.kwlist, "load"})

#: What the scriptlet may call beyond Starlark's own functions, defined from the observation.
_SHARED_SOURCE: Final = """
def get_cluster_member_resources(member_name):
    if member_name not in _resources:
        fail("Invalid member name: %s" % member_name)
    return _resources[member_name]

def get_cluster_member_state(member_name):
    if member_name not in _states:
        fail("Invalid member name: %s" % member_name)
    return _states[member_name]

def get_instances(project = "", location = ""):
    return [
        i for i in _instances
        if (not project or i.project == project) and (not location or i.location == location)
    ]

def get_instances_count(project = "", location = "", pending = False):
    return len(get_instances(project, location))

def get_cluster_members(group = ""):
    found = []
    for m in _members:
        mode = m.config.get("scheduler.instance", "")
        if m.status != "Online" or mode == "manual":
            continue
        if (mode == "group" or group) and group not in m.groups:
            continue
        found.append(m)
    return found

def get_project(name = ""):
    if name not in _projects:
        fail("Project not found")
    return _projects[name]

_by_name = {m.server_name: m for m in _members}

def opendrs_candidates(names):
    return [_by_name[n] for n in names]
"""
_SHARED_NAMES: Final = (
    "get_cluster_member_resources",
    "get_cluster_member_state",
    "get_instances",
    "get_instances_count",
    "get_cluster_members",
    "get_project",
    "opendrs_candidates",
)
#: The call, as Incus makes it.
_CALL: Final = "instance_placement(request = _request, candidate_members = _candidates)\n"


class Verdict(NamedTuple):
    """One run: the member the scriptlet set (``None``: it set none), or why it failed; and
    whether it was cut off by the time limit."""

    chose: str | None = None
    error: str | None = None
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class Observed:
    """What the scriptlet's functions read: the rows of one observation."""

    members: Sequence[Mapping[str, Any]]
    resources: Mapping[str, Mapping[str, Any]]
    states: Mapping[str, Mapping[str, Any]]
    instances: Sequence[Mapping[str, Any]]
    projects: Mapping[str, Mapping[str, Any]]


class Scriptlet:
    """The operator's scriptlet, parsed once; :meth:`observe` gives it an observation's data,
    :meth:`run` runs it for one instance."""

    def __init__(self, source: str, time_limit: float) -> None:
        self.source = source
        self.time_limit = time_limit
        self.problem: str | None = None
        self._shared: Any = None
        self._unreadable: str | None = None
        self._lists = "get_instances" in source
        try:
            import starlark as sl
        except ImportError:
            self.problem = "the Starlark interpreter (the package starlark-pyo3) is not installed"
            return
        self._sl = sl
        self._globals = sl.Globals.extended_by([sl.LibraryExtension.StructType])
        self._ours = sl.Dialect.standard()
        self._ours.enable_load = True
        theirs = sl.Dialect.standard()
        theirs.enable_load = False
        self._call = sl.parse("call", _CALL, self._ours)
        try:
            # Evaluating a module yields its last statement's value, which must convert to
            # Python: a trailing None, after the operator's lines (their numbers unchanged).
            self._ast = sl.parse("scriptlet", source + "\n\nNone\n", theirs)
        except sl.StarlarkError as exc:
            self.problem = f"it does not parse: {_first_error(exc)}"

    def observe(self, observed: Observed) -> None:
        """The data the scriptlet's functions read until the next observation. Data that
        cannot be given to it (a string that is no text) makes every run of this observation
        fail, with the reason."""
        self._unreadable = None
        if self.problem:
            return
        try:
            self._shared = self._observation(observed)
        except Exception as exc:
            self._unreadable = f"the observation cannot be given to it: {_first_error(exc)}"

    def _observation(self, observed: Observed) -> Any:
        sl = self._sl
        shared = sl.Module()
        data = "\n".join(
            (
                f"_members = {_literal(list(observed.members))}",
                f"_resources = {_literal(dict(observed.resources), 'objects')}",
                f"_states = {_literal(dict(observed.states), 'objects')}",
                # Only a scriptlet that names them can list the instances: the rest skip them.
                f"_instances = {_literal(list(observed.instances) if self._lists else [])}",
                f"_projects = {_literal(dict(observed.projects), 'objects')}",
            )
        )
        sl.eval(
            shared,
            sl.parse("observation", data + "\n" + _SHARED_SOURCE + "\nNone\n", self._ours),
            self._globals,
        )
        return shared.freeze()

    def run(
        self, request: Mapping[str, Any], names: Sequence[str], resources: Mapping[str, int]
    ) -> Verdict:
        """Run ``instance_placement`` for one instance (``request``) and its candidates (the
        members ``names``, least loaded first, among the observation's) with its
        ``resources``."""
        if self.problem or self._unreadable:
            return Verdict(error=self.problem or self._unreadable)
        sl = self._sl
        chosen: list[str] = []

        def set_target(member_name: object) -> None:
            if not isinstance(member_name, str) or member_name not in names:
                raise ValueError(f"Invalid member name: {member_name}")
            chosen.append(member_name)

        module = sl.Module()
        module.add_callable("set_target", set_target)
        for level, name in ((logging.INFO, "log_info"), (logging.WARNING, "log_warn")):
            module.add_callable(name, _logger(level, str(request.get("name"))))
        module.add_callable("log_error", _logger(logging.ERROR, str(request.get("name"))))
        shared = self._shared
        deadline = time.monotonic() + self.time_limit
        options = sl.EvalOptions(check_cancelled=lambda: time.monotonic() > deadline)
        try:
            prelude = "\n".join(
                (
                    'load("observation", ' + ", ".join(f'"{n}"' for n in _SHARED_NAMES) + ")",
                    f"_request = {_literal(dict(request))}",
                    f"_candidates = opendrs_candidates({_literal(list(names))})",
                    f"_instance_resources = {_literal(dict(resources))}",
                    "def get_instance_resources():",
                    "    return _instance_resources",
                    "None",
                )
            )
            sl.eval(
                module,
                sl.parse("request", prelude + "\n", self._ours),
                self._globals,
                sl.FileLoader(lambda _name: shared),
            )
            sl.eval_with(options, module, self._ast, self._globals)
            value = sl.eval_with(options, module, self._call, self._globals)
        except Exception as exc:  # a Starlark error, or one raised by set_target
            if time.monotonic() > deadline:
                seconds = f"{self.time_limit:g} s"
                return Verdict(
                    error=f"it ran longer than scriptlet_timeout ({seconds})", timed_out=True
                )
            return Verdict(error=_first_error(exc))
        if value.value is not None:
            return Verdict(error=f"it returned {value.value!r} instead of nothing")
        return Verdict(chose=chosen[-1] if chosen else None)


def _logger(level: int, instance: str) -> Callable[..., None]:
    def log_message(*messages: object) -> None:
        log.log(level, "placement scriptlet (%s): %s", instance, "".join(map(str, messages)))

    return log_message


def _first_error(exc: BaseException) -> str:
    """The line of a Starlark error that says what went wrong, and where (``scriptlet:LINE:COL``
    in the operator's scriptlet)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    where = next((line[3:].strip() for line in lines if line.startswith("--> ")), None)
    for line in lines:
        if line.startswith("error:"):
            what = line.removeprefix("error:").strip()
            return f"{what} ({where})" if where else what
    return lines[-1] if lines else type(exc).__name__


def _literal(value: object, kind: str = "object") -> str:
    """``value`` (an API answer) as Starlark source: objects as ``struct``, with their JSON field
    names as attributes, Go maps (:data:`_MAPS` …) as dicts. ``kind``: ``object``, ``map``
    (a dict of plain values) or ``objects`` (a dict of objects)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else "0.0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return (
            "[" + ", ".join(_literal(v, kind if kind == "map" else "object") for v in value) + "]"
        )
    if isinstance(value, dict):
        if kind == "object" and all(_field(k) for k in value):
            return (
                "struct("
                + ", ".join(f"{k} = {_literal(v, _kind_of(k))}" for k, v in value.items())
                + ")"
            )
        inner = "object" if kind == "objects" else "map" if kind == "map" else "object"
        return (
            "{"
            + ", ".join(
                f"{json.dumps(str(k), ensure_ascii=False)}: {_literal(v, inner)}"
                for k, v in value.items()
            )
            + "}"
        )
    return json.dumps(str(value), ensure_ascii=False)


def _field(key: object) -> bool:
    return isinstance(key, str) and key.isidentifier() and key not in _RESERVED


def _kind_of(field: str) -> str:
    if field in _MAPS or field in _MAPS_OF_MAPS:
        return "map"
    if field in _MAPS_OF_OBJECTS:
        return "objects"
    return "object"


def request(row: Mapping[str, Any]) -> dict[str, Any]:
    """The scriptlet's ``request`` for moving the instance ``row`` (Incus's
    ``InstancePlacement`` for a rebalance: the instance's expanded config and devices)."""
    return {
        "name": row.get("name"),
        "type": row.get("type"),
        "architecture": row.get("architecture", ""),
        "config": dict(_mapping(row.get("expanded_config"))),
        "devices": {k: dict(_mapping(v)) for k, v in _mapping(row.get("expanded_devices")).items()},
        "profiles": list(row.get("profiles") or []),
        "description": row.get("description", ""),
        "ephemeral": bool(row.get("ephemeral", False)),
        "stateful": bool(row.get("stateful", False)),
        "instance_type": "",
        "start": False,
        "source": {"type": ""},
        "project": str(row.get("project") or "default"),
        "reason": "rebalance",
    }


def instance_resources(vcpus: float, memory: int, row: Mapping[str, Any]) -> dict[str, int]:
    """``get_instance_resources()``: the instance's vCPUs, memory and root disk size in bytes
    (Incus's ``ResourceUsage``)."""
    root = 0
    for device in _mapping(row.get("expanded_devices")).values():
        device = _mapping(device)
        if device.get("type") == "disk" and device.get("path") == "/":
            root = memory_limit(device.get("size"), 0) or 0
    return {"cpu_cores": int(vcpus), "memory_size": int(memory), "root_disk_size": root}


def score(memory_used: int, memory_total: int, load: float, threads: float) -> int:
    """A member's load as Incus's balancer scores it: the mean of its memory in use and its
    1-minute load over its threads, in whole percent (``calculateScore``)."""
    memory = int(memory_used * 100 / memory_total) if memory_total > 0 else 0
    cpu = int(load * 100 / threads) if threads > 0 else 0
    return (min(memory, 255) + min(cpu, 255)) // 2


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


__all__ = ["KEY", "Observed", "Scriptlet", "Verdict", "instance_resources", "request", "score"]
