"""Reading YAML through libyaml: the event builder (opendrs.model.yamlload), libyaml's loader with
the duplicate-key check, and the pure-Python loader as fallback and as the wording of errors."""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from opendrs.model import document
from opendrs.model.document import DocumentError, parse
from opendrs.model.yamlload import NotPlain, load_plain

needs_libyaml = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML without libyaml")


def _error(text: str) -> str:
    with pytest.raises(DocumentError) as info:
        parse(text, filename="t.yaml")
    return str(info.value)


def _c_mark(text: str) -> tuple[int, int]:
    """Line and column (1-based) where libyaml's own loader locates the problem in ``text``."""
    assert document._CLoader is not None
    with pytest.raises(yaml.MarkedYAMLError) as info:
        yaml.load(text, Loader=document._CLoader)
    mark = info.value.problem_mark or info.value.context_mark
    assert mark is not None
    return mark.line + 1, mark.column + 1


@pytest.fixture(params=["libyaml", "pure"])
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: with libyaml when PyYAML has it, and as without it."""
    if request.param == "libyaml" and document._CLoader is None:
        pytest.skip("PyYAML without libyaml")
    if request.param == "pure":
        monkeypatch.setattr(document, "_CLoader", None)
    return str(request.param)


@needs_libyaml
def test_this_pyyaml_reads_through_libyaml() -> None:
    assert document._CLoader is not None
    assert issubclass(document._CLoader, yaml.CSafeLoader)


def test_without_libyaml_the_pure_loader_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(document, "_CLoader", None)

    def not_called(*args: object) -> object:
        raise AssertionError("the event builder needs libyaml")

    monkeypatch.setattr(document, "load_plain", not_called)
    assert parse("a: [1, 2.5, yes, ~, '3']\n") == {"a": [1, 2.5, True, None, "3"]}
    assert _error("a: 1\na: 2\n") == "t.yaml: line 2, column 1: duplicate key 'a'"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: 1\nb: 2\na: 3\n", "t.yaml: line 3, column 1: duplicate key 'a'"),
        ("a: {b: 1, b: 2}\n", "t.yaml: line 1, column 11: duplicate key 'b'"),
        ("x:\n  - {id: 1, id: 1}\n", "t.yaml: line 2, column 13: duplicate key 'id'"),
        ("1: a\n1.0: b\n", "t.yaml: line 2, column 1: duplicate key 1.0"),
        ("~: a\nnull: b\n", "t.yaml: line 2, column 1: duplicate key null"),
        (".nan: a\n.NaN: b\n", "t.yaml: line 2, column 1: duplicate key nan"),
        # The first duplicate in the constructor's order (outer mappings first), as always.
        ("a:\n  b: 1\n  b: 2\nc: 1\nc: 2\n", "t.yaml: line 5, column 1: duplicate key 'c'"),
    ],
)
def test_duplicate_keys(loader: str, text: str, message: str) -> None:
    assert _error(text) == message


@needs_libyaml
@pytest.mark.parametrize(
    "text", ["a: 1\na: 2\n", "a: {b: 1, b: 2}\n", "- {x: 1, 'x': 2}\n", "'1': a\n\"1\": b\n"]
)
def test_duplicate_keys_under_the_c_loader(text: str) -> None:
    """libyaml's loader refuses them itself, where the event builder hands them over."""
    assert document._CLoader is not None
    with pytest.raises(NotPlain):
        load_plain(text, document._CLoader)
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key"):
        yaml.load(text, Loader=document._CLoader)
    line, column = _c_mark(text)
    assert _error(text).startswith(f"t.yaml: line {line}, column {column}: duplicate key ")


@needs_libyaml
@pytest.mark.parametrize(
    "text",
    [
        "version: 1\nname: a\n  b: c\n",
        "version: 1\nnodes: {a: [1, 2}\n",
        "a: 1\n---\nb: 2\n",
        "a: *x\n",
        "a: &x 1\nb: &x 2\n",
        "a: 'x",
        "a: !!python/object:os.system {}\n",
        "version: 1\nnodes:\n  pve1: {cpu: 1, memory: 1}\n  pve1: {cpu: 2, memory: 2}\n",
        "guests:\n  - id: 1\n    node: a\n   memory: 2\n",
    ],
)
def test_errors_are_located_where_libyaml_locates_them(text: str) -> None:
    line, column = _c_mark(text)
    message = _error(text)
    assert message.startswith(f"t.yaml: line {line}, column {column}: "), message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nname: a\n  b: c\n", "line 3, column 4: mapping values are not allowed here"),
        ("a: [1, 2}\n", "line 1, column 9: expected ',' or ']', but got '}'"),
        ("a: *x\n", "line 1, column 4: found undefined alias 'x'"),
        ("a: 'x", "line 1, column 6: found unexpected end of stream"),
        ('a: "x\0y"\n', "line 1, column 6: unacceptable character #x0000: special characters"),
        ("a: \ud800\n", "line 1, column 4: unacceptable character #xd800: special characters"),
        ("[" * 1000, "the document is nested too deeply"),
    ],
)
def test_syntax_errors_keep_their_wording(loader: str, text: str, message: str) -> None:
    """libyaml words some errors differently: the pure loader's words, as before, either way."""
    assert _error(text).startswith(f"t.yaml: {message}")


