"""The snapshot file format: a cluster written by hand, in YAML or JSON — load, validate, dump.

A snapshot holds nodes, guests, rules and settings (see ``docs/snapshot-format.md`` for the
user-facing description). Both syntaxes share one schema: files ending in ``.json`` are parsed with
:mod:`json`, everything else with ``yaml.safe_load`` semantics (plus a check for duplicate keys).

Every problem with the input — an unreadable file, bytes that are not UTF-8, broken syntax, a
wrong type, an unknown key, a reference to a node or guest that does not exist — is reported as a
:class:`SnapshotError` whose ``str()`` is one line, ``FILE: PATH: REASON``; no other exception
escapes :func:`load`, :func:`loads` or :func:`from_dict`.

Paths follow the shape of the document: mappings are walked with ``.`` (``nodes.pve1.cpu``,
``settings.reserve.memory``), lists with a 0-based index (``guests[3].memory``, ``rules[0].nodes``);
keys that are not plain words are quoted (``nodes["pve1.example.com"]``).

:func:`dumps` is canonical: equal clusters give the same text, fields equal to their defaults are
left out, and ``from_dict(to_dict(c)) == c`` for every cluster that :func:`from_dict` can return.
"""

from __future__ import annotations

import codecs
import difflib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import PurePath
from typing import Any, Final, Literal, NoReturn

import yaml

from opendrs.model.cluster import (
    GUEST_KINDS,
    GUEST_STATES,
    HA_STATES,
    USAGE_MODES,
    Cluster,
    Disk,
    Guest,
    Node,
    Pressure,
    Settings,
)
from opendrs.model.rules import GuestAffinity, NodeAffinity, Rules
from opendrs.model.units import UnitError, format_duration, parse_bytes, parse_duration

__all__ = [
    "FORMAT_VERSION",
    "MAX_BYTES",
    "MAX_FILE_BYTES",
    "MAX_NUMBER",
    "RULE_TYPES",
    "SnapshotError",
    "dump",
    "dumps",
    "from_dict",
    "load",
    "load_demo",
    "loads",
    "to_dict",
]

#: The version this module reads and writes.
FORMAT_VERSION: Final = 1
#: Files larger than this are refused rather than read into memory.
MAX_FILE_BYTES: Final = 256 * 1024**2
#: The rule types, in the order :func:`to_dict` writes them.
RULE_TYPES: Final = ("node-affinity", "pin", "affinity", "anti-affinity", "ignore")

#: Largest size accepted, in bytes (8 PiB): every size is then exact as a float64 as well.
MAX_BYTES: Final = 2**53
#: Largest plain number accepted (cores, overcommit ratios, weights, priorities…).
MAX_NUMBER: Final = 1e15
#: Longest duration accepted, in seconds (about 285 million years).
_MAX_SECONDS: Final = 2**53
#: Largest integer accepted as a guest id or a name.
_MAX_ID: Final = 2**63 - 1

Format = Literal["yaml", "json"]
PathPart = str | int
Path = tuple[PathPart, ...]

_MISSING: Final = object()
_DEFAULT_NAME: Final = "cluster"
_PRESSURE_KEYS: Final = ("cpu", "memory", "io", "memory_full", "io_full")
_TOP_KEYS: Final = ("version", "name", "settings", "storage", "nodes", "guests", "rules")
_SETTINGS_KEYS: Final = (
    "mode",
    "cpu_overcommit",
    "memory_overcommit",
    "reserve",
    "allow_restart_migration",
    "allow_local_disks",
    "min_uptime",
    "weights",
    "migration",
)
_MIGRATION_KEYS: Final = ("max_parallel", "max_node_inflow", "cost_unit", "cost_disk_factor")
_NODE_KEYS: Final = (
    "cpu",
    "memory",
    "arch",
    "online",
    "maintenance",
    "tags",
    "storage",
    "reserve",
    "usage",
    "pressure",
)
_GUEST_KEYS: Final = (
    "id",
    "name",
    "kind",
    "node",
    "state",
    "cpu",
    "memory",
    "disks",
    "usage",
    "pressure",
    "devices",
    "uptime",
    "lock",
    "ha",
    "ha_state",
    "tags",
    "priority",
    "migrating_to",
    "arch",
)
_RULE_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "node-affinity": ("type", "name", "guests", "nodes", "strict"),
    "pin": ("type", "name", "guests", "nodes"),
    "affinity": ("type", "name", "guests", "hard"),
    "anti-affinity": ("type", "name", "guests", "hard"),
    "ignore": ("type", "guests"),
}
#: Top-level keys of a proxlb-solver scenario, a different format (see compat/proxlb).
_PROXLB_KEYS: Final = frozenset({"vms", "balancing", "constraints", "expect", "evacuate_node"})
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_CANONICAL_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_YAML_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")
_BINARY_UNITS: Final = (
    ("PiB", 1024**5),
    ("TiB", 1024**4),
    ("GiB", 1024**3),
    ("MiB", 1024**2),
    ("KiB", 1024),
)


# --------------------------------------------------------------------------------------------
# Errors


class SnapshotError(ValueError):
    """A snapshot that cannot be read: ``str()`` is one line, ``FILE: PATH: REASON``.

    ``path`` locates the problem inside the document (``guests[3].memory``); it is empty when the
    problem concerns the whole file, whose reason then often starts with ``line L, column C``.
    """

    def __init__(self, file: str, path: str, reason: str) -> None:
        super().__init__(file, path, reason)
        self.file = file
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        parts = (self.file, self.path, self.reason) if self.path else (self.file, self.reason)
        return _one_line(": ".join(parts))


