"""Building a YAML document straight from libyaml's events, as ``yaml.CSafeLoader`` would.

PyYAML's pure-Python loader reads about 0.3 MB a second, and its libyaml loader spends most of its
time on a node graph it builds and then walks; a snapshot of 100,000 guests is 12 MB.
:func:`load_plain` turns the C parser's events into dicts, lists and scalars directly: plain
scalars are resolved by the loader's own implicit resolvers and built by its own constructors, each
distinct text once. It takes only the plain shape every snapshot and scenario has; anything else —
an anchor, an alias, an explicit tag, a merge key, a key that is not a scalar, a key written
twice, a value that cannot be built, a second document — raises :class:`NotPlain`, and the caller
loads the text with the full loader, which gives the same value or words the error. A syntax
error is libyaml's own ``yaml.YAMLError``, raised as it comes: the full loader would stop at the
same one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode

__all__ = ["NotPlain", "load_plain"]


def load_plain(text: str, loader: type) -> object:
    """The one document in ``text`` as ``yaml.load(text, Loader=loader)`` reads it, ``loader``
    being ``yaml.CSafeLoader`` or a subclass that refuses repeated keys; :class:`NotPlain` when
    the document is not a plain one, libyaml's ``yaml.YAMLError`` when it is not YAML (see the
    module's docstring)."""
    return _EventBuilder(text, loader).document()


class NotPlain(Exception):
    """The document is not one the event builder takes: load it with the full loader."""


_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_DIGIT_TAGS = ["tag:yaml.org,2002:float", _INT, "tag:yaml.org,2002:timestamp"]
_UNUSUAL_TAGS = frozenset({"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"})


class _EventBuilder:
    """Builds one document from libyaml's events, as ``SafeLoader`` would, or leaves the road.

    Containers are open on a stack; a mapping whose ``has_key`` is set waits for ``key``'s value.
    """

    def __init__(self, text: str, loader: type) -> None:
        if loader.yaml_path_resolvers:  # type: ignore[attr-defined]
            raise NotPlain
        self.parser = loader(text)
        self.resolvers: dict[Any, list[tuple[str, Any]]] = loader.yaml_implicit_resolvers  # type: ignore[attr-defined]
        self.constructors: dict[Any, Callable[..., Any]] = loader.yaml_constructors  # type: ignore[attr-defined]
        self.constructor = SafeConstructor()
        #: Whether a run of ASCII digits not starting with 0 is the int ``int()`` makes of it,
        #: as PyYAML's own resolvers and constructor make it (its float pattern needs a dot):
        #: ids and byte counts are most of the texts met only once.
        self.decimal_ints = (
            None not in self.resolvers
            and all(
                [tag for tag, _ in self.resolvers.get(digit, ())] == _DIGIT_TAGS
                for digit in "123456789"
            )
            and self.constructors.get(_INT) is SafeConstructor.construct_yaml_int
        )
        #: Plain scalar text → its value. Values are shared, as the constructors share some
        #: themselves (every ``.nan`` is one object, so two NaN keys are a repeated key).
        self.plain: dict[str, object] = {}

    def document(self) -> object:
        try:
            events = iter(self.parser.get_event, None)
            if next(events).__class__ is not StreamStartEvent:
                raise NotPlain
            start = next(events)
            if start.__class__ is StreamEndEvent:
                return None
            if start.__class__ is not DocumentStartEvent:
                raise NotPlain
            root = self.node(events)
            if next(events).__class__ is not DocumentEndEvent:
                raise NotPlain
            if next(events).__class__ is not StreamEndEvent:
                raise NotPlain  # a second document: the loader words the error
            return root
        except yaml.constructor.ConstructorError:
            raise NotPlain from None
        except (ValueError, TypeError, ArithmeticError, KeyError, StopIteration):
            raise NotPlain from None
        finally:
            self.parser.dispose()

    def scalar(self, event: ScalarEvent) -> object:
        """A scalar's value: its text, or what its resolved tag builds from it."""
        if event.anchor is not None or (event.tag is not None and event.tag != "!"):
            raise NotPlain
        if not event.implicit[0]:  # quoted, or a block scalar, or tagged '!': a string
            return event.value
        value: str = event.value
        try:
            return self.plain[value]
        except KeyError:
            return self.resolve(value)

    def resolve(self, value: str) -> object:
        """A plain scalar's value the first time its text is met."""
        if self.decimal_ints and value.isdigit() and value.isascii() and value[0] != "0":
            built: object = int(value)
            self.plain[value] = built
            return built
        tag = _STR
        for candidate, regexp in self.resolvers.get(value[:1], []) + self.resolvers.get(None, []):
            if regexp.match(value):
                tag = candidate
                break
        if tag in _UNUSUAL_TAGS:
            raise NotPlain
        built = self.constructors[tag](self.constructor, ScalarNode(tag, value))
        self.plain[value] = built
        return built

    def node(self, events: Iterator[Any]) -> object:
        """The node whose first event comes next: a scalar, or a whole container."""
        first = next(events)
        if first.__class__ is ScalarEvent:
            return self.scalar(first)
        root = self.open(first)
        stack: list[tuple[Any, bool, object, bool]] = []
        plain = self.plain
        current: Any = root
        is_map = first.__class__ is MappingStartEvent
        key: object = None
        has_key = False
        for event in events:
            kind = event.__class__
            if kind is ScalarEvent:
                # The common case inline: a plain scalar met before, or a quoted one.
                if event.anchor is not None or event.tag is not None:
                    item = self.scalar(event)
                elif not event.implicit[0]:
                    item = event.value
                else:
                    try:
                        item = plain[event.value]
                    except KeyError:
                        item = self.resolve(event.value)
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                if not stack:
                    return root
                item = current
                current, is_map, key, has_key = stack.pop()
            else:
                stack.append((current, is_map, key, has_key))
                current, is_map, has_key = self.open(event), kind is MappingStartEvent, False
                continue
            if not is_map:
                current.append(item)
            elif has_key:
                if key in current:
                    raise NotPlain  # the loader reports it, in its own order
                current[key] = item
                has_key = False
            elif kind is ScalarEvent:
                key, has_key = item, True
            else:
                raise NotPlain  # a key that is a mapping or a list
        raise NotPlain

    @staticmethod
    def open(event: Any) -> Any:
        """A new container for a mapping or sequence start event."""
        if event.anchor is not None or (event.tag is not None and event.tag != "!"):
            raise NotPlain
        if event.__class__ is MappingStartEvent:
            return {}
        if event.__class__ is SequenceStartEvent:
            return []
        raise NotPlain  # an alias
