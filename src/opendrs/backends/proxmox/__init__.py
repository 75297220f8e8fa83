"""The Proxmox VE backend: observe a cluster through its API, migrate guests, follow the tasks.

One module, one job:

* :mod:`~opendrs.backends.proxmox.config` — the ``backend:`` section: :class:`ProxmoxConfig`,
  :func:`parse_proxmox`;
* :mod:`~opendrs.backends.proxmox.secret` — the API token's secret or the password, from a file or
  the environment (never the command line, never logged);
* :mod:`~opendrs.backends.proxmox.transport` — one try of a call on a thread of its own, on a
  transport whose connections can be shut down from outside;
* :mod:`~opendrs.backends.proxmox.client` — API calls: hosts in turn, deadlines, retries, errors
  without the secret;
* :mod:`~opendrs.backends.proxmox.values` — readers of the API's answers;
* :mod:`~opendrs.backends.proxmox.guest_config` — a VM's or container's config as guest fields;
* :mod:`~opendrs.backends.proxmox.ha` — the HA stack's view: managed guests, nodes in maintenance;
* :mod:`~opendrs.backends.proxmox.assemble` — guests and nodes made of what an observation read;
* :mod:`~opendrs.backends.proxmox.rules` — HA rules, HA groups and ProxLB's tags as rules;
* :mod:`~opendrs.backends.proxmox.observe` — the observation: what is read, as a ``Cluster``;
* :mod:`~opendrs.backends.proxmox.migration` — migrations: start, poll, find, cancel; maintenance;
* :mod:`~opendrs.backends.proxmox.backend` — :class:`ProxmoxBackend`, the ``Backend`` protocol.
"""

from __future__ import annotations

from opendrs.backends.proxmox.backend import ProxmoxBackend
from opendrs.backends.proxmox.config import ProxmoxConfig, parse_proxmox
from opendrs.backends.proxmox.secret import ENV_PASSWORD, ENV_TOKEN

__all__ = [
    "ENV_PASSWORD",
    "ENV_TOKEN",
    "ProxmoxBackend",
    "ProxmoxConfig",
    "parse_proxmox",
]
