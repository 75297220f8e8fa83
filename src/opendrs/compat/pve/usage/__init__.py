"""The usage plugins (``PVE::HA::Usage`` and ``Usage/*.pm``), read beside upstream's files.

* :mod:`.base` — ``Usage.pm``: the interface and ``get_used_service_nodes``;
* :mod:`.basic`, :mod:`.static`, :mod:`.dynamic` — ``Usage/Basic.pm``, ``Usage/Static.pm``,
  ``Usage/Dynamic.pm``.

The manager picks one per round (:func:`~opendrs.compat.pve.manager.make_usage`).
"""

from __future__ import annotations

from .base import Usage, get_used_service_nodes
from .basic import BasicUsage
from .dynamic import DynamicUsage
from .static import StaticUsage

__all__ = ["BasicUsage", "DynamicUsage", "StaticUsage", "Usage", "get_used_service_nodes"]