def _one_line(text: str) -> str:
    """``text`` with every non-printable character (newlines included) escaped."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def _render_path(path: Path) -> str:
    """``("guests", 3, "memory")`` → ``guests[3].memory``; odd keys are quoted."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _PLAIN_KEY.fullmatch(part):
            out.append(f".{part}" if out else part)
        else:
            out.append(f"[{json.dumps(_clip(part), ensure_ascii=False)}]")
    return "".join(out)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(value: object) -> str:
    """A short description of a value for a message: ``'abc'``, ``12``, ``a list``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value) if abs(value) < 10**30 else "a very large integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(_clip(value))
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a value of type {type(value).__name__}"


def _key_text(key: object) -> PathPart:
    """A mapping key as a path part (a string)."""
    return key if isinstance(key, str) else _describe(key)


# --------------------------------------------------------------------------------------------
# Parsing text


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` semantics, except that a key written twice in a mapping is an error."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                    continue
                key = self.construct_object(key_node)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable: the base class reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {_describe(key)}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


class _JsonObject(dict[str, Any]):
    """A JSON object that remembers the first key written twice in it (JSON allows it)."""

    __slots__ = ("duplicate",)

    duplicate: str | None


def _json_object(pairs: list[tuple[str, Any]]) -> _JsonObject:
    obj = _JsonObject(pairs)
    obj.duplicate = None
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                obj.duplicate = key
                break
            seen.add(key)
    return obj


def _line_col(text: str, position: int) -> tuple[int, int]:
    """1-based line and column of ``position`` in ``text``, with YAML's line breaks."""
    lines = _YAML_LINE_BREAK.split(text[:position])
    return len(lines), len(lines[-1]) + 1


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """One line from a PyYAML error: ``line L, column C: problem``."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context and not exc.context.startswith("while "):
            # e.g. "expected a single document in the stream, but found another document"
            problem = f"{exc.context}, {exc.problem}"
        if mark is None:
            return f"invalid YAML: {problem}"
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    if isinstance(exc, yaml.reader.ReaderError):
        line, column = _line_col(text, exc.position)
        char = exc.character
        shown = f"#x{char:04x}" if isinstance(char, int) else repr(char)
        return f"line {line}, column {column}: unacceptable character {shown}: {exc.reason}"
    first = str(exc).strip().splitlines()
    return f"invalid YAML: {first[0] if first else type(exc).__name__}"


def _decode(data: bytes, filename: str) -> str:
    """UTF-8 text from bytes (a leading byte-order mark is dropped)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[start : exc.start].decode("utf-8", "replace")) + 1
        raise SnapshotError(
            filename,
            "",
            f"line {line}, column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x})",
        ) from None


def _parse(text: str, filename: str, fmt: Format) -> object:
    """The document in ``text`` as plain Python values; syntax errors become SnapshotError."""
    try:
        if fmt == "json":
            return json.loads(text, object_pairs_hook=_json_object)
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except json.JSONDecodeError as exc:
        reason = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
    except yaml.YAMLError as exc:
        reason = _yaml_problem(exc, text)
    except RecursionError:
        reason = "the document is nested too deeply"
    except MemoryError:
        reason = "the document is too large to load"
    except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
        # e.g. an integer literal with more digits than Python converts.
        lines = str(exc).splitlines()
        reason = f"cannot read a value: {lines[0] if lines else type(exc).__name__}"
    raise SnapshotError(filename, "", reason)


def _format_for(filename: str, fmt: str | None) -> Format:
    if fmt is None:
        return "json" if filename.lower().endswith(".json") else "yaml"
    if fmt in ("yaml", "json"):
        return fmt  # type: ignore[return-value]
    raise SnapshotError(filename, "", f"unknown format {_describe(fmt)} (use 'yaml' or 'json')")


# --------------------------------------------------------------------------------------------
# Public API: reading


