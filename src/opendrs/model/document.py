"""Reading YAML and JSON documents with one-line errors: the shared reader of opendrs's files.

Snapshots, scenarios and configuration files all go through here; YAML through libyaml when
PyYAML has it (see :func:`_load_yaml`). Every problem — an unreadable file, bytes that are not
UTF-8, broken syntax, a wrong type, an unknown key — becomes a :class:`DocumentError` whose
``str()`` is one line, ``FILE: PATH: REASON``, where ``PATH`` follows the shape of the document:
mappings are walked with ``.`` (``policy.hold``), lists with a 0-based index (``faults[3].at``);
keys that are not plain words are quoted (``nodes["pve1.example.com"]``).

:class:`Reader` holds the checking primitives (mappings, numbers, sizes, durations, choices with
did-you-mean suggestions); each file format subclasses it.
"""

from __future__ import annotations

import codecs
import datetime
import gc
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Final, Literal, NoReturn

import yaml

from opendrs.model.units import UnitError, format_duration, parse_bytes, parse_duration
from opendrs.model.yamlload import NotPlain, load_plain

#: Files larger than this are refused rather than read into memory.
MAX_FILE_BYTES: Final = 256 * 1024**2
#: Largest size accepted, in bytes (8 PiB): every size is then exact as a float64 as well.
MAX_BYTES: Final = 2**53
#: Largest plain number accepted (cores, overcommit ratios, weights, priorities…).
MAX_NUMBER: Final = 1e15
#: Longest duration accepted anywhere, in seconds: 100 years (36500 days). Every duration is
#: then a time the platform can wait for (sleeps, socket timeouts) and add to the clock; each
#: field may bound it further.
MAX_SECONDS: Final = 36500 * 86400
#: Largest integer accepted as an id or a name.
MAX_ID: Final = 2**63 - 1
#: Longest name (of a cluster, node, guest, pool, policy) accepted, in characters.
MAX_NAME: Final = 255

Format = Literal["yaml", "json"]
PathPart = str | int
Path = tuple[PathPart, ...]

MISSING: Final = object()
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_YAML_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


# --------------------------------------------------------------------------------------------
# Errors


class DocumentError(ValueError):
    """A document that cannot be read: ``str()`` is one line, ``FILE: PATH: REASON``.

    ``path`` locates the problem inside the document (``guests[3].memory``); it is empty when the
    problem concerns the whole file, whose reason then often starts with ``line L, column C``.
    """

    def __init__(self, file: str, path: str, reason: str, *, parts: Path = ()) -> None:
        super().__init__(file, path, reason)
        self.file = file
        self.path = path
        self.reason = reason
        #: ``path`` as its parts (``("guests", 3, "memory")``), when a reader knows them.
        self.parts = parts

    def __str__(self) -> str:
        parts = (self.file, self.path, self.reason) if self.path else (self.file, self.reason)
        return one_line(": ".join(parts))


def one_line(text: str) -> str:
    """``text`` with every non-printable character (newlines included) escaped."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def render_path(path: Path) -> str:
    """``("guests", 3, "memory")`` → ``guests[3].memory``; odd keys are quoted."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _PLAIN_KEY.fullmatch(part):
            out.append(f".{part}" if out else part)
        else:
            out.append(f"[{json.dumps(clip(part), ensure_ascii=False)}]")
    return "".join(out)


def clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def closest(word: str, choices: Sequence[str]) -> str | None:
    """The choice ``word`` was likely meant to be (a message's "did you mean"), if any."""
    import difflib  # here: only a mistake needs it, and every command reads a document

    close = difflib.get_close_matches(clip(word, 100), choices, n=1, cutoff=0.6)
    return close[0] if close else None


def describe(value: object) -> str:
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
        return repr(clip(value))
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, datetime.date):  # YAML reads 2024-01-01 as a date
        return f"the date {value.isoformat()}"
    return f"a value of type {type(value).__name__}"


def key_text(key: object) -> PathPart:
    """A mapping key as a path part (a string): a date as it was written."""
    if isinstance(key, datetime.date):
        return key.isoformat()
    return key if isinstance(key, str) else describe(key)


# --------------------------------------------------------------------------------------------
# Parsing text


class _DuplicateKeyCheck(yaml.constructor.SafeConstructor):
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
                        f"duplicate key {describe(key)}",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


