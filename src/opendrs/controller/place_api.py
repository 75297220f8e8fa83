"""``POST /api/place``: where should a new guest start? Answered from the daemon's last
observation (no call to the cluster), for provisioning tools (Terraform, Ansible).

The request is a JSON object: the new guest's sizes as ``opendrs place --new`` takes them
(``cpu``, ``memory`` with its unit — ``"8GiB"``; a bare number is refused —, ``kind``, ``arch``,
``name``, ``cpu_used``, ``memory_used``, ``priority``) and, optionally, the rules it joins:
``pool`` (the rule of that Proxmox resource pool, ``pool <poolid>``), ``tags`` (each tag naming a
rule, such as ProxLB's ``plb_anti_affinity_web``, adds the guest to it) and ``affinity`` /
``anti_affinity`` (guest ids it must run with / apart from: hard rules). The answer names the best
node (``null`` when none can take it) and, per node, its score (lower is better), its load after
the placement and the reasons it cannot take the guest (a rule, the capacity, its state).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from opendrs.engine.constraints import RejectionCode
from opendrs.engine.observed_placement import ObservedPlacement
from opendrs.engine.placement import Placement, fresh_id, place_new
from opendrs.model.cluster import Cluster
from opendrs.model.new_guest import NEW_GUEST_KEYS, NewGuestError, new_guest
from opendrs.model.rules import POOL_RULE_PREFIX, GuestAffinity, Rules

if TYPE_CHECKING:
    from opendrs.controller.loop import Cycle

__all__ = ["MAX_BODY", "PlaceView", "json_error"]

#: The largest request body taken, in bytes.
MAX_BODY: Final = 64 * 1024
_RULE_KEYS: Final = frozenset({"pool", "tags", "affinity", "anti_affinity"})


class PlaceError(ValueError):
    """A request that cannot be answered: its status and one line."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def json_error(status: HTTPStatus, reason: str) -> tuple[HTTPStatus, bytes]:
    """The JSON body of an error answer."""
    return status, json.dumps({"error": reason}).encode() + b"\n"


class PlaceView:
    """The cluster as the daemon last observed it, and the answers of ``POST /api/place``.

    What every answer on one observation shares (:class:`ObservedPlacement`) is built once, by
    the first request after the observation; requests arriving meanwhile wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._building = threading.Lock()
        self._cluster: Cluster | None = None
        self._at = 0.0
        self._observed: ObservedPlacement | None = None

    def cycle(self, cycle: Cycle) -> None:
        """Keep the cluster ``cycle`` observed (a failed observation keeps the one before)."""
        if cycle.cluster is not None:
            with self._lock:
                self._cluster, self._at = cycle.cluster, cycle.at

    def _observed_now(self) -> tuple[ObservedPlacement | None, float]:
        """The last observation ready to place on (built now if not yet), and its time."""
        with self._lock:
            cluster, at, observed = self._cluster, self._at, self._observed
        if cluster is None:
            return None, at
        if observed is not None and observed.cluster is cluster:
            return observed, at
        with self._building:
            with self._lock:
                observed = self._observed
            if observed is None or observed.cluster is not cluster:
                observed = ObservedPlacement.build(cluster)
                with self._lock:
                    self._observed = observed
        return observed, at

    def answer(self, body: bytes) -> tuple[HTTPStatus, bytes]:
        """The status and JSON body answering the request ``body``."""
        observed, at = self._observed_now()
        if observed is None:
            return json_error(HTTPStatus.SERVICE_UNAVAILABLE, "no observation of the cluster yet")
        try:
            request = _request_object(body)
            answer = place_for(observed.cluster, request, observed)
        except PlaceError as exc:
            return json_error(exc.status, str(exc))
        answer["observed_at"] = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
        return HTTPStatus.OK, json.dumps(answer).encode() + b"\n"


def _request_object(body: bytes) -> Mapping[str, Any]:
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlaceError(HTTPStatus.BAD_REQUEST, f"not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise PlaceError(HTTPStatus.BAD_REQUEST, "expected a JSON object")
    return request


def place_for(
    cluster: Cluster, request: Mapping[str, Any], observed: ObservedPlacement | None = None
) -> dict[str, Any]:
    """The answer (as JSON data) to ``request`` on ``cluster``: from ``observed`` (built from
    ``cluster``) when given, else with the constraints built for this request alone (the
    same answer)."""
    unknown = sorted(set(request) - NEW_GUEST_KEYS - _RULE_KEYS)
    if unknown:
        known = ", ".join(sorted(NEW_GUEST_KEYS | _RULE_KEYS))
        raise PlaceError(HTTPStatus.BAD_REQUEST, f"unknown key {unknown[0]!r} (known: {known})")
    fields = {k: _scalar(k, v) for k, v in request.items() if k in NEW_GUEST_KEYS}
    try:
        guest = new_guest(fields)
    except NewGuestError as exc:
        raise PlaceError(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc)) from None
    guest = replace(guest, id=fresh_id(cluster, guest.id))
    rules, joined, notes = _joined(cluster, guest.id, request)
    if observed is None:
        placement = place_new(replace(cluster, rules=rules), guest)
    else:
        placement = observed.place(rules, guest)
    breaking = _breaking(cluster, rules, guest.id)
    return {
        "guest": {"id": guest.id, "name": guest.name, "cpu": guest.cpu, "memory": guest.memory},
        "best": placement.best,
        # With a hard affinity, the guests that would run together (existing ones moved there).
        "members": [m for m in placement.members if m != guest.id],
        "rules": joined,
        "notes": notes,
        "nodes": _nodes(cluster, placement, breaking),
    }


def _scalar(key: str, value: object) -> str:
    """A field of the new guest as the text ``--new`` would give (numbers or strings)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PlaceError(HTTPStatus.UNPROCESSABLE_ENTITY, f"{key}: expected a number or a string")
    return str(value)


