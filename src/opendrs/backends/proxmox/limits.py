"""Where Proxmox VE can move a guest at all: its replication jobs (``GET /cluster/replication``)
and its mapped PCI devices (``GET /cluster/mapping/pci``), as
:class:`~opendrs.model.cluster.NodeLimit` s on the guest — a hard filter with its reason.

* **Replication.** Proxmox refuses to live-migrate a replicated VM to a node that is not the
  target of one of its local replication jobs (qemu-server ``PVE/API2/Qemu.pm`` 5594-5604,
  ``PVE/QemuMigrate.pm`` 218-229); a job marked for removal refuses migrations to its target
  (``QemuMigrate.pm`` 207-209). A job's target follows the guest when it moves (pve-guest-common
  ``ReplicationConfig.pm``, ``switch_replication_job_target``), so the guest's node and its jobs'
  targets are the nodes it can go back and forth between. Stopped VMs move offline, which the
  check does not concern; containers only move by restart migration, which replicates first
  (pve-container ``src/PVE/LXC/Migrate.pm`` 361-369).
* **Mapped PCI devices** (``hostpciN: mapping=ID``) move with the VM to a node where the mapping
  has an entry (qemu-server ``PVE/QemuMigrate/Helpers.pm`` 50-66, 83-99: the precondition lists
  the others as ``not_allowed_nodes``); whether such a device blocks a live migration at all is
  :mod:`opendrs.backends.proxmox.guest_config`'s question.

Both lists show only what the token may audit (``Sys.Audit`` on ``/`` or ``VM.Audit`` on the
guest; ``Mapping.Audit`` on ``/mapping/pci``): a job the token cannot see does not limit its
guest, and a mapping it cannot see makes the device local (the VM does not move). An API that
refuses a list altogether is warned about once, with the same consequences.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opendrs.backends.proxmox.client import Client, HttpError
from opendrs.backends.proxmox.values import as_bool, as_list
from opendrs.model.cluster import Guest, NodeLimit

_NODE_KEY = re.compile(r"(?:^|,)node=([A-Za-z0-9][A-Za-z0-9.-]*)(?:,|$)")


@dataclass(frozen=True, slots=True)
class PciMapping:
    """A cluster-wide PCI mapping: the nodes it has an entry on, and whether it is marked
    live-migration capable."""

    nodes: frozenset[str]
    live: bool


def _read_list(
    client: Client, path: str, warn: Callable[[str], None], what: str
) -> list[dict[str, Any]] | None:
    """The list ``GET /{path}`` answers; ``None`` (with a warning saying ``what`` is missing and
    what that costs) when the API refuses it for good."""
    try:
        return as_list(client.get(path), f"/{path}")
    except HttpError as exc:
        if exc.transient:
            raise
        warn(f"cannot read {what} ({exc.message})")
        return None


def read_replication(
    client: Client, warn: Callable[[str], None]
) -> dict[str, list[dict[str, Any]]]:
    """The replication jobs by guest id; none (with a warning) when they cannot be read."""
    jobs = _read_list(
        client,
        "cluster/replication",
        warn,
        "the replication jobs: replicated VMs are not kept to their replication targets",
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for job in jobs or []:
        guest = job.get("guest")
        if guest is not None:
            out.setdefault(str(guest), []).append(job)
    return out


def read_pci_mappings(client: Client, warn: Callable[[str], None]) -> dict[str, PciMapping] | None:
    """The PCI mappings by id; ``None`` (with a warning) when they cannot be read."""
    items = _read_list(
        client,
        "cluster/mapping/pci",
        warn,
        "the PCI mappings (is Mapping.Audit on /mapping/pci missing?): VMs with mapped PCI "
        "devices are not moved",
    )
    if items is None:
        return None
    out: dict[str, PciMapping] = {}
    for item in items:
        name = item.get("id")
        if not isinstance(name, str):
            continue
        entries = item.get("map")
        entries = entries if isinstance(entries, list) else []
        nodes = {
            m.group(1) for e in entries if isinstance(e, str) for m in [_NODE_KEY.search(e)] if m
        }
        out[name] = PciMapping(frozenset(nodes), as_bool(item.get("live-migration-capable")))
    return out


def replication_limit(guest: Guest, jobs: Sequence[Mapping[str, Any]]) -> NodeLimit | None:
    """The limit a running VM's replication jobs put on its live migrations, or ``None``."""
    if guest.kind != "vm" or guest.state != "running" or not jobs:
        return None
    targets = sorted(
        str(j["target"])
        for j in jobs
        if j.get("type", "local") == "local"
        and isinstance(j.get("target"), str)
        and not j.get("remove_job")
    )
    names = ", ".join(sorted(str(j.get("id", "?")) for j in jobs))
    if targets:
        reason = (
            f"not a replication target of the VM (jobs {names} replicate it to "
            f"{', '.join(targets)}): Proxmox refuses to live-migrate it elsewhere"
        )
    else:
        reason = (
            f"the VM is replicated (jobs {names}) with no job it can follow: Proxmox refuses to "
            "live-migrate it"
        )
    return NodeLimit(frozenset({guest.node, *targets}), reason)


def mapping_limits(
    guest: Guest, mapped: Sequence[tuple[str, str]], mappings: Mapping[str, PciMapping] | None
) -> list[NodeLimit]:
    """A limit per mapped PCI device (``(key, mapping id)``): the nodes its mapping exists on."""
    if mappings is None:
        return []
    out: list[NodeLimit] = []
    for key, name in mapped:
        found = mappings.get(name)
        nodes = found.nodes if found is not None else frozenset()
        out.append(
            NodeLimit(
                frozenset({guest.node, *nodes}),
                f"the PCI mapping {name} of {key} has no device on that node",
            )
        )
    return out


def with_limits(
    guests: Sequence[Guest],
    jobs: Mapping[str, Sequence[Mapping[str, Any]]],
    mapped: Mapping[str, Sequence[tuple[str, str]]],
    mappings: Mapping[str, PciMapping] | None,
) -> list[Guest]:
    """``guests`` with the limits of their replication jobs and mapped devices."""
    out: list[Guest] = []
    for guest in guests:
        limits: list[NodeLimit] = []
        replicated = replication_limit(guest, jobs.get(guest.id, ()))
        if replicated is not None:
            limits.append(replicated)
        limits += mapping_limits(guest, mapped.get(guest.id, ()), mappings)
        out.append(replace(guest, limits=tuple(limits)) if limits else guest)
    return out
