"""An HTML report read back with the standard library's parser, for the report tests: its
elements (tag, classes, attributes, text) and whether anything in it points outside the file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

#: Elements with no end tag in HTML.
_VOID = frozenset({"meta", "link", "br", "hr", "img", "input", "source", "wbr", "base", "col"})
#: Elements whose text runs on with their neighbours' (others are set apart by a blank).
_INLINE = frozenset({"a", "b", "i", "em", "strong", "span", "code", "small"})
#: Attributes that load or link to something.
_LINKS = ("src", "href", "xlink:href", "action", "formaction", "poster", "data", "srcset")


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parts: list[str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())


class Page(HTMLParser):
    """Every element of a page, in the order they close, with the text inside each."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.html = html
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {name: value or "" for name, value in attrs})
        if tag in _VOID:
            self.elements.append(element)
        else:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            element = self._open.pop()
            self.elements.append(element)
            if self._open:
                self._open[-1].parts.extend(element.parts)
                if element.tag not in _INLINE:
                    self._open[-1].parts.append(" ")
            if element.tag == tag:
                return

    def handle_data(self, data: str) -> None:
        if self._open:
            self._open[-1].parts.append(data)

    def find(self, tag: str, cls: str | None = None) -> list[Element]:
        """The elements ``tag`` (with class ``cls``), in document order of their end."""
        return [e for e in self.elements if e.tag == tag and (cls is None or cls in e.classes)]

    def section(self, ident: str) -> Element:
        (found,) = [e for e in self.elements if e.tag == "section" and e.attrs.get("id") == ident]
        return found

    def external_references(self) -> list[str]:
        """Everything that would make a browser reach outside the file: a linking attribute
        that is not a fragment (``#id``), a ``url(…)`` of anything else or an ``@import`` in styles,
        an address with a scheme or starting ``//``."""
        found = []
        for element in self.elements:
            for name in _LINKS:
                value = element.attrs.get(name)
                if value is not None and not value.startswith("#"):
                    found.append(f"<{element.tag} {name}={value!r}>")
            if element.tag in ("link", "iframe", "object", "embed") or (
                element.tag == "script" and "src" in element.attrs
            ):
                found.append(f"<{element.tag}>")
        lowered = self.html.lower()
        for pattern in (r"https?:", r"url\((?!['\"]?#)", r"@import", r"""["'(]//"""):
            found.extend(m.group(0) for m in re.finditer(pattern, lowered))
        return found
