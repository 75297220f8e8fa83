"""The Incus backend: observe an Incus (or LXD) cluster through its REST API, move instances,
evacuate and restore members.

One module, one job:

* :mod:`~opendrs.backends.incus.config` — the ``backend:`` section: :class:`IncusConfig`,
  :func:`parse_incus`;
* :mod:`~opendrs.backends.incus.client` — API calls over httpx: the unix socket or HTTPS
  addresses in turn, retries of reads, operations followed, one-line errors;
* :mod:`~opendrs.backends.incus.values` — readers of the API's values (``limits.cpu``,
  ``limits.memory``, Incus durations);
* :mod:`~opendrs.backends.incus.assemble` — members and instances as nodes and guests;
* :mod:`~opendrs.backends.incus.rules` — cluster groups, restricted projects, pinned CPUs,
  ``scheduler.instance`` (manual and group members) and the ``user.opendrs.*`` keys as rules,
  one strict rule per instance;
* :mod:`~opendrs.backends.incus.movement` — how Incus lets a running instance move
  (``cluster.evacuate``, ``migration.stateful``, the boot state), and what holds it (a member
  being evacuated or restored, a project that blocks choosing a member);
* :mod:`~opendrs.backends.incus.scriptlet` — the placement scriptlet, run in Starlark for the
  targets opendrs chooses;
* :mod:`~opendrs.backends.incus.observe` — the observation: what is read, as a ``Cluster``;
* :mod:`~opendrs.backends.incus.migration` — moves (live, cold, by restart), their operations,
  evacuate and restore;
* :mod:`~opendrs.backends.incus.rebalance` — ``cluster.rebalance.*`` as policy defaults;
* :mod:`~opendrs.backends.incus.backend` — :class:`IncusBackend`, the ``Backend`` protocol.
"""

from __future__ import annotations

from opendrs.backends.incus.backend import IncusBackend
from opendrs.backends.incus.config import IncusConfig, parse_incus

__all__ = ["IncusBackend", "IncusConfig", "parse_incus"]
