"""The scenario file format of the simulator: read, validate, and the built-in scenarios.

A scenario names a snapshot (the cluster at time 0) and says what happens next: how busy each
guest is (workload patterns or a CSV trace), how fast migrations are, and which faults strike
when. ``docs/scenarios.md`` is the user documentation; this module is its reference
implementation.

Every problem with a scenario — or with the snapshot or trace it names — is a
:class:`~opendrs.model.document.DocumentError` whose ``str()`` is one line, ``FILE: PATH: REASON``;
nothing else escapes :func:`load_scenario`, :func:`loads_scenario` or :func:`builtin_scenario`.
"""

from __future__ import annotations

import csv
import difflib
import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePath
from typing import Any, Final, Literal, get_args

from opendrs.model import snapshot
from opendrs.model.cluster import Cluster, Guest
from opendrs.model.document import (
    DocumentError,
    Path,
    Reader,
    bare_number,
    clip,
    describe,
    one_of,
    parse,
    read_file,
    render_path,
)
from opendrs.model.units import UnitError, parse_bytes, parse_duration, parse_fraction

from .workload import (
    Diurnal,
    Pattern,
    Ramp,
    Selector,
    Spikes,
    Surge,
    Trace,
    TraceSeries,
    Walk,
    Weekly,
    Workload,
)

__all__ = [
    "BUILTIN_SCENARIOS",
    "FAULT_TYPES",
    "FORMAT_VERSION",
    "PLATFORMS",
    "Fault",
    "MigrationModel",
    "Platform",
    "Scenario",
    "builtin_scenario",
    "load_scenario",
    "loads_scenario",
]

FORMAT_VERSION: Final = 1
GiB: Final = 1024**3
BUILTIN_SCENARIOS: Final = ("month", "demo")

FaultType = Literal[
    "node-failure",
    "maintenance",
    "migration-failure",
    "api-error",
    "migration-hang",
    "api-lost-answer",
]
FAULT_TYPES: Final[tuple[str, ...]] = get_args(FaultType)
#: What the simulated cluster behaves as (see :class:`Scenario.platform`).
Platform = Literal["proxmox", "incus"]
PLATFORMS: Final[tuple[str, ...]] = get_args(Platform)
#: Faults that strike one migration of the controller's: the next one (``at``) or each one at
#: random (``probability``; not migration-failure, whose odds are ``migration.failure_rate``).
_MIGRATION_FAULTS: Final = ("migration-failure", "migration-hang", "api-lost-answer")

_TOP_KEYS: Final = (
    "version",
    "name",
    "cluster",
    "seed",
    "step",
    "duration",
    "recovery_delay",
    "migration",
    "workloads",
    "trace",
    "faults",
    "platform",
    "incus",
)
_INCUS_KEYS: Final = ("config",)
_MIGRATION_KEYS: Final = ("bandwidth", "setup", "failure_rate")
_SELECTOR_KEYS: Final = ("guests", "match", "tag")
_WORKLOAD_KEYS: Final = (*_SELECTOR_KEYS, "cpu", "memory")
_PATTERN_KEYS: Final = (
    "constant",
    "walk",
    "ramp",
    "diurnal",
    "weekly",
    "spikes",
    "surges",
    "noise",
)
_BASE_KEYS: Final = ("constant", "walk", "ramp")
_WALK_KEYS: Final = ("mean", "volatility", "half_life", "min", "max")
_RAMP_KEYS: Final = ("from", "to", "at", "over")
_DIURNAL_KEYS: Final = ("amplitude", "peak")
_WEEKLY_KEYS: Final = ("weekday", "weekend")
_SPIKE_KEYS: Final = ("rate", "height", "duration")
_SURGE_KEYS: Final = ("at", "height", "last", "rise")
_FAULT_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "node-failure": ("type", "at", "node", "duration", "per_day", "nodes"),
    "maintenance": ("type", "at", "node", "duration", "per_day", "nodes"),
    "migration-failure": ("type", "at", "guest"),
    "api-error": ("type", "at", "duration", "per_day", "probability"),
    "migration-hang": ("type", "at", "guest", "probability"),
    "api-lost-answer": ("type", "at", "guest", "probability"),
}
_TRACE_COLUMNS: Final = ("time", "guest", "cpu", "memory")
#: Largest number of samples read from a trace.
MAX_TRACE_ROWS: Final = 5_000_000