class _Loader(_DuplicateKeyCheck, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader, a repeated key refused."""


_CLoader: type | None = None
if yaml.__with_libyaml__:

    class _LibyamlLoader(_DuplicateKeyCheck, yaml.CSafeLoader):
        """libyaml's safe loader, a repeated key refused."""

    _CLoader = _LibyamlLoader


def _load_yaml(text: str) -> object:
    """The one document in ``text``, as ``yaml.safe_load`` reads it, a repeated key refused.

    With libyaml (``yaml.__with_libyaml__``), a plain document is built straight from its events
    (:mod:`opendrs.model.yamlload`), any other by libyaml's loader; a syntax error libyaml finds
    is worded by the pure-Python loader, which locates it at the same line and column in the
    words this reader always gave (and whose result stands, should it read the text after all).
    Without libyaml, the pure-Python loader reads everything.
    """
    if _CLoader is None:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    with collector_paused():
        try:
            try:
                return load_plain(text, _CLoader)
            except NotPlain:
                return yaml.load(text, Loader=_CLoader)  # a CSafeLoader subclass
        except yaml.constructor.ConstructorError:
            raise
        except (yaml.YAMLError, UnicodeEncodeError):  # libyaml refused the syntax, or the text
            return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while a document is read: a big one is millions of new
    objects, none of them garbage, which every collection would walk again (nested uses are
    fine: the collector runs again only if it ran before)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


def sound_mapping(value: object) -> bool:
    """Whether ``value`` is a mapping :meth:`Reader.mapping` takes as it is: a dict, or a JSON
    object with no key written twice."""
    kind = type(value)
    return kind is dict or (kind is _JsonObject and value.duplicate is None)  # type: ignore[union-attr]


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
        raise DocumentError(
            filename,
            "",
            f"line {line}, column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x})",
        ) from None


def _parse(text: str, filename: str, fmt: Format) -> object:
    """The document in ``text`` as plain Python values; syntax errors become DocumentError."""
    try:
        if fmt == "json":
            with collector_paused():
                return json.loads(text, object_pairs_hook=_json_object)
        return _load_yaml(text)
    except json.JSONDecodeError as exc:
        reason = f"line {exc.lineno}, column {exc.colno}: {exc.msg}" + _not_json(
            exc, text, filename
        )
    except yaml.YAMLError as exc:
        reason = _yaml_problem(exc, text)
    except RecursionError:
        reason = "the document is nested too deeply"
    except MemoryError:
        reason = "the document is too large to load"
    except (ValueError, OverflowError, TypeError, ArithmeticError) as exc:
        reason = f"cannot read a value: {_value_problem(exc)}"
    raise DocumentError(filename, "", reason)


def _not_json(exc: json.JSONDecodeError, text: str, filename: str) -> str:
    """The hint for a file named ``.json`` that is not JSON from its first character on
    (YAML, most likely): its name chose the parser."""
    start = text.lstrip()
    if not filename.lower().endswith(".json") or not start or start.startswith(("{", "[")):
        return ""
    if exc.pos != len(text) - len(start):
        return ""
    return " (the file's name ends in .json, so it is read as JSON; YAML needs another name)"


def _value_problem(exc: Exception) -> str:
    """What is wrong with a value the parser could not convert, in the file's terms: an integer
    literal with more digits than Python converts is named so, without the interpreter's advice
    on raising its limit."""
    digits = re.search(r"value has (\d+) digits", str(exc))
    if digits is not None:
        return f"a number of {digits.group(1)} digits (at most {sys.get_int_max_str_digits()})"
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


def _format_for(filename: str, fmt: str | None) -> Format:
    if fmt is None:
        return "json" if filename.lower().endswith(".json") else "yaml"
    if fmt in ("yaml", "json"):
        return fmt  # type: ignore[return-value]
    raise DocumentError(filename, "", f"unknown format {describe(fmt)} (use 'yaml' or 'json')")


def read_file(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    """``(filename, content)`` of a file, or :class:`DocumentError` saying why it can't be read."""
    try:
        filename = os.fsdecode(path)
    except TypeError:
        raise DocumentError(clip(repr(path)), "", "not a file path") from None
    try:
        with open(filename, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise DocumentError(filename, "", f"cannot read the file: {exc.strerror or exc}") from None
    except (ValueError, OverflowError) as exc:  # e.g. a NUL character in the path
        raise DocumentError(filename, "", f"cannot read the file: {exc}") from None
    except MemoryError:
        raise DocumentError(filename, "", "the file is too large to load") from None
    if len(data) > MAX_FILE_BYTES:
        limit = MAX_FILE_BYTES
        shown = f"{limit // 1024**2}MiB" if limit % 1024**2 == 0 else f"{limit} bytes"
        raise DocumentError(filename, "", f"the file is larger than {shown}")
    return filename, data


def parse(text: str | bytes, *, filename: str = "<string>", fmt: str | None = None) -> object:
    """Parse YAML or JSON text (bytes are decoded as UTF-8) into plain Python data.

    ``fmt`` is ``"yaml"`` or ``"json"``; by default it follows ``filename``'s suffix. Raises
    :class:`DocumentError` with the line and column of a syntax error, and nothing else.
    """
    syntax = _format_for(filename, fmt)
    if isinstance(text, bytes | bytearray | memoryview):
        text = _decode(bytes(text), filename)
    elif not isinstance(text, str):
        raise DocumentError(filename, "", f"expected text or bytes, got {describe(text)}")
    return _parse(text, filename, syntax)


# --------------------------------------------------------------------------------------------
# Checking values


class Reader:
    """Walks a parsed document, checking it field by field; subclasses build the objects."""

    def __init__(self, filename: str) -> None:
        self.filename = filename

    # -- primitives -------------------------------------------------------------------------

    def fail(self, path: Path, reason: str) -> NoReturn:
        raise DocumentError(self.filename, render_path(path), reason, parts=path)

    def mapping(self, value: object, path: Path) -> Mapping[Any, Any]:
        if type(value) is dict:  # the common case, before the slower checks
            return value
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {describe(value)}")
        if isinstance(value, _JsonObject) and value.duplicate is not None:
            self.fail((*path, value.duplicate), "duplicate key")
        return value

    def sequence(self, value: object, path: Path) -> Sequence[Any]:
        if not isinstance(value, list | tuple):
            self.fail(path, f"expected a list, got {describe(value)}")
        return value

    def check_keys(
        self, mapping: Mapping[Any, Any], path: Path, allowed: Sequence[str], hint: str = ""
    ) -> None:
        """Fail on the first key that is not in ``allowed``, suggesting the closest one."""
        if mapping.keys() <= key_set(tuple(allowed)):
            return
        for key in mapping:
            if isinstance(key, str) and key in allowed:
                continue
            if isinstance(key, str):
                close = closest(key, allowed)
                if close is not None:
                    self.fail((*path, key), f"unknown key (did you mean '{close}'?){hint}")
            self.fail((*path, key_text(key)), f"unknown key (expected {one_of(allowed)}){hint}")

    def require(self, mapping: Mapping[Any, Any], key: str, path: Path) -> Any:
        value = mapping.get(key, MISSING)
        if value is MISSING:
            self.fail((*path, key), "required key is missing")
        return value

    def boolean(self, value: object, path: Path) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {describe(value)}")
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
        kind = type(value)
        if (
            (kind is float or kind is int)
            and minimum <= value <= maximum  # type: ignore[operator]
            and -MAX_NUMBER <= value <= MAX_NUMBER  # type: ignore[operator]
            and (value > minimum or not positive)  # type: ignore[operator]
        ):
            return float(value)  # type: ignore[arg-type]
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected a number, got {describe(value)}{_quoted_number(value)}")
        if isinstance(value, int) and abs(value) > MAX_NUMBER:  # before it becomes a float
            if value < minimum:
                self.fail(path, f"must not be less than {minimum:g}, got {describe(value)}")
            self.fail(path, f"number too large (at most {maximum:g})")
        number = float(value)
        if not math.isfinite(number):
            self.fail(path, f"expected a finite number, got {describe(value)}")
        if positive and number <= minimum:
            self.fail(path, f"must be greater than {minimum:g}, got {describe(value)}")
        if number < minimum:
            self.fail(path, f"must not be less than {minimum:g}, got {describe(value)}")
        if number > maximum:
            self.fail(path, f"must not be more than {maximum:g}, got {describe(value)}")
        return number

    def integer(self, value: object, path: Path, *, minimum: int, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected a whole number, got {describe(value)}")
        if not minimum <= value <= maximum:
            self.fail(path, f"must be between {minimum} and {maximum}, got {describe(value)}")
        return value

    def size(
        self, value: object, path: Path, *, positive: bool = False, memory: bool = False
    ) -> int:
        """Bytes from an integer or a string with a unit (``8GiB``); ``memory``: a machine's
        configured memory or its reserve, which a bare number under 1 MiB cannot be
        (:func:`bare_memory`)."""
        try:
            size = parse_bytes(value)
        except UnitError as exc:
            self.fail(path, str(exc))
        if size > MAX_BYTES:
            self.fail(path, "size too large (at most 8 PiB)")
        if positive and size <= 0:
            self.fail(path, f"must be greater than 0, got {describe(value)}")
        if memory:
            problem = bare_memory(value)
            if problem is not None:
                self.fail(path, problem)
        return size

    def duration(
        self, value: object, path: Path, *, minimum: int = 0, maximum: int = MAX_SECONDS
    ) -> int:
        """Seconds from a number or a string with units (``5m``, ``1d 6h``), within
        ``minimum`` and ``maximum`` (by default at most :data:`MAX_SECONDS`, 100 years)."""
        try:
            seconds = parse_duration(value)
        except UnitError as exc:
            self.fail(path, str(exc))
        if seconds > maximum:
            longest = format_duration(maximum)
            if maximum == MAX_SECONDS:
                longest += " (100 years)"
            self.fail(path, f"must be at most {longest}, got {describe(value)}")
        if seconds < minimum:
            self.fail(path, f"must be at least {format_duration(minimum)}, got {describe(value)}")
        return seconds

    def text(self, value: object, path: Path, *, allow_int: bool = False) -> str:
        """A non-empty printable string (``allow_int``: a non-negative integer becomes one)."""
        if allow_int and isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= MAX_ID:
                self.fail(path, f"expected a name or a number from 0 to {MAX_ID}")
            return str(value)
        if not isinstance(value, str):
            expected = "a name or a number" if allow_int else "a string"
            quote = isinstance(value, bool | float | datetime.date) or value is None
            hint = " (quote it)" if quote else ""
            self.fail(path, f"expected {expected}, got {describe(value)}{hint}")
        if not value.strip():
            self.fail(path, "must not be empty")
        if not value.isprintable():
            self.fail(path, f"must contain only printable characters, got {describe(value)}")
        return value

    def plain_name(self, value: object, path: Path, *, allow_int: bool = False) -> str:
        """A name as the history keeps it: :meth:`text`, without blanks around it, at most
        :data:`MAX_NAME` characters (cluster, node, guest, pool and policy names)."""
        name = self.text(value, path, allow_int=allow_int)
        if name != name.strip():
            self.fail(path, f"must not have surrounding blanks, got {describe(name)}")
        if len(name) > MAX_NAME:
            self.fail(path, f"must be at most {MAX_NAME} characters, got {len(name)}")
        return name

    def optional_text(self, value: object, path: Path) -> str | None:
        return None if value is None else self.text(value, path)

    def choice(self, value: object, path: Path, choices: Sequence[str]) -> str:
        if isinstance(value, str) and value in choices:
            return value
        if isinstance(value, str):
            close = closest(value, choices)
            if close is not None:
                self.fail(path, f"unknown value {describe(value)} (did you mean '{close}'?)")
        self.fail(path, f"expected {one_of(choices)}, got {describe(value)}")

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
            name = self.plain_name(key, (*path, key_text(key)), allow_int=True)
            if name in seen:
                self.fail((*path, name), f"duplicate {what} {describe(name)}")
            seen.add(name)
            out.append((name, item, (*path, name)))
        return out


def bare_memory(value: object) -> str | None:
    """Why ``value``, written as a machine's memory (or a reserve of it), is refused: a bare
    number of bytes under 1 MiB (``4096``), which no node or guest has — Proxmox writes memory
    in MiB, so it is a size in MiB (or GiB) without its unit, and read as bytes it would be a
    guest that weighs nothing; None for any other value (0, a size with its unit, a plausible
    number of bytes). A number written as text (``"4096"``, as Proxmox's API writes some) is
    the same bare number."""
    value = bare_number(value)
    if value is None or not 0 < value < 1024**2:
        return None
    number = f"{value:g}"
    return (
        f"{number} bytes is not a memory size: a bare number is bytes; write {number}MiB or "
        f"{number}GiB (or {number}B if bytes are meant)"
    )


def bare_number(value: object) -> float | None:
    """``value`` as a number when it is one without a unit: a number, or text that is only
    digits (``"4096"``, ``" 2048 "``, ``"1.5"``); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        return float(value.strip())
    return None


def _quoted_number(value: object) -> str:
    """The fix for a number the file holds as text: quoted (``'2'``), or an exponent YAML reads
    as text (``1e3``, which it takes for a number only as ``1.0e+3``); else nothing."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    written = f"{number:g}"
    if "e" in written and "." not in written:  # YAML's number has a dot and a signed exponent
        mantissa, exponent = written.split("e")
        written = f"{mantissa}.0e{exponent}"
    return f" (text, not a number: write {written} without quotes)"


@lru_cache(maxsize=256)
def key_set(allowed: tuple[str, ...]) -> frozenset[str]:
    """``allowed`` as a set, remembered: the allowed keys of a mapping are a constant, and a
    mapping whose keys are a subset of them needs no key-by-key check."""
    return frozenset(allowed)


def one_of(choices: Sequence[str]) -> str:
    if len(choices) == 1:
        return f"'{choices[0]}'"
    return "one of " + ", ".join(choices)
