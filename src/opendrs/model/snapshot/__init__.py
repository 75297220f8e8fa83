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

This package's ``__init__`` is its public face: importers use ``opendrs.model.snapshot`` and the
names below, which live in one module per job — :mod:`.schema` (the version, keys and ranges),
:mod:`.read_nodes`, :mod:`.read_guests` and :mod:`.read_rules` (the parts of a document),
:mod:`.reader` (the whole document, :func:`load`, :func:`loads`, :func:`from_dict`,
:func:`load_demo`), :mod:`.write` (:func:`to_dict`, :func:`dumps`, :func:`dump`) and
:mod:`.refusal` (:func:`refused`, for a cluster a backend observed).
"""

from __future__ import annotations

from opendrs.model.document import MAX_BYTES, MAX_FILE_BYTES, MAX_NUMBER
from opendrs.model.snapshot.reader import (
    SnapshotError,
    SnapshotReader,
    from_dict,
    load,
    load_demo,
    loads,
)
from opendrs.model.snapshot.refusal import Refused, refused
from opendrs.model.snapshot.schema import (
    FORMAT_VERSION,
    MAX_CORES,
    MAX_RATIO,
    MIN_NODE_CORES,
    RULE_TYPES,
)
from opendrs.model.snapshot.write import dump, dumps, to_dict

__all__ = [
    "FORMAT_VERSION",
    "MAX_BYTES",
    "MAX_CORES",
    "MAX_FILE_BYTES",
    "MAX_NUMBER",
    "MAX_RATIO",
    "MIN_NODE_CORES",
    "RULE_TYPES",
    "Refused",
    "SnapshotError",
    "SnapshotReader",
    "dump",
    "dumps",
    "from_dict",
    "load",
    "load_demo",
    "loads",
    "refused",
    "to_dict",
]