@dataclass(frozen=True, slots=True)
class MigrationModel:
    """How live migrations behave: ``setup + bytes copied / bandwidth`` seconds, and how often
    they fail at random."""

    #: Bytes of memory (and local disk) copied per second.
    bandwidth: float = float(GiB)
    #: Fixed time per migration, seconds.
    setup: float = 10.0
    #: Probability that a migration fails (part-way through), 0–1.
    failure_rate: float = 0.0


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault entry: scheduled (``at``) or random (``per_day`` or ``probability``).

    ``duration`` is ``None`` for a permanent node failure. ``nodes`` restricts random node faults
    to some nodes (empty: any node). ``guest`` restricts a migration fault (``migration-failure``,
    ``migration-hang``, ``api-lost-answer``) to that guest's migrations.
    """

    type: FaultType
    at: float | None = None
    node: str | None = None
    guest: str | None = None
    duration: float | None = None
    per_day: float | None = None
    probability: float | None = None
    nodes: tuple[str, ...] = ()

    @property
    def scheduled(self) -> bool:
        return self.at is not None


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: the cluster at time 0 and what happens to it."""

    cluster: Cluster
    name: str = "scenario"
    seed: int = 0
    #: Seconds per simulation step (usage is sampled once per step).
    step: float = 60.0
    #: Simulated seconds (a :class:`~opendrs.backends.sim.Simulator` may be given other days).
    duration: float = 86400.0
    #: Seconds between a node failure and the HA restart of its guests elsewhere.
    recovery_delay: float = 120.0
    migration: MigrationModel = field(default_factory=MigrationModel)
    workloads: tuple[Workload, ...] = ()
    trace: Trace | None = None
    faults: tuple[Fault, ...] = ()
    #: What the cluster is: ``proxmox`` (the default), or ``incus`` — a running container moves
    #: only by a restart (stop, move, start), and only with ``allow_restart_migration``.
    platform: Platform = "proxmox"
    #: On ``incus``, the server's ``cluster.rebalance.*`` keys (values as Incus lists them): the
    #: policy's defaults, as the Incus backend takes them (:meth:`Simulator.policy_defaults`).
    server_config: Mapping[str, str] = field(default_factory=dict)
    #: The scenario file (for messages).
    file: str = "<scenario>"

    def __post_init__(self) -> None:
        if not self.step > 0:
            raise ValueError(f"step must be positive, got {self.step!r}")
        if not self.duration > 0:
            raise ValueError(f"duration must be positive, got {self.duration!r}")
        if not self.migration.bandwidth > 0:
            raise ValueError("migration bandwidth must be positive")

    def workload_of(self, guest: Guest) -> Workload | None:
        """The first workload whose selector matches ``guest``, or ``None``."""
        for workload in self.workloads:
            if workload.selector.matches(guest):
                return workload
        return None

    def patterns(self) -> list[tuple[Pattern | None, Pattern | None]]:
        """``(cpu, memory)`` pattern of every guest of the cluster, in order (``None``: default)."""
        out: list[tuple[Pattern | None, Pattern | None]] = []
        for guest in self.cluster.guests:
            workload = self.workload_of(guest)
            out.append((None, None) if workload is None else (workload.cpu, workload.memory))
        return out


# --------------------------------------------------------------------------------------------
# Loading