def _id_list(request: Mapping[str, Any], key: str) -> list[str]:
    value = request.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
        raise PlaceError(HTTPStatus.UNPROCESSABLE_ENTITY, f"{key}: expected a list of strings")
    return [str(v) for v in value]


def _joined(
    cluster: Cluster, gid: str, request: Mapping[str, Any]
) -> tuple[Rules, list[str], list[str]]:
    """The cluster's rules with the new guest ``gid`` added to those ``request`` joins, the
    names of those rules, and a note per name that matches no rule."""
    names = _id_list(request, "tags")
    if "pool" in request:
        pool = request["pool"]
        if not isinstance(pool, str) or not pool:
            raise PlaceError(HTTPStatus.UNPROCESSABLE_ENTITY, "pool: expected a pool id")
        names.append(POOL_RULE_PREFIX + pool)
    existing = {r.name for r in cluster.rules.guest_affinity}
    notes = [f"no rule {n!r} in the daemon's view" for n in names if n not in existing]
    rules = [
        replace(r, guests=(*r.guests, gid)) if r.name in names else r
        for r in cluster.rules.guest_affinity
    ]
    joined = [r.name for r in rules if gid in r.guests]
    for key, positive in (("affinity", True), ("anti_affinity", False)):
        partners = _id_list(request, key)
        missing = [p for p in partners if p not in cluster.guest_index]
        if missing:
            raise PlaceError(HTTPStatus.UNPROCESSABLE_ENTITY, f"{key}: no guest {missing[0]!r}")
        if partners:
            rules.append(GuestAffinity(f"request {key}", (gid, *partners), positive, True))
            joined.append(f"request {key}")
    return replace(cluster.rules, guest_affinity=tuple(rules)), joined, notes


def _breaking(cluster: Cluster, rules: Rules, gid: str) -> dict[str, list[str]]:
    """Per node, the guest rules of ``gid`` that the node breaks by its guests — a rule kept
    apart with a guest there, or together with guests all elsewhere — each named with its kind,
    strength and origin (``anti-affinity 'pool web' (hard, origin pool)``)."""
    out: dict[str, list[str]] = {}
    for rule in rules.guest_rules_for(gid):
        there = {cluster.guests[cluster.guest_index[g]].node for g in rule.guests if g != gid}
        kind = "affinity" if rule.positive else "anti-affinity"
        text = f"{kind} {rule.name!r} ({'hard' if rule.hard else 'soft'}, origin {rule.origin})"
        for node in cluster.nodes:
            if (node.name in there) != rule.positive:
                out.setdefault(node.name, []).append(text)
    return out


def _nodes(
    cluster: Cluster, placement: Placement, breaking: Mapping[str, list[str]]
) -> list[dict[str, Any]]:
    """Per node of ``cluster``: whether it can take the guest, its rank, score, load after and
    the reasons it cannot, or the soft rules it breaks (``breaking``: :func:`_breaking`)."""
    rows: dict[str, dict[str, Any]] = {}
    for rank, scored in enumerate(placement.ranking, 1):
        reasons = [f"breaks {r}" for r in breaking.get(scored.node, [])]
        rows[scored.node] = {
            "node": scored.node,
            "fits": True,
            "rank": rank,
            "score": scored.score,
            "load_after": scored.fractions,
            "reasons": reasons,
        }
    for rejection in placement.rejected:
        row = rows.setdefault(rejection.node, {"node": rejection.node, "fits": False})
        rule = {RejectionCode.ANTI_AFFINITY, RejectionCode.AFFINITY, RejectionCode.GROUP}
        named = breaking.get(rejection.node, []) if rejection.code in rule else []
        text = str(rejection) + (f": {', '.join(named)}" if named else "")
        row.setdefault("reasons", []).append(text)
    blocked = [placement.blocked] if placement.blocked else []
    return [
        rows.get(n.name, {"node": n.name, "fits": False, "reasons": blocked}) for n in cluster.nodes
    ]
