"""The section-config text format of ``rules.cfg`` and ``groups.cfg``.

``PVE::SectionConfig::parse_config`` reads ``type: id`` headers, each followed by indented
``key value`` lines up to a blank line; ``PVE::Tools::split_list`` splits list values; node lists
are ``node[:priority]`` items (``pve-ha-group-node-list``). Lines that do not parse are skipped with
a warning, as Proxmox skips them.
"""

from __future__ import annotations

import re

__all__ = ["parse_bool", "parse_node_list", "parse_sections", "split_list"]

_HEADER_RE = re.compile(r"^(\S+):\s*(\S+)\s*$")
_PROPERTY_RE = re.compile(r"^\s+(\S+)(\s+(.*\S))?\s*$")
_CONFIGID_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_\-]+$")
_NODE_PRIORITY_RE = re.compile(r"^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)(:(\d+))?$")
_SPLIT_RE = re.compile(r"[\s,;]+")


def split_list(value: str) -> list[str]:
    """``PVE::Tools::split_list``."""
    return [item for item in _SPLIT_RE.split(value.strip()) if item]


def parse_sections(text: str, what: str) -> tuple[list[tuple[str, str, dict[str, str]]], list[str]]:
    """``PVE::SectionConfig::parse_config``: ``type: id`` headers, tab-indented ``key value``.

    Returns the sections (type, id, properties) and warnings for ignored lines.
    """
    sections: list[tuple[str, str, dict[str, str]]] = []
    warnings: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\r")
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        header = _HEADER_RE.match(line)
        if not header:
            warnings.append(f"{what}: ignore config line: {line.strip()}")
            continue
        stype, sid = header.group(1).lower(), header.group(2)
        props: dict[str, str] = {}
        skip = False
        if not _CONFIGID_RE.match(sid):
            warnings.append(f"{what}: invalid section id '{sid}', section skipped")
            skip = True
        while i < len(lines):
            raw = lines[i].rstrip("\r")
            if not raw.strip():
                break
            i += 1
            if raw.lstrip().startswith("#"):
                continue
            prop = _PROPERTY_RE.match(raw)
            if not prop:
                warnings.append(f"{what} (section '{sid}'): ignore config line: {raw.strip()}")
                continue
            key, value = prop.group(1), prop.group(3)
            if key in props:
                warnings.append(f"{what} (section '{sid}'): duplicate attribute '{key}'")
                continue
            props[key] = "1" if value is None else value
        if not skip:
            sections.append((stype, sid, props))
    return sections, warnings


def parse_bool(value: str) -> bool | None:
    """True for ``1``/``on``/``yes``/``true``, False for ``0``/``off``/``no``/``false`` (any
    case), None for anything else."""
    lowered = value.strip().lower()
    if lowered in ("1", "on", "yes", "true"):
        return True
    if lowered in ("0", "off", "no", "false"):
        return False
    return None


def parse_node_list(value: str) -> tuple[dict[str, int], list[str]]:
    """``pve-ha-group-node-list``: ``node[:priority]`` items (priority defaults to 0)."""
    nodes: dict[str, int] = {}
    bad: list[str] = []
    for item in split_list(value):
        match = _NODE_PRIORITY_RE.match(item)
        if not match:
            bad.append(item)
            continue
        nodes[match.group(1)] = int(match.group(4)) if match.group(4) is not None else 0
    return nodes, bad