@needs_libyaml
def test_what_libyaml_refuses_and_the_pure_loader_reads_stands() -> None:
    text = "a: |\n \tx\n"
    assert document._CLoader is not None
    with pytest.raises(yaml.YAMLError):
        yaml.load(text, Loader=document._CLoader)
    assert parse(text) == yaml.safe_load(text) == {"a": "\tx\n"}


UNUSUAL = [
    "a: &x [1, 2]\nb: *x\n",
    "base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n",
    "a: !!str 123\nb: !!float 1\nc: !!binary aGVsbG8=\n",
    "a: !!set {x, y}\nb: !!omap [{k: 1}]\n",
    "a: ! 12\nb: !!null ''\n",
    "%TAG !e! tag:yaml.org,2002:\n---\na: !e!int '7'\n",
]
REFUSED = [
    ("? [1, 2]\n: a\n", "line 1, column 3: found unhashable key"),
    ("? {a: 1}\n: b\n", "line 1, column 3: found unhashable key"),
    ("=: a\n", "line 1, column 1: could not determine a constructor for the tag"),
    ("a: !!int x\n", "cannot read a value: invalid literal for int() with base 10: 'x'"),
]


@needs_libyaml
@pytest.mark.parametrize("text", UNUSUAL)
def test_unusual_documents_read_as_the_loaders_read_them(text: str) -> None:
    expected = yaml.load(text, Loader=yaml.CSafeLoader)
    assert parse(text) == expected == yaml.load(text, Loader=yaml.SafeLoader)


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_unusual_documents_refused_as_the_loaders_refuse_them(
    loader: str, text: str, message: str
) -> None:
    assert _error(text).startswith(f"t.yaml: {message}")


@needs_libyaml
@pytest.mark.parametrize("text", UNUSUAL + [text for text, _ in REFUSED])
def test_the_event_builder_leaves_unusual_documents(text: str) -> None:
    assert document._CLoader is not None
    with pytest.raises(NotPlain):
        load_plain(text, document._CLoader)


PLAIN = """\
# a comment
version: 1
empty:
nulls: [~, null, Null, '']
bools: [yes, No, on, OFF, true, False, y, n]
ints: [0, -12, +7, 0x1F, 0o17, 017, 0b101, 1_000, 190:20:30, '12']
floats: [1.5, -.5, 6.8523015e+5, 685_230.15, 190:20:30.15, .inf, -.Inf, 1e3]
nan: .nan
dates: [2002-12-14, 2001-12-14t21:59:43.10-05:00, 2001-12-14 21:59:43.10]
text: [plain text, "quoted\\ttab", 'single', 123abc, 1.2.3, -, ':x', "yes"]
block: |
  two
  lines
folded: >-
  one
  line
flow: {a: [1, {b: c}], 'd': e}
nested:
  - - x
    - y
  - {}
  - []
"pve1.example.com": 1
2001-01-01: date key
3: int key
"""


@needs_libyaml
def test_a_plain_document_is_built_from_events_as_the_loaders_build_it() -> None:
    assert document._CLoader is not None
    built = load_plain(PLAIN, document._CLoader)
    expected = yaml.load(PLAIN, Loader=yaml.SafeLoader)
    assert isinstance(built, dict)
    assert math.isnan(built.pop("nan")) and math.isnan(expected.pop("nan"))
    assert built == expected == yaml.load(PLAIN.replace("nan: .nan\n", ""), Loader=yaml.CSafeLoader)
    assert list(built) == list(expected)
    assert built["dates"][1] == datetime.datetime(
        2001, 12, 14, 21, 59, 43, 100000, tzinfo=datetime.timezone(-datetime.timedelta(hours=5))
    )
    assert [type(v) for v in built["ints"]] == [int, int, int, int, str, int, int, int, int, str]


