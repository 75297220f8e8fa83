"""Why a node may not take a guest: the :class:`Rejection` verdict, the :class:`RejectionCode`
of what refuses it and, for capacity, the :class:`Shortfall` of each dimension short; ``str()``
of each is the sentence an operator reads."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from ..usage import Dimension


class RejectionCode(StrEnum):
    """Why a node may not take a guest: the hard filter that refuses it (in reporting order),
    or, for a repair, what else keeps the guest off (the policy, its hard-affinity group)."""

    OFFLINE = "offline"
    MAINTENANCE = "maintenance"
    ARCH = "arch"
    PLATFORM = "platform"
    NODE_AFFINITY = "node-affinity"
    FORBIDDEN = "forbidden"
    ANTI_AFFINITY = "anti-affinity"
    AFFINITY = "affinity"
    CAPACITY = "capacity"
    #: The policy keeps the guest (or a partner) off the node: cooldown, no return, minimum
    #: uptime or a failed move.
    POLICY = "policy"
    #: The guest's hard-affinity partners cannot join it on the node.
    GROUP = "group"


#: The sentence of each rejection whose code says it all.
_CODE_TEXT: Mapping[RejectionCode, str] = MappingProxyType(
    {
        RejectionCode.OFFLINE: "node offline",
        RejectionCode.MAINTENANCE: "node in maintenance",
        RejectionCode.FORBIDDEN: "forbidden: no safe migration order reaches it",
        RejectionCode.AFFINITY: "hard affinity: its partners run elsewhere",
        RejectionCode.POLICY: (
            "kept off by the policy (cooldown, no return, minimum uptime, a failed move or a "
            "node that ran hot)"
        ),
    }
)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One capacity dimension a guest does not fit in on a node: what it needs, what is free
    (``whole``: what the node has in all — it does not fit even on the node empty)."""

    resource: Dimension
    need: float
    free: float
    whole: bool = False

    def __str__(self) -> str:
        has = "has" if self.whole else "free"
        need, free = self.resource.amount(self.need), self.resource.amount(self.free)
        return f"{self.resource} needs {need}, {has} {free}"


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why not this node: the code of what refuses it, the node, and the facts (``str()`` is
    the sentence an operator reads)."""

    code: RejectionCode
    node: str
    #: The facts of ``arch``, ``platform``, ``node-affinity``, ``anti-affinity`` and ``group``
    #: (the other codes need none but the numbers below).
    detail: str = ""
    #: For ``capacity``: each dimension short, with the numbers.
    shortfalls: tuple[Shortfall, ...] = ()

    def __str__(self) -> str:
        if self.code is RejectionCode.CAPACITY:
            head = "capacity, even empty" if any(s.whole for s in self.shortfalls) else "capacity"
            return f"{head}: " + "; ".join(str(s) for s in self.shortfalls)
        return _CODE_TEXT.get(self.code, self.detail)

    def as_dict(self) -> dict[str, str]:
        return {"node": self.node, "reason": str(self)}


def nodes_by_reason(rejections: Iterable[Rejection]) -> list[tuple[list[str], str]]:
    """The rejections' reasons, each once with the nodes it refuses (in the order the reasons
    first come): a sentence repeated for each node is read once."""
    nodes: dict[str, list[str]] = {}
    for rejection in rejections:
        nodes.setdefault(str(rejection), []).append(rejection.node)
    return [(names, reason) for reason, names in nodes.items()]


def reasons_text(rejections: Iterable[Rejection]) -> str:
    """``pve1: capacity: …; pve3, pve4: HA failback …``: each reason once, after its nodes."""
    return "; ".join(f"{', '.join(names)}: {why}" for names, why in nodes_by_reason(rejections))


__all__ = ["Rejection", "RejectionCode", "Shortfall", "nodes_by_reason", "reasons_text"]
