"""The Incus backend: observe an Incus (or LXD) cluster through its REST API, move instances,
evacuate and restore members.

One module, one job:

* :mod:`~opendrs.backends.incus.config` — the ``backend:`` section: :class:`IncusConfig`,
  :func:`parse_incus`;
* :mod:`~opendrs.backends.incus.client` — API calls over httpx: the unix socket or HTTPS
  addresses in turn, retries of reads, operations followed, one-line errors;
* :mod:`~opendrs.backends.incus.values` — readers of the API's values (``limits.cpu``,
  ``limits.memory``, Incus durations);
"""

from __future__ import annotations

from opendrs.backends.incus.config import IncusConfig, parse_incus

__all__ = ["IncusConfig", "parse_incus"]