@needs_libyaml
def test_empty_documents() -> None:
    assert document._CLoader is not None
    for text in ("", "# nothing\n", "---\n", "--- ~\n"):
        assert load_plain(text, document._CLoader) is yaml.safe_load(text) is None
    assert load_plain("just text\n", document._CLoader) == "just text"
    assert load_plain("--- 12\n...\n", document._CLoader) == 12


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["yes", "no", "~", "0x1F", "017", "1:30", "2001-01-01", "<<", "=", "1e3"]),
    st.dates(),
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none()),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=20,
)


@needs_libyaml
@settings(max_examples=300)
@given(
    data=_DOCUMENTS,
    flow=st.sampled_from([None, True, False]),
    style=st.sampled_from([None, "'", '"', "|"]),
    width=st.sampled_from([20, 80]),
)
def test_dumped_documents_read_back_as_the_loaders_read_them(
    data: Any, flow: bool | None, style: str | None, width: int
) -> None:
    text = yaml.safe_dump(
        data, default_flow_style=flow, default_style=style, width=width, allow_unicode=True
    )
    expected = yaml.load(text, Loader=yaml.CSafeLoader)
    assert parse(text) == expected
    if not re.search(r"\t", text):  # libyaml reads some tabs the pure loader refuses
        assert expected == yaml.load(text, Loader=yaml.SafeLoader)


@needs_libyaml
@pytest.mark.parametrize(
    "text", ["0", "7", "007", "0x1F", "1_000", "12345678901234567890", "١٢", "²", "1:30", "12e3"]
)
def test_digit_runs_read_as_the_loaders_read_them(text: str) -> None:
    assert document._CLoader is not None
    built = load_plain(f"a: {text}\n", document._CLoader)
    expected = yaml.load(f"a: {text}\n", Loader=yaml.SafeLoader)
    assert built == expected
    assert isinstance(built, dict) and type(built["a"]) is type(expected["a"])


@needs_libyaml
def test_digit_runs_follow_a_loader_with_other_resolvers() -> None:
    assert document._CLoader is not None

    class Octal(document._CLoader):  # type: ignore[misc, valid-type]
        """Every run of digits an octal number (a resolver before PyYAML's own)."""

    Octal.yaml_implicit_resolvers = {
        key: [("tag:yaml.org,2002:octal", re.compile("^[0-7]+$")), *value]
        if key in tuple("0123456789")
        else list(value)
        for key, value in document._CLoader.yaml_implicit_resolvers.items()
    }
    Octal.add_constructor("tag:yaml.org,2002:octal", lambda loader, node: int(node.value, 8))
    text = "a: 17\nb: 19\n"
    assert load_plain(text, Octal) == yaml.load(text, Loader=Octal) == {"a": 15, "b": 19}


def _outcome(load: Any) -> tuple[str, object]:
    """``("value", document)`` or ``("error", problem and its line and column)``."""
    try:
        return "value", load()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = (mark.line, mark.column) if mark is not None else None
        return "error", (type(exc).__name__, exc.problem, where)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        return "error", type(exc).__name__


@needs_libyaml
@settings(max_examples=300)
@given(st.text(alphabet="ab01.:-?[]{},'\"#&*!|>\n \t~", max_size=40))
def test_any_text_reads_as_the_roads_promise(text: str) -> None:
    """What libyaml's loader reads, the reader reads alike; what it refuses for its syntax, the
    pure-Python loader decides, value or error."""
    assert document._CLoader is not None
    kind, c_result = _outcome(lambda: yaml.load(text, Loader=document._CLoader))
    got = _outcome(lambda: document._load_yaml(text))
    if kind == "value" or "ConstructorError" in str(c_result):
        assert got == (kind, c_result)
    else:
        assert got == _outcome(lambda: yaml.load(text, Loader=document._Loader))


@needs_libyaml
def test_a_syntax_error_goes_from_the_events_straight_to_the_pure_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libyaml's loader would stop at the same error: it is not asked again."""
    assert document._CLoader is not None
    text = "a: 1\nb: [1, 2\nc: 3\n"
    with pytest.raises(yaml.MarkedYAMLError) as info:
        load_plain(text, document._CLoader)
    assert not isinstance(info.value, yaml.constructor.ConstructorError)
    loaders: list[type] = []
    load = yaml.load

    def spy(stream: str, Loader: type) -> object:
        loaders.append(Loader)
        return load(stream, Loader=Loader)

    monkeypatch.setattr(document.yaml, "load", spy)
    assert _error(text).startswith("t.yaml: line 3, column 2: expected ',' or ']', but got ':'")
    assert loaders == [document._Loader]