def read_file(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """``(filename, content)`` of a file, or :class:`SnapshotError` saying why it can't be read."""
    try:
        filename = os.fsdecode(path)
    except TypeError:
        raise SnapshotError(_clip(repr(path)), "", "not a file path") from None
    try:
        with open(filename, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SnapshotError(filename, "", f"cannot read the file: {exc.strerror or exc}") from None
    except (ValueError, OverflowError) as exc:  # e.g. a NUL character in the path
        raise SnapshotError(filename, "", f"cannot read the file: {exc}") from None
    except MemoryError:
        raise SnapshotError(filename, "", "the file is too large to load") from None
    if len(data) > MAX_FILE_BYTES:
        limit = _size_out(MAX_FILE_BYTES)
        shown = limit if isinstance(limit, str) else f"{limit} bytes"
        raise SnapshotError(filename, "", f"the file is larger than {shown}")
    return filename, data


def parse(text: str | bytes, *, filename: str = "<string>", fmt: str | None = None) -> object:
    """Parse YAML or JSON text (bytes are decoded as UTF-8) into plain Python data.

    ``fmt`` is ``"yaml"`` or ``"json"``; by default it follows ``filename``'s suffix. Raises
    :class:`SnapshotError` with the line and column of a syntax error, and nothing else.
    """
    syntax = _format_for(filename, fmt)
    if isinstance(text, bytes | bytearray | memoryview):
        text = _decode(bytes(text), filename)
    elif not isinstance(text, str):
        raise SnapshotError(filename, "", f"expected text or bytes, got {_describe(text)}")
    return _parse(text, filename, syntax)


def load(path: str | os.PathLike[str]) -> Cluster:
    """Read a snapshot file (``.json``: JSON, anything else: YAML) into a :class:`Cluster`.

    The cluster's name is the document's ``name``, or else the file name without its suffix.
    Raises :class:`SnapshotError` — and nothing else — for any problem with the file.
    """
    filename, data = read_file(path)
    return loads(data, filename=filename)


def loads(text: str | bytes, *, filename: str = "<string>", fmt: str | None = None) -> Cluster:
    """Parse a snapshot from text (bytes are decoded as UTF-8).

    ``fmt`` is ``"yaml"`` or ``"json"``; by default it follows ``filename``'s suffix. ``filename``
    names the source in error messages and gives the default cluster name.
    """
    return from_dict(parse(text, filename=filename, fmt=fmt), filename=filename)


def from_dict(data: object, *, filename: str = "<dict>") -> Cluster:
    """Validate a parsed document (plain dicts, lists and scalars) and build the cluster.

    Raises :class:`SnapshotError` for the first problem found, and no other exception.
    """
    try:
        return _Reader(filename).cluster(data)
    except SnapshotError:
        raise
    except RecursionError:
        raise SnapshotError(filename, "", "the document is nested too deeply") from None
    except MemoryError:
        raise SnapshotError(filename, "", "the document is too large to load") from None
    except Exception as exc:  # last line of defence: bad input never escapes as another error
        raise SnapshotError(
            filename, "", f"internal error while reading the snapshot ({type(exc).__name__}: {exc})"
        ) from exc


def load_demo() -> Cluster:
    """The built-in demo cluster (``opendrs/data/demo.yaml``)."""
    resource = resources.files("opendrs") / "data" / "demo.yaml"
    return loads(resource.read_bytes(), filename="demo.yaml")


# --------------------------------------------------------------------------------------------
# Validation


def _default_name(filename: str) -> str:
    """The file stem, or ``cluster`` for pseudo names such as ``<string>``."""
    if filename.startswith("<") and filename.endswith(">"):
        return _DEFAULT_NAME
    stem = PurePath(filename).stem
    return stem if stem and stem.isprintable() else _DEFAULT_NAME


class _Reader:
    """Walks a parsed document, checking it field by field and building model objects."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    # -- primitives -------------------------------------------------------------------------

    def fail(self, path: Path, reason: str) -> NoReturn:
        raise SnapshotError(self.filename, _render_path(path), reason)

    def mapping(self, value: object, path: Path) -> Mapping[Any, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_describe(value)}")
        if isinstance(value, _JsonObject) and value.duplicate is not None:
            self.fail((*path, value.duplicate), "duplicate key")
        return value

    def sequence(self, value: object, path: Path) -> Sequence[Any]:
        if not isinstance(value, list | tuple):
            self.fail(path, f"expected a list, got {_describe(value)}")
        return value

    def check_keys(
        self, mapping: Mapping[Any, Any], path: Path, allowed: Sequence[str], hint: str = ""
    ) -> None:
        """Fail on the first key that is not in ``allowed``, suggesting the closest one."""
        for key in mapping:
            if isinstance(key, str) and key in allowed:
                continue
            if isinstance(key, str):
                close = difflib.get_close_matches(_clip(key, 100), allowed, n=1, cutoff=0.6)
                if close:
                    self.fail((*path, key), f"unknown key (did you mean '{close[0]}'?){hint}")
            self.fail((*path, _key_text(key)), f"unknown key (expected {_one_of(allowed)}){hint}")

    def require(self, mapping: Mapping[Any, Any], key: str, path: Path) -> Any:
        value = mapping.get(key, _MISSING)
        if value is _MISSING:
            self.fail((*path, key), "required key is missing")
        return value

    def boolean(self, value: object, path: Path) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_describe(value)}")
        return value

    def number(
        self,
        value: object,
        path: Path,
        *,
        minimum: float = 0.0,
        positive: bool = False,
        maximum: float = MAX_NUMBER,
    ) -> float:
        """A finite number ``>= minimum`` (``> minimum`` when ``positive``) and ``<= maximum``."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected a number, got {_describe(value)}")
        if isinstance(value, int) and abs(value) > MAX_NUMBER:
            self.fail(path, f"number too large (at most {maximum:g})")
        number = float(value)
        if not math.isfinite(number):
            self.fail(path, f"expected a finite number, got {_describe(value)}")
        if positive and number <= minimum:
            self.fail(path, f"must be greater than {minimum:g}, got {_describe(value)}")
        if number < minimum:
            self.fail(path, f"must not be less than {minimum:g}, got {_describe(value)}")
        if number > maximum:
            self.fail(path, f"must not be more than {maximum:g}, got {_describe(value)}")
        return number

    def integer(self, value: object, path: Path, *, minimum: int, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a whole number, got {_describe(value)}")
        if not minimum <= value <= maximum:
            self.fail(path, f"must be between {minimum} and {maximum}, got {_describe(value)}")
        return value

    def size(self, value: object, path: Path, *, positive: bool = False) -> int:
        """Bytes from an integer or a string with a unit (``8GiB``)."""
        try:
            size = parse_bytes(value)
        except UnitError as exc:
            self.fail(path, str(exc))
        if size > MAX_BYTES:
            self.fail(path, "size too large (at most 8 PiB)")
        if positive and size <= 0:
            self.fail(path, f"must be greater than 0, got {_describe(value)}")
        return size

    def duration(self, value: object, path: Path) -> int:
        """Seconds from a number or a string with units (``5m``, ``1d 6h``)."""
        try:
            seconds = parse_duration(value)
        except UnitError as exc:
            self.fail(path, str(exc))
        if seconds > _MAX_SECONDS:
            self.fail(path, "duration too long")
        return seconds

    def text(self, value: object, path: Path, *, allow_int: bool = False) -> str:
        """A non-empty printable string (``allow_int``: a non-negative integer becomes one)."""
        if allow_int and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= _MAX_ID:
                self.fail(path, f"expected a name or a number from 0 to {_MAX_ID}")
            return str(value)
        if not isinstance(value, str):
            expected = "a name or a number" if allow_int else "a string"
            hint = " (quote it)" if isinstance(value, bool | float) or value is None else ""
            self.fail(path, f"expected {expected}, got {_describe(value)}{hint}")
        if not value.strip():
            self.fail(path, "must not be empty")
        if not value.isprintable():
            self.fail(path, f"must contain only printable characters, got {_describe(value)}")
        return value

    def optional_text(self, value: object, path: Path) -> str | None:
        return None if value is None else self.text(value, path)

    def choice(self, value: object, path: Path, choices: Sequence[str]) -> str:
        if isinstance(value, str) and value in choices:
            return value
        if isinstance(value, str):
            close = difflib.get_close_matches(_clip(value, 100), choices, n=1, cutoff=0.6)
            if close:
                self.fail(path, f"unknown value {_describe(value)} (did you mean '{close[0]}'?)")
        self.fail(path, f"expected {_one_of(choices)}, got {_describe(value)}")

    def text_list(self, value: object, path: Path) -> tuple[str, ...]:
        items = self.sequence(value, path)
        out: list[str] = []
        for index, item in enumerate(items):
            if isinstance(item, str) and item.isprintable() and item.strip():
                out.append(item)  # the common case, without building a path
            else:
                out.append(self.text(item, (*path, index), allow_int=True))
        return tuple(out)

    def name_map(self, value: object, path: Path, what: str) -> list[tuple[str, Any, Path]]:
        """``(name, value, path)`` of a mapping keyed by names (node names, pool names)."""
        mapping = self.mapping(value, path)
        out: list[tuple[str, Any, Path]] = []
        seen: set[str] = set()
        for key, item in mapping.items():
            name = self.text(key, (*path, _key_text(key)), allow_int=True)
            if name in seen:
                self.fail((*path, name), f"duplicate {what} {_describe(name)}")
            seen.add(name)
            out.append((name, item, (*path, name)))
        return out

    def pressure(self, value: object, path: Path) -> Pressure:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _PRESSURE_KEYS)
        fields = {
            key: self.number(mapping[key], (*path, key), maximum=100.0)
            for key in _PRESSURE_KEYS
            if key in mapping
        }
        return Pressure(**fields)

    def cpu_memory(self, value: object, path: Path) -> tuple[float | None, int | None]:
        """A ``{cpu: cores, memory: size}`` mapping, either key optional."""
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, ("cpu", "memory"))
        cpu = mapping.get("cpu")
        memory = mapping.get("memory")
        return (
            None if cpu is None else self.number(cpu, (*path, "cpu")),
            None if memory is None else self.size(memory, (*path, "memory")),
        )

    # -- document ---------------------------------------------------------------------------

    def cluster(self, data: object) -> Cluster:
        if data is None:
            self.fail((), "the snapshot is empty (it needs at least `version: 1` and `nodes`)")
        if not isinstance(data, Mapping):
            self.fail((), f"expected a mapping at the top level, got {_describe(data)}")
        doc = self.mapping(data, ())
        if "version" in doc:
            self.version(doc["version"])
        hint = ""
        if _PROXLB_KEYS.intersection(k for k in doc if isinstance(k, str)):
            hint = "; this looks like a proxlb-solver scenario, which is a different format"
        self.check_keys(doc, (), _TOP_KEYS, hint)
        self.version(self.require(doc, "version", ()))
        name = doc.get("name")
        cluster_name = (
            _default_name(self.filename)
            if name is None
            else self.text(name, ("name",), allow_int=True)
        )
        settings = self.settings(doc.get("settings"), ("settings",))
        shared = self.storage(doc.get("storage"), ("storage",))
        nodes = self.nodes(self.require(doc, "nodes", ()), ("nodes",), shared)
        node_names = {node.name: node for node in nodes}
        guests_value = doc.get("guests")
        guests = () if guests_value is None else self.guests(guests_value, node_names, shared)
        rules_value = doc.get("rules")
        guest_ids = {guest.id for guest in guests}
        rules = Rules() if rules_value is None else self.rules(rules_value, node_names, guest_ids)
        return Cluster(nodes, guests, rules, settings, cluster_name)

    def version(self, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(("version",), f"expected the number {FORMAT_VERSION}, got {_describe(value)}")
        if value != FORMAT_VERSION:
            self.fail(
                ("version",),
                f"unsupported version {_describe(value)} (this opendrs reads version "
                f"{FORMAT_VERSION})",
            )

    def settings(self, value: object, path: Path) -> Settings:
        if value is None:
            return Settings()
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _SETTINGS_KEYS)
        fields: dict[str, Any] = {}
        if "mode" in mapping:
            fields["mode"] = self.choice(mapping["mode"], (*path, "mode"), USAGE_MODES)
        for key in ("cpu_overcommit", "memory_overcommit"):
            if key in mapping:
                fields[key] = self.number(mapping[key], (*path, key), positive=True)
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"))
            if cpu is not None:
                fields["reserve_cpu"] = cpu
            if memory is not None:
                fields["reserve_memory"] = memory
        for key in ("allow_restart_migration", "allow_local_disks"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "migration" in mapping:
            mpath = (*path, "migration")
            migration = self.mapping(mapping["migration"], mpath)
            self.check_keys(migration, mpath, _MIGRATION_KEYS)
            for key in ("max_parallel", "max_node_inflow"):
                if key in migration:
                    fields[key] = self.integer(
                        migration[key], (*mpath, key), minimum=1, maximum=100_000
                    )
            if "cost_unit" in migration:
                fields["cost_unit"] = self.size(
                    migration["cost_unit"], (*mpath, "cost_unit"), positive=True
                )
            if "cost_disk_factor" in migration:
                key = "cost_disk_factor"
                fields[key] = self.number(migration[key], (*mpath, key))
        if "min_uptime" in mapping:
            fields["min_uptime"] = self.duration(mapping["min_uptime"], (*path, "min_uptime"))
        if "weights" in mapping:
            wpath = (*path, "weights")
            weights = self.mapping(mapping["weights"], wpath)
            self.check_keys(weights, wpath, ("cpu", "memory"))
            defaults = Settings()
            cpu_weight = (
                self.number(weights["cpu"], (*wpath, "cpu"))
                if "cpu" in weights
                else defaults.weight_cpu
            )
            memory_weight = (
                self.number(weights["memory"], (*wpath, "memory"))
                if "memory" in weights
                else defaults.weight_memory
            )
            if cpu_weight == 0 and memory_weight == 0:
                self.fail(wpath, "the cpu and memory weights must not both be 0")
            fields["weight_cpu"] = cpu_weight
            fields["weight_memory"] = memory_weight
        return Settings(**fields)

    def storage(self, value: object, path: Path) -> frozenset[str]:
        """The catalogue of pools: the names of the shared ones."""
        if value is None:
            return frozenset()
        shared: set[str] = set()
        for name, item, ppath in self.name_map(value, path, "pool"):
            pool = {} if item is None else self.mapping(item, ppath)
            self.check_keys(pool, ppath, ("shared",))
            if "shared" in pool and self.boolean(pool["shared"], (*ppath, "shared")):
                shared.add(name)
        return frozenset(shared)

    def nodes(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Node, ...]:
        if isinstance(value, list):
            self.fail(path, "expected a mapping of node name to node (pve1: {cpu: …}), got a list")
        entries = self.name_map(value, path, "node name")
        if not entries:
            self.fail(path, "a snapshot needs at least one node")
        return tuple(self.node(name, item, npath, shared) for name, item, npath in entries)

    def node(self, name: str, value: object, path: Path, shared: frozenset[str]) -> Node:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _NODE_KEYS)
        fields: dict[str, Any] = {
            "name": name,
            "cpu": self.number(self.require(mapping, "cpu", path), (*path, "cpu"), positive=True),
            "memory": self.size(
                self.require(mapping, "memory", path), (*path, "memory"), positive=True
            ),
        }
        if "arch" in mapping:
            fields["arch"] = self.text(mapping["arch"], (*path, "arch"))
        for key in ("online", "maintenance"):
            if key in mapping:
                fields[key] = self.boolean(mapping[key], (*path, key))
        if "tags" in mapping:
            fields["tags"] = self.text_list(mapping["tags"], (*path, "tags"))
        if "storage" in mapping:
            capacity: dict[str, int] = {}
            for pool, size, spath in self.name_map(mapping["storage"], (*path, "storage"), "pool"):
                if pool in shared:
                    self.fail(
                        spath, f"pool {_describe(pool)} is shared; list only local pools here"
                    )
                capacity[pool] = self.size(size, spath)
            fields["storage"] = capacity
        if "reserve" in mapping:
            cpu, memory = self.cpu_memory(mapping["reserve"], (*path, "reserve"))
            fields["reserve_cpu"] = cpu
            fields["reserve_memory"] = memory
        if "usage" in mapping:
            cpu, memory = self.cpu_memory(mapping["usage"], (*path, "usage"))
            fields["base_cpu"] = 0.0 if cpu is None else cpu
            fields["base_memory"] = 0 if memory is None else memory
        if "pressure" in mapping:
            fields["pressure"] = self.pressure(mapping["pressure"], (*path, "pressure"))
        return Node(**fields)

    def guests(
        self, value: object, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> tuple[Guest, ...]:
        path: Path = ("guests",)
        if isinstance(value, Mapping):
            self.fail(path, "expected a list of guests (- id: 101 …), got a mapping")
        items = self.sequence(value, path)
        guests: list[Guest] = []
        first_at: dict[str, int] = {}
        for index, item in enumerate(items):
            guest = self.guest(item, ("guests", index), nodes, shared)
            if guest.id in first_at:
                self.fail(
                    ("guests", index, "id"),
                    f"duplicate guest id {_describe(guest.id)} (also guests[{first_at[guest.id]}])",
                )
            first_at[guest.id] = index
            guests.append(guest)
        return tuple(guests)

    def node_ref(self, value: object, path: Path, nodes: Mapping[str, Node]) -> str:
        name = self.text(value, path, allow_int=True)
        if name not in nodes:
            self.fail(path, f"unknown node {_describe(name)}{_suggest(name, nodes)}")
        return name

    def guest(
        self, value: object, path: Path, nodes: Mapping[str, Node], shared: frozenset[str]
    ) -> Guest:
        mapping = self.mapping(value, path)
        self.check_keys(mapping, path, _GUEST_KEYS)
        has = mapping.__contains__

        def at(key: str) -> Path:
            return (*path, key)

        guest_id = self.text(self.require(mapping, "id", path), at("id"), allow_int=True)
        fields: dict[str, Any] = {"id": guest_id}
        if has("name") and mapping["name"] is not None:
            fields["name"] = self.text(mapping["name"], at("name"), allow_int=True)
        if has("kind"):
            fields["kind"] = self.choice(mapping["kind"], at("kind"), GUEST_KINDS)
        node = self.node_ref(self.require(mapping, "node", path), at("node"), nodes)
        fields["node"] = node
        if has("state"):
            fields["state"] = self.choice(mapping["state"], at("state"), GUEST_STATES)
        if has("cpu"):
            fields["cpu"] = self.number(mapping["cpu"], at("cpu"), positive=True)
        fields["memory"] = self.size(
            self.require(mapping, "memory", path), at("memory"), positive=True
        )
        if has("disks"):
            fields["disks"] = self.disks(mapping["disks"], at("disks"), shared)
        if has("usage"):
            cpu_used, memory_used = self.cpu_memory(mapping["usage"], at("usage"))
            fields["cpu_used"] = cpu_used
            fields["memory_used"] = memory_used
        if has("pressure"):
            fields["pressure"] = self.pressure(mapping["pressure"], at("pressure"))
        if has("devices"):
            fields["devices"] = self.text_list(mapping["devices"], at("devices"))
        if has("uptime"):
            fields["uptime"] = self.duration(mapping["uptime"], at("uptime"))
        if has("lock"):
            fields["lock"] = self.optional_text(mapping["lock"], at("lock"))
        ha = self.boolean(mapping["ha"], at("ha")) if has("ha") else False
        fields["ha"] = ha
        if has("ha_state") and mapping["ha_state"] is not None:
            if not ha:
                self.fail(at("ha_state"), "only HA-managed guests have an HA state (set ha: true)")
            fields["ha_state"] = self.choice(mapping["ha_state"], at("ha_state"), HA_STATES)
        if has("tags"):
            fields["tags"] = self.text_list(mapping["tags"], at("tags"))
        if has("priority"):
            fields["priority"] = self.integer(
                mapping["priority"], at("priority"), minimum=1, maximum=3
            )
        if has("migrating_to") and mapping["migrating_to"] is not None:
            target = self.node_ref(mapping["migrating_to"], at("migrating_to"), nodes)
            if target == node:
                self.fail(at("migrating_to"), f"the guest is already on {_describe(node)}")
            fields["migrating_to"] = target
        if has("arch"):
            fields["arch"] = self.optional_text(mapping["arch"], at("arch"))
        return Guest(**fields)

    def disks(self, value: object, path: Path, shared: frozenset[str]) -> tuple[Disk, ...]:
        disks: list[Disk] = []
        for index, item in enumerate(self.sequence(value, path)):
            dpath = (*path, index)
            disk = self.mapping(item, dpath)
            self.check_keys(disk, dpath, ("pool", "size"))
            pool = self.text(self.require(disk, "pool", dpath), (*dpath, "pool"), allow_int=True)
            size = self.size(self.require(disk, "size", dpath), (*dpath, "size"))
            disks.append(Disk(pool, size, pool in shared))
        return tuple(disks)

    # -- rules ------------------------------------------------------------------------------

    def rules(
        self, value: object, nodes: Mapping[str, Node], guest_ids: set[str] | frozenset[str]
    ) -> Rules:
        node_rules: list[NodeAffinity] = []
        guest_rules: list[GuestAffinity] = []
        ignored: set[str] = set()
        names: dict[str, int] = {}
        counters = dict.fromkeys(RULE_TYPES, 0)
        for index, item in enumerate(self.sequence(value, ("rules",))):
            path: Path = ("rules", index)
            rule = self.mapping(item, path)
            kind = self.choice(self.require(rule, "type", path), (*path, "type"), RULE_TYPES)
            self.check_keys(rule, path, _RULE_KEYS[kind])
            counters[kind] += 1
            minimum = 2 if kind in ("affinity", "anti-affinity") else 1
            guests = self.rule_guests(self.require(rule, "guests", path), path, guest_ids, minimum)
            if kind == "ignore":
                ignored.update(guests)
                continue
            name = self.rule_name(rule, index, kind, counters[kind], guests, names)
            if kind in ("node-affinity", "pin"):
                priorities = self.rule_nodes(self.require(rule, "nodes", path), path, nodes, kind)
                # A pin is strict by definition; a node affinity is strict only when asked.
                strict = kind == "pin" or (
                    "strict" in rule and self.boolean(rule["strict"], (*path, "strict"))
                )
                node_rules.append(NodeAffinity(name, guests, priorities, strict))
            else:
                hard = self.boolean(rule["hard"], (*path, "hard")) if "hard" in rule else True
                guest_rules.append(GuestAffinity(name, guests, kind == "affinity", hard))
        return Rules(tuple(node_rules), tuple(guest_rules), frozenset(ignored))

    def rule_name(
        self,
        rule: Mapping[Any, Any],
        index: int,
        kind: str,
        count: int,
        guests: tuple[str, ...],
        names: dict[str, int],
    ) -> str:
        path: Path = ("rules", index)
        given = rule.get("name")
        if given is not None:
            name = self.text(given, (*path, "name"), allow_int=True)
            where: Path = (*path, "name")
        else:
            name = _generated_name(kind, count, guests)
            where = path
        if name in names:
            generated = "" if given is not None else "generated "
            self.fail(
                where,
                f"duplicate rule name: {generated}{_describe(name)} is also the name of "
                f"rules[{names[name]}]" + ("" if given is not None else "; give this rule a name"),
            )
        names[name] = index
        return name

    def rule_guests(
        self, value: object, path: Path, guest_ids: set[str] | frozenset[str], minimum: int
    ) -> tuple[str, ...]:
        gpath = (*path, "guests")
        items = self.sequence(value, gpath)
        if len(items) < minimum:
            need = "at least two guests" if minimum == 2 else "at least one guest"
            self.fail(gpath, f"the rule needs {need}, got {len(items)}")
        out: list[str] = []
        seen: set[str] = set()
        for index, item in enumerate(items):
            ipath = (*gpath, index)
            guest_id = self.text(item, ipath, allow_int=True)
            if guest_id not in guest_ids:
                self.fail(ipath, f"unknown guest {_describe(guest_id)}")
            if guest_id in seen:
                self.fail(ipath, f"guest {_describe(guest_id)} is listed twice")
            seen.add(guest_id)
            out.append(guest_id)
        return tuple(out)

    def rule_nodes(
        self, value: object, path: Path, nodes: Mapping[str, Node], kind: str
    ) -> dict[str, int]:
        npath = (*path, "nodes")
        priorities: dict[str, int] = {}
        if isinstance(value, Mapping) and kind == "node-affinity":
            for name, priority, ppath in self.name_map(value, npath, "node"):
                self.node_ref(name, ppath, nodes)
                priorities[name] = self.integer(priority, ppath, minimum=0, maximum=_MAX_ID)
        else:
            if isinstance(value, Mapping):
                self.fail(npath, "expected a list of node names (a pin has no priorities)")
            items = self.sequence(value, npath)
            for index, item in enumerate(items):
                name = self.node_ref(item, (*npath, index), nodes)
                if name in priorities:
                    self.fail((*npath, index), f"node {_describe(name)} is listed twice")
                priorities[name] = 0
        if not priorities:
            self.fail(npath, "the rule needs at least one node")
        return priorities


def _generated_name(kind: str, count: int, guests: tuple[str, ...]) -> str:
    """The name of a rule that has none: ``pin-<guests>`` for pins, else ``<type>-<n>``."""
    if kind == "pin":
        return "pin-" + "-".join(guests)
    return f"{kind}-{count}"


def _one_of(choices: Sequence[str]) -> str:
    if len(choices) == 1:
        return f"'{choices[0]}'"
    return "one of " + ", ".join(choices)


def _suggest(name: str, known: Mapping[str, Any]) -> str:
    if len(known) > 1000:
        return ""
    close = difflib.get_close_matches(_clip(name, 100), list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------------------------
# Writing


def _num(value: float) -> int | float:
    """A number as written: whole numbers without ``.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def _size_out(size: int) -> int | str:
    """Bytes as written: ``8GiB`` when a binary unit divides the size exactly, else bytes."""
    if size > 0:
        for unit, factor in _BINARY_UNITS:
            if size % factor == 0:
                return f"{size // factor}{unit}"
    return size


def _duration_out(seconds: int) -> int | str:
    return format_duration(seconds) if seconds > 0 else 0


def _id_out(value: str) -> int | str:
    """An id or name as written: ``"101"`` becomes ``101``; anything else stays a string."""
    return int(value) if _CANONICAL_INT.fullmatch(value) else value


def _cpu_memory_out(cpu: float | None, memory: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cpu is not None:
        out["cpu"] = _num(cpu)
    if memory is not None:
        out["memory"] = _size_out(memory)
    return out


def _pressure_out(pressure: Pressure) -> dict[str, Any]:
    return {k: _num(getattr(pressure, k)) for k in _PRESSURE_KEYS if getattr(pressure, k) != 0}


def _settings_out(settings: Settings) -> dict[str, Any]:
    default = Settings()
    out: dict[str, Any] = {}
    if settings.mode != default.mode:
        out["mode"] = settings.mode
    for key in ("cpu_overcommit", "memory_overcommit"):
        if getattr(settings, key) != getattr(default, key):
            out[key] = _num(getattr(settings, key))
    reserve = _cpu_memory_out(
        settings.reserve_cpu if settings.reserve_cpu != default.reserve_cpu else None,
        settings.reserve_memory if settings.reserve_memory != default.reserve_memory else None,
    )
    if reserve:
        out["reserve"] = reserve
    for key in ("allow_restart_migration", "allow_local_disks"):
        if getattr(settings, key) != getattr(default, key):
            out[key] = getattr(settings, key)
    if settings.min_uptime != default.min_uptime:
        out["min_uptime"] = _duration_out(settings.min_uptime)
    weights: dict[str, Any] = {}
    if settings.weight_cpu != default.weight_cpu:
        weights["cpu"] = _num(settings.weight_cpu)
    if settings.weight_memory != default.weight_memory:
        weights["memory"] = _num(settings.weight_memory)
    if weights:
        out["weights"] = weights
    migration: dict[str, Any] = {}
    for key in ("max_parallel", "max_node_inflow"):
        if getattr(settings, key) != getattr(default, key):
            migration[key] = getattr(settings, key)
    if settings.cost_unit != default.cost_unit:
        migration["cost_unit"] = _size_out(settings.cost_unit)
    if settings.cost_disk_factor != default.cost_disk_factor:
        migration["cost_disk_factor"] = _num(settings.cost_disk_factor)
    if migration:
        out["migration"] = migration
    return out


def _shared_pools(cluster: Cluster) -> list[str]:
    """The shared pools used by guest disks, in order of first use; fails on ambiguous pools."""
    shared: dict[str, None] = {}
    local: set[str] = {pool for node in cluster.nodes for pool in node.storage}
    for guest in cluster.guests:
        for disk in guest.disks:
            if disk.shared:
                shared.setdefault(disk.pool)
            else:
                local.add(disk.pool)
    both = sorted(local.intersection(shared))
    if both:
        raise ValueError(
            f"pool {both[0]!r} is used both as a shared and as a local pool; a snapshot cannot "
            "express that"
        )
    return list(shared)


def _node_out(node: Node) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": _num(node.cpu), "memory": _size_out(node.memory)}
    if node.arch != "x86_64":
        out["arch"] = node.arch
    if not node.online:
        out["online"] = False
    if node.maintenance:
        out["maintenance"] = True
    if node.tags:
        out["tags"] = [_id_out(tag) for tag in node.tags]
    if node.storage:
        out["storage"] = {pool: _size_out(node.storage[pool]) for pool in sorted(node.storage)}
    reserve = _cpu_memory_out(node.reserve_cpu, node.reserve_memory)
    if reserve:
        out["reserve"] = reserve
    usage = _cpu_memory_out(
        node.base_cpu if node.base_cpu else None, node.base_memory if node.base_memory else None
    )
    if usage:
        out["usage"] = usage
    pressure = _pressure_out(node.pressure)
    if pressure:
        out["pressure"] = pressure
    return out


_DEFAULT_GUEST: Final = Guest(id="", node="")


def _guest_out(guest: Guest) -> dict[str, Any]:
    default = _DEFAULT_GUEST
    out: dict[str, Any] = {"id": _id_out(guest.id)}
    if guest.name:
        out["name"] = _id_out(guest.name)
    if guest.kind != default.kind:
        out["kind"] = guest.kind
    out["node"] = _id_out(guest.node)
    if guest.state != default.state:
        out["state"] = guest.state
    if guest.cpu != default.cpu:
        out["cpu"] = _num(guest.cpu)
    out["memory"] = _size_out(guest.memory)
    if guest.disks:
        out["disks"] = [{"pool": _id_out(d.pool), "size": _size_out(d.size)} for d in guest.disks]
    usage = _cpu_memory_out(guest.cpu_used, guest.memory_used)
    if usage:
        out["usage"] = usage
    pressure = _pressure_out(guest.pressure)
    if pressure:
        out["pressure"] = pressure
    if guest.devices:
        out["devices"] = [_id_out(device) for device in guest.devices]
    if guest.uptime:
        out["uptime"] = _duration_out(guest.uptime)
    if guest.lock is not None:
        out["lock"] = guest.lock
    if guest.ha:
        out["ha"] = True
    if guest.ha_state is not None:
        out["ha_state"] = guest.ha_state
    if guest.tags:
        out["tags"] = [_id_out(tag) for tag in guest.tags]
    if guest.priority != default.priority:
        out["priority"] = guest.priority
    if guest.migrating_to is not None:
        out["migrating_to"] = _id_out(guest.migrating_to)
    if guest.arch is not None:
        out["arch"] = guest.arch
    return out


def _rules_out(cluster: Cluster) -> list[dict[str, Any]]:
    rules = cluster.rules
    node_order = cluster.node_index
    guest_order = cluster.guest_index
    out: list[dict[str, Any]] = []
    counters = dict.fromkeys(RULE_TYPES, 0)

    def named(rule: dict[str, Any], kind: str, name: str, guests: tuple[str, ...]) -> None:
        counters[kind] += 1
        if name != _generated_name(kind, counters[kind], guests):
            rule["name"] = _id_out(name)

    for affinity in rules.node_affinity:
        nodes = sorted(affinity.nodes, key=lambda n: (node_order.get(n, len(node_order)), n))
        guests = [_id_out(g) for g in affinity.guests]
        is_pin = affinity.strict and all(p == 0 for p in affinity.nodes.values())
        rule: dict[str, Any] = {"type": "pin" if is_pin else "node-affinity"}
        named(rule, rule["type"], affinity.name, affinity.guests)
        rule["guests"] = guests
        if all(p == 0 for p in affinity.nodes.values()):
            rule["nodes"] = [_id_out(n) for n in nodes]
        else:
            rule["nodes"] = {n: affinity.nodes[n] for n in nodes}
        if affinity.strict and not is_pin:
            rule["strict"] = True
        out.append(rule)
    for group in rules.guest_affinity:
        kind = "affinity" if group.positive else "anti-affinity"
        rule = {"type": kind}
        named(rule, kind, group.name, group.guests)
        rule["guests"] = [_id_out(g) for g in group.guests]
        if not group.hard:
            rule["hard"] = False
        out.append(rule)
    if rules.ignored:
        ignored = sorted(rules.ignored, key=lambda g: (guest_order.get(g, len(guest_order)), g))
        out.append({"type": "ignore", "guests": [_id_out(g) for g in ignored]})
    return out


def to_dict(cluster: Cluster) -> dict[str, Any]:
    """The document for ``cluster``: plain dicts, lists and scalars, defaults left out.

    ``version``, ``name``, ``nodes`` and ``guests`` are always written. Raises :class:`ValueError`
    for a cluster the format cannot express (a pool used both as shared and as local).
    """
    out: dict[str, Any] = {"version": FORMAT_VERSION, "name": _id_out(cluster.name)}
    settings = _settings_out(cluster.settings)
    if settings:
        out["settings"] = settings
    shared = _shared_pools(cluster)
    if shared:
        out["storage"] = {pool: {"shared": True} for pool in shared}
    out["nodes"] = {node.name: _node_out(node) for node in cluster.nodes}
    out["guests"] = [_guest_out(guest) for guest in cluster.guests]
    rules = _rules_out(cluster)
    if rules:
        out["rules"] = rules
    return out


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key, and no anchors or aliases."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dumps(cluster: Cluster, fmt: str = "yaml") -> str:
    """The canonical text of ``cluster`` in ``fmt`` (``"yaml"`` or ``"json"``).

    Deterministic: equal clusters give identical text, and loading the text gives an equal
    cluster whose dump is byte-identical.
    """
    document = to_dict(cluster)
    if fmt == "json":
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        return yaml.dump(
            document,
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=None,
            allow_unicode=True,
            width=100,
        )
    raise ValueError(f"unknown format {fmt!r} (use 'yaml' or 'json')")


def dump(cluster: Cluster, path: str | os.PathLike[str], fmt: str | None = None) -> None:
    """Write ``cluster`` to ``path`` (format from the suffix unless ``fmt`` is given), UTF-8."""
    filename = os.fsdecode(path)
    syntax = fmt or ("json" if filename.lower().endswith(".json") else "yaml")
    text = dumps(cluster, syntax)
    with open(filename, "w", encoding="utf-8", newline="\n") as stream:
        stream.write(text)
