"""What a guest's config tells (``/nodes/{node}/qemu/{vmid}/config``, ``…/lxc/{vmid}/config``):
its vCPUs, memory, disks (local or on shared storage), the devices that tie it to its node, its
lock and its tags.

A VM's local devices are those qemu-server's migration check counts as local resources
(``PVE/QemuMigrate/Helpers.pm``: ``check_local_resources`` 36-114 and
``check_non_migratable_resources`` 17-33): host PCI addresses, host USB devices, host serial and
parallel ports, virtiofs shares, ``ivshmem``, and — while the VM runs — ``amd-sev`` and
``intel-tdx``. A *mapped* PCI device (``hostpciN: mapping=ID``) is not local when its mapping is
marked live-migration capable, nor, as the precondition says, for a VM that does not run (it
moves offline); a mapping that cannot be read counts as local.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from opendrs.backends.proxmox.values import as_bool, as_int, as_number
from opendrs.model.cluster import Disk

_QEMU_DISK = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate|unused)\d+")
_LXC_DISK = re.compile(r"(rootfs|mp\d+|unused\d+)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)", re.IGNORECASE)
_SIZE_UNITS: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_TAG_SPLIT = re.compile(r"[;,\s]+")


@dataclass(frozen=True, slots=True)
class GuestConfig:
    vcpus: float
    memory: int
    disks: tuple[Disk, ...]
    devices: tuple[str, ...]
    lock: str | None
    tags: tuple[str, ...]
    #: Mapped PCI devices that do not tie the VM to its node: (config key, mapping id).
    mapped: tuple[tuple[str, str], ...] = ()


def parse_guest_config(
    kind: Literal["qemu", "lxc"],
    config: Mapping[str, Any],
    maxcpu: float,
    shared: frozenset[str],
    *,
    running: bool = True,
    live_pci: Mapping[str, bool] | None = None,
) -> GuestConfig:
    """A VM's (``qemu``) or a container's (``lxc``) config; disks on a storage in ``shared`` are
    shared, the others local. ``live_pci``: the PCI mappings by id, each live-migration capable
    or not (``None``: not known, mapped devices are local); ``running``: the guest runs."""
    if kind == "lxc":
        return _lxc_config(config, maxcpu, shared)
    return _qemu_config(config, maxcpu, shared, running, live_pci)


def parse_tags(value: object) -> tuple[str, ...]:
    """A guest's tags (``a;b``, ``a,b`` or ``a b``), each once, in order."""
    if not isinstance(value, str):
        return ()
    return tuple(dict.fromkeys(t for t in _TAG_SPLIT.split(value) if t))


def _qemu_config(
    config: Mapping[str, Any],
    maxcpu: float,
    shared: frozenset[str],
    running: bool,
    live_pci: Mapping[str, bool] | None,
) -> GuestConfig:
    vcpus = as_number(config.get("vcpus"))
    if not vcpus:
        vcpus = float(as_int(config.get("cores"), 1) * as_int(config.get("sockets"), 1))
    disks: list[Disk] = []
    devices: list[str] = []
    mapped: list[tuple[str, str]] = []
    for key, value in _text_entries(config):
        if re.fullmatch(r"hostpci\d+", key):
            name = _options(value)[1].get("mapping")
            if name is None or live_pci is None or name not in live_pci:
                devices.append(key)
            elif live_pci[name] or not running:
                mapped.append((key, name))
            else:
                devices.append(f"{key} (mapping {name}, not live-migration capable)")
        elif _QEMU_DISK.fullmatch(key):
            volume, props = _options(value)
            if props.get("media") == "cdrom":
                if volume in ("", "none") or "cloudinit" in volume:
                    continue
                storage = volume.partition(":")[0] if ":" in volume else None
                if storage is None or storage not in shared:
                    devices.append(f"{key} (local CD/DVD)")
                continue
            if volume.startswith("/") or ":" not in volume:
                devices.append(f"{key} (host disk)")
                continue
            disks.append(_disk(volume, props, shared))
        elif _is_local_device(key, value, running):
            devices.append(key)
    return replace(
        _guest_config(config, float(vcpus or maxcpu or 1), disks, devices), mapped=tuple(mapped)
    )


def _lxc_config(config: Mapping[str, Any], maxcpu: float, shared: frozenset[str]) -> GuestConfig:
    vcpus = as_number(config.get("cores")) or maxcpu or 1.0
    disks: list[Disk] = []
    devices: list[str] = []
    for key, value in _text_entries(config):
        if _LXC_DISK.fullmatch(key):
            volume, props = _options(value)
            if volume.startswith("/"):
                if not as_bool(props.get("shared", "0")):
                    devices.append(f"{key} (bind mount)")
                continue
            if ":" not in volume:
                continue
            disks.append(_disk(volume, props, shared))
        elif re.fullmatch(r"dev\d+", key):
            devices.append(key)
    return _guest_config(config, float(vcpus), disks, devices)


def _text_entries(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The config's entries whose value is text, by key."""
    return [(key, config[key]) for key in sorted(config) if isinstance(config[key], str)]


def _disk(volume: str, props: Mapping[str, str], shared: frozenset[str]) -> Disk:
    """The disk of a volume ``storage:name`` with its ``size`` property."""
    storage = volume.partition(":")[0]
    return Disk(storage, _size(props.get("size", "0")), storage in shared)


def _guest_config(
    config: Mapping[str, Any], vcpus: float, disks: list[Disk], devices: list[str]
) -> GuestConfig:
    """What the config says, its memory, lock and tags read here."""
    return GuestConfig(
        vcpus=vcpus,
        memory=_memory_mib(config.get("memory"), 512) * 1024**2,
        disks=tuple(disks),
        devices=tuple(devices),
        lock=config.get("lock") if isinstance(config.get("lock"), str) else None,
        tags=parse_tags(config.get("tags")),
    )


def _memory_mib(value: object, default: int) -> int:
    if isinstance(value, str):
        value = value.split(",")[0].partition("=")[2] or value.split(",")[0]
    return as_int(value, default)


def _is_local_device(key: str, value: str, running: bool) -> bool:
    """A VM config entry (other than ``hostpciN``) that ties the VM to its node: host USB, host
    serial and parallel ports, virtiofs, ivshmem; SEV and TDX while it runs."""
    if re.fullmatch(r"virtiofs\d+", key) or key == "ivshmem":
        return True
    if key in ("amd-sev", "intel-tdx"):
        return running
    if re.fullmatch(r"usb\d+", key):
        return not value.startswith("spice")
    return bool(re.fullmatch(r"(serial|parallel)\d+", key)) and value.startswith("/dev/")


def _size(text: str) -> int:
    """Bytes of a Proxmox size (``32G``, ``512M``, ``1.5T``, plain bytes)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return 0
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def _options(value: str) -> tuple[str, dict[str, str]]:
    """``('first', {key: value})`` of a property string such as ``local:vm-1-disk-0,size=8G``."""
    first = ""
    props: dict[str, str] = {}
    for index, part in enumerate(value.split(",")):
        key, eq, val = part.partition("=")
        if eq:
            props[key.strip()] = val.strip()
        elif index == 0:
            first = part.strip()
    return first, props
