"""Proxmox resource pools as rules: the backend's ``pools`` setting keeps the members of a pool
together (``affinity``) or apart (``anti-affinity``), as ProxLB's ``balancing.pools`` does.

The setting follows ProxLB's names: ``pools: {<poolid>: {type: affinity|anti-affinity, strict:
true|false}}``, or the short form ``<poolid>: anti-affinity`` (strict). ``strict`` (the default)
makes the rule hard, ``strict: false`` soft. The key ``"*"`` (no pool id can be ``*``) gives the
rule of every pool the setting does not name. ProxLB's ``pin`` is not taken: a pool's node
affinity is an HA rule's work.

Each observation lists the pools (``GET /pools``, which shows the pools the token may audit:
``Pool.Audit``) and reads the members of those the setting covers (``GET /pools?poolid=``, or
``GET /pools/{poolid}`` before Proxmox VE 8.1); a pool with two or more of the observed guests
becomes the :class:`~opendrs.model.rules.GuestAffinity` ``pool <poolid>`` of origin ``pool``. A
pool the setting names that the API does not list is warned about, once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from opendrs.backends.base import HttpError
from opendrs.backends.proxmox.values import as_dict, as_list
from opendrs.model.document import Path, Reader, describe
from opendrs.model.rules import POOL_RULE_PREFIX, GuestAffinity

if TYPE_CHECKING:  # the client reads the configuration, which reads the setting here
    from opendrs.backends.proxmox.client import Client

#: The key of the rule of every pool the setting does not name.
EVERY_POOL: Final = "*"
POOL_TYPES: Final = ("affinity", "anti-affinity")
#: A Proxmox pool id (pve-poolid: letters, digits, ``-_``, nested with ``/`` up to 3 levels).
_POOL_ID: Final = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+){0,2}")


@dataclass(frozen=True, slots=True)
class PoolRule:
    """What the setting says of one pool: keep its members together (``positive``) or apart,
    hard (``strict``) or soft."""

    positive: bool
    strict: bool = True


def parse_pools(reader: Reader, value: object, path: Path) -> Mapping[str, PoolRule]:
    """The ``pools`` setting: pool id (or ``*``) -> its rule."""
    out: dict[str, PoolRule] = {}
    for pool, item, ppath in reader.name_map(value, path, "pool"):
        if pool != EVERY_POOL and not _POOL_ID.fullmatch(pool):
            reader.fail(ppath, f"not a Proxmox pool id: {describe(pool)}")
        strict = True
        if isinstance(item, Mapping):
            reader.check_keys(item, ppath, ("type", "strict"))
            kind = reader.choice(reader.require(item, "type", ppath), (*ppath, "type"), POOL_TYPES)
            if "strict" in item:
                strict = reader.boolean(item["strict"], (*ppath, "strict"))
        else:
            kind = reader.choice(item, ppath, POOL_TYPES)
        out[pool] = PoolRule(kind == "affinity", strict)
    return out


def pool_rules(
    client: Client,
    setting: Mapping[str, PoolRule],
    ids: set[str],
    warn: Callable[[str], None],
) -> list[GuestAffinity]:
    """The rules of the pools ``setting`` covers, among the guests ``ids``."""
    if not setting:
        return []
    listed = {str(p.get("poolid")) for p in as_list(client.get("pools"), "/pools")}
    for pool in sorted(set(setting) - listed - {EVERY_POOL}):
        warn(f"pools: pool '{pool}' is not listed by /pools (missing, or no Pool.Audit on it)")
    rules: list[GuestAffinity] = []
    for pool in sorted(listed):
        rule = setting.get(pool, setting.get(EVERY_POOL))
        if rule is None:
            continue
        members = _members(client, pool, ids)
        if len(members) >= 2:
            rules.append(
                GuestAffinity(
                    POOL_RULE_PREFIX + pool, members, rule.positive, rule.strict, origin="pool"
                )
            )
    return rules


def _members(client: Client, pool: str, ids: set[str]) -> tuple[str, ...]:
    """The guests of ``pool`` among ``ids``, by vmid: ``GET /pools?poolid=`` (Proxmox VE 8.1+),
    else ``GET /pools/{poolid}`` (before 8.1 the former refuses the parameter with a 400).

    As pve-manager's ``PVE/API2/Pool.pm`` has it: the method ``index`` (``GET /pools``) took no
    parameter at all (``additionalProperties => 0``, ``properties => {}``), so the API's
    parameter check refuses ``poolid`` with 400 "Parameter verification failed", until commit
    4448f8d3 "fix #1148: api: pools: support nested pools" (2023-11-20, first released in
    pve-manager 8.1.0) gave it ``poolid`` and ``type``, answering a one-element list of
    ``{poolid, comment, members}``. ``read_pool`` (``GET /pools/{poolid}``) answers one
    ``{comment, members}`` object in every version, deprecated since that commit (no nested
    pools, which only exist from 8.1 on). In both, a guest member carries its ``vmid``."""
    try:
        answer = as_list(client.get("pools", poolid=pool), f"/pools?poolid={pool}")
        members = answer[0].get("members", []) if answer else []
    except HttpError as exc:
        if exc.status != 400:
            raise
        members = as_dict(client.get(f"pools/{pool}"), f"/pools/{pool}").get("members", [])
    if not isinstance(members, list):
        members = []
    vmids = {str(m.get("vmid")) for m in members if isinstance(m, dict) and "vmid" in m}
    return tuple(sorted(vmids & ids, key=int))
