"""Incus's own balancer settings (``cluster.rebalance.*``) as opendrs policy defaults.

The keys set in the server's config keep their meaning under opendrs, where the policy section
of opendrs's configuration does not say otherwise:

* ``cluster.rebalance.interval`` (minutes) → the policy's ``interval``;
* ``cluster.rebalance.cooldown`` (an Incus duration, ``6H``) → ``cooldown``;
* ``cluster.rebalance.batch`` → ``batch``;
* ``cluster.rebalance.threshold`` (percent: the gap between the busiest and the least busy
  member, relative to the busiest) → the ``incus`` strategy's ``threshold`` option, when the
  policy uses that strategy. opendrs's own threshold is a spread of load fractions, another
  measure: there the key is left unused, and :func:`policy_defaults` says so.

An ``interval`` above 0 means Incus's own balancer runs too: two balancers would undo each
other's moves, so a warning says to set it to 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opendrs.backends.incus.values import as_number, incus_duration

PREFIX: Final = "cluster.rebalance."
#: The keys read, after :data:`PREFIX`.
KEYS: Final = ("batch", "cooldown", "interval", "threshold")


def policy_defaults(
    server_config: Mapping[str, str], strategy: str
) -> tuple[dict[str, Any], list[str]]:
    """The policy fields the server's ``cluster.rebalance.*`` keys set (``options`` holds the
    strategy's threshold), and notes about the keys: those not used, the balancer running."""
    fields: dict[str, Any] = {}
    notes: list[str] = []
    keys = {k.removeprefix(PREFIX): v for k, v in server_config.items() if k.startswith(PREFIX)}
    interval = as_number(keys.get("interval"))
    if interval is not None and interval > 0:
        fields["interval"] = int(interval * 60)
        notes.append(
            f"Incus's own balancer is enabled ({PREFIX}interval={keys['interval']}): it and "
            f"opendrs would undo each other's moves; set it to 0 "
            f"('incus config set {PREFIX}interval 0')"
        )
    if keys.get("cooldown"):
        seconds = incus_duration(keys["cooldown"])
        if seconds is None:
            notes.append(f"{PREFIX}cooldown={keys['cooldown']!r} is not an Incus duration: unused")
        else:
            fields["cooldown"] = seconds
    batch = as_number(keys.get("batch"))
    if batch is not None and batch >= 0:
        fields["batch"] = int(batch)
    threshold = as_number(keys.get("threshold"))
    if threshold is not None:
        if strategy == "incus":
            fields["options"] = {"threshold": float(threshold)}
        else:
            notes.append(
                f"{PREFIX}threshold={keys['threshold']} is a gap relative to the busiest member; "
                f"the {strategy} strategy's threshold is another measure: unused"
            )
    return fields, notes
