"""Which value of an observed cluster the snapshot format refuses: :func:`refused`, by the snapshot
reader's own rules (the nodes and guests are written as a snapshot and read back)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from opendrs.model.cluster import Cluster
from opendrs.model.document import DocumentError, collector_paused, render_path
from opendrs.model.snapshot.reader import SnapshotReader
from opendrs.model.snapshot.schema import FORMAT_VERSION
from opendrs.model.snapshot.write import guest_out, node_out


@dataclass(frozen=True, slots=True)
class Refused:
    """A value of a cluster that the snapshot format refuses: the node (by name) or guest (by
    id), the key in it as a snapshot writes it (``memory``, ``usage.cpu``, ``disks[0].size``;
    ``name`` or ``id`` for one listed twice), and the reader's reason."""

    kind: Literal["node", "guest"]
    name: str
    key: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.key}: {self.reason}"


def refused(cluster: Cluster) -> Refused | None:
    """The first value of ``cluster``'s nodes and guests that the snapshot format refuses, or
    None — by the snapshot reader's own rules: they are written as a snapshot and read back.

    For a cluster a backend observed (its settings and rules are checked where they are read).
    A node or guest listed twice is refused; an offline node whose size the platform does not
    report (0 cores and 0 bytes, which no placement uses) is not checked for its size.
    """
    seen: set[str] = set()
    for guest in cluster.guests:
        if guest.id in seen:
            return Refused("guest", guest.id, "id", "the guest is listed twice")
        seen.add(guest.id)
    nodes: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        if node.name in nodes:
            return Refused("node", node.name, "name", "the node is listed twice")
        unknown = not node.online and node.cpu == 0 and node.memory == 0
        nodes[node.name] = node_out(replace(node, cpu=1.0, memory=1) if unknown else node)
    document = {
        "version": FORMAT_VERSION,
        "nodes": nodes,
        "guests": [guest_out(guest) for guest in cluster.guests],
    }
    try:
        with collector_paused():
            SnapshotReader("<observation>").cluster(document)
    except DocumentError as exc:
        parts = exc.parts
        if len(parts) >= 2 and parts[0] == "guests" and isinstance(parts[1], int):
            guest = cluster.guests[parts[1]].id
            return Refused("guest", guest, render_path(parts[2:]) or "id", exc.reason)
        if len(parts) >= 2 and parts[0] == "nodes":
            return Refused("node", str(parts[1]), render_path(parts[2:]) or "name", exc.reason)
        raise
    return None
