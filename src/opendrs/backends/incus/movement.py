"""How Incus lets a running instance move, read from its config as Incus reads it. No API calls.

Incus decides how an instance may move from its ``cluster.evacuate`` key (``canMigrate`` in
``internal/server/instance/drivers/driver_common.go``): ``auto`` (the default) moves a VM live
when ``migration.stateful`` is true and by a stop and start otherwise; ``live-migrate`` asks for a
live move; ``migrate`` and ``stop`` are never moved live. A VM moves live only when
``migration.stateful`` is true (``CanLiveMigrate`` in ``driver_qemu.go``); since Incus 7.0 a
running VM must also have booted with it: Incus records the machine it started in the volatile
key ``volatile.vm.boot_state`` (``machine_type``; Incus 6.11 to 6.x wrote
``volatile.vm.definition``, which counts as well) only when ``migration.stateful`` was on at
boot (``saveBootState`` in ``driver_qemu_stateful.go``), and refuses a live move without it.

A running container never moves live here (Incus would need CRIU): the engine knows containers
move by a restart, allowed by ``settings.allow_restart_migration``. A VM that cannot move live
moves the same way, stopped, moved and started again, under the same setting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from opendrs.backends.incus.values import flag

#: ``cluster.evacuate`` values that never move an instance live.
NEVER_LIVE: Final = ("migrate", "stop")
#: The first Incus release that refuses a live move to a VM not booted stateful.
BOOT_STATE_SINCE: Final = (7, 0)


def records_boot_state(environment: Mapping[str, object]) -> bool:
    """Whether the server (``environment`` of ``GET /1.0``) checks a running VM's boot state
    before moving it live: Incus 7.0 and later. LXD does not."""
    if str(environment.get("server") or "").lower() != "incus":
        return False
    version = str(environment.get("server_version") or "")
    numbers: list[int] = []
    for part in version.split(".")[:2]:
        if not part.isdigit():
            return False
        numbers.append(int(part))
    return tuple(numbers) >= BOOT_STATE_SINCE


def live_refusal(config: Mapping[str, str], *, boot_state_checked: bool) -> str | None:
    """Why Incus would not move this running VM (its ``expanded_config``) live, in one phrase,
    or ``None`` when it would. ``boot_state_checked``: the server checks the boot state
    (:func:`records_boot_state`)."""
    mode = str(config.get("cluster.evacuate") or "auto")
    if mode in NEVER_LIVE:
        return f"cluster.evacuate={mode}: Incus never moves it live"
    if not flag(config.get("migration.stateful", "")):
        return "migration.stateful is not true"
    if boot_state_checked and not _booted_stateful(config):
        return "migration.stateful was set after it started: Incus moves it live after a restart"
    return None


def _booted_stateful(config: Mapping[str, str]) -> bool:
    """Whether the VM's volatile keys record a boot with ``migration.stateful`` on (Incus's
    ``getBootState``: the recorded machine type)."""
    recorded = config.get("volatile.vm.boot_state")
    if recorded:
        try:
            state = json.loads(recorded)
        except ValueError:
            return False
        return isinstance(state, dict) and bool(state.get("machine_type"))
    return bool(config.get("volatile.vm.definition"))


def project_hold(project: str, config: Mapping[str, object]) -> str | None:
    """Why a project's instances stay where Incus put them: a ``restricted`` project whose
    ``restricted.cluster.target`` is ``block`` (the default of a restricted project) lets no
    restricted client choose a member for them (``projectHasRestriction`` and
    ``CheckClusterTargetRestriction`` in ``internal/server/project/permissions.go``), and Incus's
    own balancer skips them. An administrator (the socket, an unrestricted certificate) may
    override the block, as Incus's evacuation does; opendrs, a balancer, does not."""
    if not flag(config.get("restricted", "")):
        return None
    if str(config.get("restricted.cluster.target") or "block") != "block":
        return None
    return f"project {project} has restricted.cluster.target=block: Incus keeps it where it is"


def member_hold(member: str, status: str) -> str | None:
    """Why an instance on a member Incus is evacuating or restoring stays: Incus moves it."""
    if status in ("Evacuating", "Restoring"):
        return f"its member {member} is {status}: Incus is moving its instances"
    return None


__all__ = [
    "BOOT_STATE_SINCE",
    "NEVER_LIVE",
    "live_refusal",
    "member_hold",
    "project_hold",
    "records_boot_state",
]