Opener = Callable[[str, Path], tuple[str, bytes]]


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario file; the snapshot and trace it names are relative to its folder.

    Raises :class:`DocumentError` — and nothing else — for any problem with the three files.
    """
    filename, data = read_file(path)
    return loads_scenario(data, filename=filename)


def loads_scenario(
    text: str | bytes,
    *,
    filename: str = "<string>",
    opener: Opener | None = None,
    cluster: Cluster | None = None,
) -> Scenario:
    """Parse a scenario from text. ``opener(name, path)`` reads the files it names (default: the
    file system, relative to the folder of ``filename``); ``cluster``, when given, stands in for
    the snapshot (the ``cluster`` key is then not read and may be left out)."""
    document = parse(text, filename=filename)
    reader = _ScenarioReader(filename, opener or _read_relative(filename))
    try:
        return reader.scenario(document, cluster)
    except DocumentError:
        raise
    except RecursionError:
        raise DocumentError(filename, "", "the document is nested too deeply") from None
    except Exception as exc:  # bad input never escapes as another error
        raise DocumentError(
            filename, "", f"internal error while reading the scenario ({type(exc).__name__}: {exc})"
        ) from exc


def builtin_scenario(name: str = "month") -> Scenario:
    """A scenario shipped with opendrs (``opendrs/data/scenarios/NAME.yaml``): ``month`` (30 days,
    16 nodes, 400 guests) or ``demo`` (one day, 8 nodes, 80 guests)."""
    if name not in BUILTIN_SCENARIOS:
        close = difflib.get_close_matches(name, BUILTIN_SCENARIOS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (use {one_of(BUILTIN_SCENARIOS)})"
        raise DocumentError(f"{name}.yaml", "", f"no built-in scenario {describe(name)}{hint}")
    folder = resources.files("opendrs") / "data" / "scenarios"

    def opener(file: str, where: Path) -> tuple[str, bytes]:
        resource = folder / file
        if not resource.is_file():
            raise DocumentError(f"{name}.yaml", ".".join(map(str, where)), f"no file {file!r}")
        return file, resource.read_bytes()

    return loads_scenario(
        (folder / f"{name}.yaml").read_bytes(), filename=f"{name}.yaml", opener=opener
    )


def _read_relative(filename: str) -> Opener:
    folder = os.path.dirname(filename) if not filename.startswith("<") else ""

    def opener(name: str, where: Path) -> tuple[str, bytes]:
        path = name if os.path.isabs(name) else os.path.join(folder, name)
        try:
            return read_file(path)
        except DocumentError as exc:  # the scenario's field names the file: report it there
            raise DocumentError(filename, render_path(where), f"{path}: {exc.reason}") from None

    return opener


def _stem(filename: str) -> str:
    if filename.startswith("<") and filename.endswith(">"):
        return "scenario"
    stem = PurePath(filename).stem
    return stem if stem and stem.isprintable() else "scenario"


# --------------------------------------------------------------------------------------------
# Validation


class _ScenarioReader(Reader):
    def __init__(self, filename: str, opener: Opener) -> None:
        super().__init__(filename)
        self.opener = opener

    # -- helpers ----------------------------------------------------------------------------

    def fraction(self, value: object, path: Path) -> float:
        """A share from 0 to 1: ``0.75`` or ``75%`` (a bare number above 1 is refused with the
        percentage it probably meant)."""
        try:
            return parse_fraction(value)
        except UnitError as exc:
            self.fail(path, str(exc))

    def positive_duration(self, value: object, path: Path) -> int:
        seconds = self.duration(value, path)
        if seconds <= 0:
            self.fail(path, f"must be longer than 0 seconds, got {describe(value)}")
        return seconds

    def bandwidth(self, value: object, path: Path) -> float:
        """Bytes per second: a size, optionally followed by ``/s``. A bare number under 1 MiB
        (``1000``, meant as MB/s or Mbit/s) is refused: read as bytes, a migration would take
        weeks."""
        if isinstance(value, str):
            text = value.strip()
            if text.lower().endswith("/s"):
                text = text[:-2]
            value = text
        bandwidth = float(self.size(value, path, positive=True))
        if bare_number(value) is not None and bandwidth < 1024**2:
            number = f"{bandwidth:g}"
            self.fail(
                path,
                f"{number} bytes per second is not a migration's bandwidth: a bare number is "
                f"bytes; write {number}MiB/s or {number}MB/s (or {number}B/s if bytes are meant)",
            )
        return bandwidth

    def guest_ref(self, value: object, path: Path, cluster: Cluster) -> str:
        gid = self.text(value, path, allow_int=True)
        if gid not in cluster.guest_index:
            self.fail(path, f"unknown guest {describe(gid)}{_suggest(gid, cluster.guest_index)}")
        return gid

    def node_ref(self, value: object, path: Path, cluster: Cluster) -> str:
        name = self.text(value, path, allow_int=True)
        if name not in cluster.node_index:
            self.fail(path, f"unknown node {describe(name)}{_suggest(name, cluster.node_index)}")
        return name

    # -- document ---------------------------------------------------------------------------

    def scenario(self, data: object, cluster: Cluster | None) -> Scenario:
        if data is None:
            self.fail((), "the scenario is empty (it needs at least `version: 1` and `cluster`)")
        doc = self.mapping(data, ())
        self.check_keys(doc, (), _TOP_KEYS)
        version = self.require(doc, "version", ())
        if isinstance(version, bool) or version != FORMAT_VERSION:
            self.fail(
                ("version",),
                f"unsupported version {describe(version)} (this opendrs reads version "
                f"{FORMAT_VERSION})",
            )
        name = (
            self.text(doc["name"], ("name",), allow_int=True)
            if doc.get("name") is not None
            else _stem(self.filename)
        )
        if cluster is None:
            cluster = self.snapshot(self.require(doc, "cluster", ()), ("cluster",))
        fields: dict[str, Any] = {"cluster": cluster, "name": name, "file": self.filename}
        if "seed" in doc:
            fields["seed"] = self.integer(doc["seed"], ("seed",), minimum=0, maximum=2**63 - 1)
        if "step" in doc:
            fields["step"] = float(self.positive_duration(doc["step"], ("step",)))
        if "duration" in doc:
            fields["duration"] = float(self.positive_duration(doc["duration"], ("duration",)))
        if "recovery_delay" in doc:
            fields["recovery_delay"] = float(
                self.duration(doc["recovery_delay"], ("recovery_delay",))
            )
        if "migration" in doc:
            fields["migration"] = self.migration(doc["migration"], ("migration",))
        if "workloads" in doc:
            fields["workloads"] = self.workloads(doc["workloads"], ("workloads",), cluster)
        if doc.get("trace") is not None:
            fields["trace"] = self.trace(doc["trace"], ("trace",), cluster)
        if "faults" in doc:
            fields["faults"] = self.faults(doc["faults"], ("faults",), cluster)
        if "platform" in doc:
            fields["platform"] = self.choice(doc["platform"], ("platform",), PLATFORMS)
        if "incus" in doc:
            if fields.get("platform") != "incus":
                self.fail(("incus",), "only with `platform: incus`")
            fields["server_config"] = self.incus(doc["incus"], ("incus",))
        return Scenario(**fields)

    def incus(self, value: object, path: Path) -> dict[str, str]:
        """The ``incus`` section: ``config``, the server's ``cluster.rebalance.*`` keys, each
        checked as the Incus backend reads it (a value it would not use is refused)."""
        from opendrs.backends.incus.rebalance import KEYS, PREFIX
        from opendrs.backends.incus.values import incus_duration

        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _INCUS_KEYS)
        cpath = (*path, "config")
        config = self.mapping(mapping["config"], cpath) if "config" in mapping else {}
        self.check_keys(config, cpath, [PREFIX + key for key in KEYS])
        out: dict[str, str] = {}
        for key, item in config.items():
            kpath = (*cpath, key)
            if key == PREFIX + "cooldown":
                text = self.text(item, kpath)
                if incus_duration(text) is None:
                    expected = "expected an Incus duration (6H, 1d 3H)"
                    self.fail(kpath, f"{expected}, got {describe(text)}")
                out[key] = text
            elif key == PREFIX + "batch":
                out[key] = str(self.integer(item, kpath, minimum=0, maximum=10**6))
            else:  # interval (minutes), threshold (percent)
                top = 100.0 if key == PREFIX + "threshold" else 10.0**6
                out[key] = f"{self.number(item, kpath, maximum=top):g}"
        return out

    def snapshot(self, value: object, path: Path) -> Cluster:
        name = self.text(value, path)
        filename, data = self.opener(name, path)
        return snapshot.loads(data, filename=filename)

    def migration(self, value: object, path: Path) -> MigrationModel:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _MIGRATION_KEYS)
        fields: dict[str, float] = {}
        if "bandwidth" in mapping:
            fields["bandwidth"] = self.bandwidth(mapping["bandwidth"], (*path, "bandwidth"))
        if "setup" in mapping:
            fields["setup"] = float(self.duration(mapping["setup"], (*path, "setup")))
        if "failure_rate" in mapping:
            fields["failure_rate"] = self.fraction(mapping["failure_rate"], (*path, "failure_rate"))
        return MigrationModel(**fields)

    # -- workloads --------------------------------------------------------------------------

    def workloads(self, value: object, path: Path, cluster: Cluster) -> tuple[Workload, ...]:
        out: list[Workload] = []
        for index, item in enumerate(self.sequence(value, path)):
            wpath = (*path, index)
            mapping = self.mapping(item, wpath)
            self.check_keys(mapping, wpath, _WORKLOAD_KEYS)
            selector = self.selector(mapping, wpath, cluster)
            cpu = self.pattern(mapping["cpu"], (*wpath, "cpu")) if "cpu" in mapping else None
            memory = (
                self.pattern(mapping["memory"], (*wpath, "memory")) if "memory" in mapping else None
            )
            if cpu is None and memory is None:
                self.fail(wpath, "a workload needs `cpu`, `memory` or both")
            out.append(Workload(selector, cpu, memory))
        return tuple(out)

    def selector(self, mapping: Mapping[Any, Any], path: Path, cluster: Cluster) -> Selector:
        given = [key for key in _SELECTOR_KEYS if key in mapping]
        if len(given) > 1:
            self.fail((*path, given[1]), f"give only one of guests, match, tag (also {given[0]})")
        if not given:
            return Selector()
        key = given[0]
        kpath = (*path, key)
        if key == "guests":
            items = self.sequence(mapping[key], kpath)
            if not items:
                self.fail(kpath, "the list is empty")
            ids: list[str] = []
            for index, item in enumerate(items):
                gid = self.guest_ref(item, (*kpath, index), cluster)
                if gid in ids:
                    self.fail((*kpath, index), f"guest {describe(gid)} is listed twice")
                ids.append(gid)
            return Selector(guests=tuple(ids))
        text = self.text(mapping[key], kpath, allow_int=True)
        selector = Selector(match=text) if key == "match" else Selector(tag=text)
        if not any(selector.matches(g) for g in cluster.guests):
            what = "guest id or name" if key == "match" else "guest tag"
            self.fail(kpath, f"{describe(text)} matches no {what}")
        return selector

    def pattern(self, value: object, path: Path) -> Pattern:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return Pattern(constant=self.fraction(value, path))
        if not isinstance(value, Mapping):
            self.fail(
                path, f"expected a fraction (0–1) or a mapping of patterns, got {describe(value)}"
            )
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _PATTERN_KEYS)
        bases = [key for key in _BASE_KEYS if key in mapping]
        if len(bases) > 1:
            self.fail((*path, bases[1]), f"give only one of constant, walk, ramp (also {bases[0]})")
        if not mapping:
            self.fail(path, f"expected at least one of {', '.join(_PATTERN_KEYS)}")
        fields: dict[str, Any] = {}
        if "constant" in mapping:
            fields["constant"] = self.fraction(mapping["constant"], (*path, "constant"))
        if "walk" in mapping:
            fields["walk"] = self.walk(mapping["walk"], (*path, "walk"))
        if "ramp" in mapping:
            fields["ramp"] = self.ramp(mapping["ramp"], (*path, "ramp"))
        if "diurnal" in mapping:
            fields["diurnal"] = self.diurnal(mapping["diurnal"], (*path, "diurnal"))
        if "weekly" in mapping:
            fields["weekly"] = self.weekly(mapping["weekly"], (*path, "weekly"))
        if "spikes" in mapping:
            fields["spikes"] = self.spikes(mapping["spikes"], (*path, "spikes"))
        if "surges" in mapping:
            fields["surges"] = self.surges(mapping["surges"], (*path, "surges"))
        if "noise" in mapping:
            fields["noise"] = self.fraction(mapping["noise"], (*path, "noise"))
        return Pattern(**fields)

    def walk(self, value: object, path: Path) -> Walk:
        mapping = {} if value is None else self.mapping(value, path)
        self.check_keys(mapping, path, _WALK_KEYS)
        fields: dict[str, Any] = {}
        if "mean" in mapping:
            fields["mean"] = self.fraction(mapping["mean"], (*path, "mean"))
        if "volatility" in mapping:
            fields["volatility"] = self.fraction(mapping["volatility"], (*path, "volatility"))
        if "half_life" in mapping:
            fields["half_life"] = float(
                self.positive_duration(mapping["half_life"], (*path, "half_life"))
            )
        if "min" in mapping:
            fields["low"] = self.fraction(mapping["min"], (*path, "min"))
        if "max" in mapping:
            fields["high"] = self.fraction(mapping["max"], (*path, "max"))
        walk = Walk(**fields)
        if walk.low > walk.high:
            self.fail((*path, "max"), f"must not be less than min ({walk.low:g})")
        return walk

    def ramp(self, value: object, path: Path) -> Ramp:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _RAMP_KEYS)
        return Ramp(
            to=self.fraction(self.require(mapping, "to", path), (*path, "to")),
            over=float(
                self.positive_duration(self.require(mapping, "over", path), (*path, "over"))
            ),
            start=self.fraction(mapping["from"], (*path, "from")) if "from" in mapping else None,
            begin=float(self.duration(mapping["at"], (*path, "at"))) if "at" in mapping else 0.0,
        )

    def diurnal(self, value: object, path: Path) -> Diurnal:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _DIURNAL_KEYS)
        amplitude = self.fraction(self.require(mapping, "amplitude", path), (*path, "amplitude"))
        peak = (
            self.number(mapping["peak"], (*path, "peak"), maximum=24.0)
            if "peak" in mapping
            else 14.0
        )
        return Diurnal(amplitude, peak)

    def weekly(self, value: object, path: Path) -> Weekly:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _WEEKLY_KEYS)
        if not mapping:
            self.fail(path, "expected weekday, weekend or both")
        return Weekly(
            weekday=self.number(mapping.get("weekday", 1.0), (*path, "weekday"), maximum=100.0),
            weekend=self.number(mapping.get("weekend", 1.0), (*path, "weekend"), maximum=100.0),
        )

    def spikes(self, value: object, path: Path) -> Spikes:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _SPIKE_KEYS)
        rate = self.number(self.require(mapping, "rate", path), (*path, "rate"), positive=True)
        height = self.fraction(self.require(mapping, "height", path), (*path, "height"))
        duration = (
            float(self.positive_duration(mapping["duration"], (*path, "duration")))
            if "duration" in mapping
            else 600.0
        )
        return Spikes(rate, height, duration)

    def surges(self, value: object, path: Path) -> tuple[Surge, ...]:
        items = self.sequence(value, path)
        if not items:
            self.fail(path, "expected at least one surge")
        return tuple(self.surge(item, (*path, i)) for i, item in enumerate(items))

    def surge(self, value: object, path: Path) -> Surge:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _SURGE_KEYS)
        return Surge(
            at=float(self.duration(self.require(mapping, "at", path), (*path, "at"))),
            height=self.fraction(self.require(mapping, "height", path), (*path, "height")),
            last=float(
                self.positive_duration(self.require(mapping, "last", path), (*path, "last"))
            ),
            rise=float(self.duration(mapping["rise"], (*path, "rise")))
            if "rise" in mapping
            else 0.0,
        )

    # -- trace ------------------------------------------------------------------------------

    def trace(self, value: object, path: Path, cluster: Cluster) -> Trace:
        filename, data = self.opener(self.text(value, path), path)
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise DocumentError(filename, f"line {line}", "not UTF-8 text") from None
        rows = csv.reader(io.StringIO(text, newline=""))
        header: list[str] | None = None
        columns: dict[str, int] = {}
        samples: dict[str, list[tuple[float, float, int, int]]] = {}
        seen: set[tuple[str, float]] = set()
        count = 0
        try:
            for row in rows:
                line = rows.line_num
                if not row or all(not cell.strip() for cell in row) or row[0].startswith("#"):
                    continue
                cells = [cell.strip() for cell in row]
                if header is None:
                    header = cells
                    columns = self.trace_header(filename, line, header)
                    continue
                if len(cells) != len(header):
                    raise DocumentError(
                        filename, f"line {line}", f"expected {len(header)} fields, got {len(cells)}"
                    )
                count += 1
                if count > MAX_TRACE_ROWS:
                    raise DocumentError(filename, f"line {line}", "too many samples")
                sample = self.trace_row(filename, line, cells, columns, cluster)
                key = (sample[0], sample[1])
                if key in seen:
                    raise DocumentError(
                        filename,
                        f"line {line}",
                        f"a second sample for guest {describe(sample[0])} at the same time",
                    )
                seen.add(key)
                samples.setdefault(sample[0], []).append((sample[1], sample[2], sample[3], line))
        except csv.Error as exc:
            raise DocumentError(filename, f"line {rows.line_num}", f"bad CSV: {exc}") from None
        if header is None:
            raise DocumentError(
                filename,
                "",
                f"the trace is empty (it needs the header {','.join(_TRACE_COLUMNS)} and samples)",
            )
        series = []
        for guest in cluster.guests:
            if guest.id not in samples:
                continue
            items = sorted(samples[guest.id], key=lambda s: (s[0], s[3]))
            series.append(
                TraceSeries(
                    guest.id,
                    tuple(s[0] for s in items),
                    tuple(s[1] for s in items),
                    tuple(s[2] for s in items),
                )
            )
        return Trace(filename, tuple(series))

    def trace_header(self, filename: str, line: int, header: list[str]) -> dict[str, int]:
        columns: dict[str, int] = {}
        for index, name in enumerate(header):
            if name not in _TRACE_COLUMNS:
                close = difflib.get_close_matches(clip(name, 100), _TRACE_COLUMNS, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise DocumentError(
                    filename,
                    f"line {line}",
                    f"unknown column {describe(name)}{hint}; the header is "
                    f"{','.join(_TRACE_COLUMNS)}",
                )
            if name in columns:
                raise DocumentError(filename, f"line {line}", f"column {name!r} appears twice")
            columns[name] = index
        for name in _TRACE_COLUMNS:
            if name not in columns:
                raise DocumentError(
                    filename,
                    f"line {line}",
                    f"missing column {name!r}; the header is {','.join(_TRACE_COLUMNS)}",
                )
        return columns

    def trace_row(
        self,
        filename: str,
        line: int,
        cells: list[str],
        columns: dict[str, int],
        cluster: Cluster,
    ) -> tuple[str, float, float, int]:
        def fail(column: str, reason: str) -> DocumentError:
            return DocumentError(filename, f"line {line}, {column}", reason)

        time_text = cells[columns["time"]]
        try:
            seconds = parse_duration(time_text)
        except UnitError as exc:
            raise fail("time", str(exc)) from None
        guest = cells[columns["guest"]]
        if guest not in cluster.guest_index:
            raise fail(
                "guest", f"unknown guest {describe(guest)}{_suggest(guest, cluster.guest_index)}"
            )
        cpu_text = cells[columns["cpu"]]
        try:
            cpu = float(cpu_text)
        except ValueError:
            raise fail("cpu", f"expected a number of cores, got {describe(cpu_text)}") from None
        if not (cpu >= 0 and cpu < float("inf")):
            raise fail("cpu", f"expected a finite number of cores ≥ 0, got {describe(cpu_text)}")
        memory_text = cells[columns["memory"]]
        try:
            memory = parse_bytes(int(memory_text) if memory_text.isdigit() else memory_text)
        except UnitError as exc:
            raise fail("memory", str(exc)) from None
        return guest, float(seconds), cpu, memory

    # -- faults -----------------------------------------------------------------------------

    def faults(self, value: object, path: Path, cluster: Cluster) -> tuple[Fault, ...]:
        return tuple(
            self.fault(item, (*path, index), cluster)
            for index, item in enumerate(self.sequence(value, path))
        )

    def fault(self, value: object, path: Path, cluster: Cluster) -> Fault:
        mapping = self.mapping(value, path)
        kind = self.choice(self.require(mapping, "type", path), (*path, "type"), FAULT_TYPES)
        if kind == "migration-failure":
            for key in ("per_day", "probability"):
                if key in mapping:
                    self.fail(
                        (*path, key),
                        "random migration failures are set with migration.failure_rate; "
                        "a migration-failure fault is scheduled with `at`",
                    )
        article = "an" if kind[0] in "aeiou" else "a"
        self.check_keys(mapping, path, _FAULT_KEYS[kind], f" for {article} {kind} fault")
        when = [key for key in ("at", "per_day", "probability") if key in mapping]
        if len(when) > 1:
            self.fail(
                (*path, when[1]), f"give only one of at, per_day, probability (also {when[0]})"
            )
        if not when:
            options = [k for k in ("at", "per_day", "probability") if k in _FAULT_KEYS[kind]]
            self.fail(path, f"say when: {' or '.join(options)} is required")
        fields: dict[str, Any] = {"type": kind}
        if "at" in mapping:
            fields["at"] = float(self.duration(mapping["at"], (*path, "at")))
        if "per_day" in mapping:
            fields["per_day"] = self.number(mapping["per_day"], (*path, "per_day"), positive=True)
        if "probability" in mapping:
            fields["probability"] = self.number(
                mapping["probability"], (*path, "probability"), positive=True, maximum=1.0
            )
        if kind == "api-error" and "probability" in mapping and "duration" in mapping:
            self.fail((*path, "duration"), "a per-call probability has no duration")
        if kind == "node-failure" and mapping.get("duration") is None:
            pass  # no duration: the node stays down for good
        elif "duration" in mapping:
            fields["duration"] = float(
                self.positive_duration(mapping["duration"], (*path, "duration"))
            )
        elif kind == "maintenance" or (kind == "api-error" and "probability" not in mapping):
            self.require(mapping, "duration", path)
        if kind in ("node-failure", "maintenance"):
            if "at" in mapping:
                fields["node"] = self.node_ref(
                    self.require(mapping, "node", path), (*path, "node"), cluster
                )
                if "nodes" in mapping:
                    self.fail(
                        (*path, "nodes"), "`nodes` is for random faults (per_day); use `node`"
                    )
            else:
                if "node" in mapping:
                    self.fail((*path, "node"), "a random fault picks among `nodes`; use `nodes`")
                if "nodes" in mapping:
                    npath = (*path, "nodes")
                    items = self.sequence(mapping["nodes"], npath)
                    if not items:
                        self.fail(npath, "the list is empty")
                    names: list[str] = []
                    for index, item in enumerate(items):
                        name = self.node_ref(item, (*npath, index), cluster)
                        if name in names:
                            self.fail((*npath, index), f"node {describe(name)} is listed twice")
                        names.append(name)
                    fields["nodes"] = tuple(names)
        if kind in _MIGRATION_FAULTS and mapping.get("guest") is not None:
            fields["guest"] = self.guest_ref(mapping["guest"], (*path, "guest"), cluster)
        return Fault(**fields)


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    if len(known) > 5000:
        return ""
    close = difflib.get_close_matches(clip(name, 100), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
