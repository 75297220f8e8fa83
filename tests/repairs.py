"""Hand-made snapshots of repairs that placing one guest at a time cannot make (issue 12, part 1).

Each is small enough to check by hand:

* ``SWAP`` — two full nodes whose guests must swap: hard affinity keeps 1 with 4 and 2 with 5,
  but 1 and 5 fill node a, 2 and 4 fill node b; c (6 GiB) holds no bundle (8 GiB). The repair
  exchanges 4 and 5, which takes a parking move on c: 4 b → c, 5 a → b, 4 c → a.
* ``MAINTENANCE`` — node m in maintenance; its guest 1 (6 GiB) fits only on t once t's small
  guest 2 (3 GiB) has gone to s: 2 t → s, then 1 m → t.
* ``OVERLOAD`` — node a is over its memory (1 + 3 = 9 GiB on 8 GiB); neither fits anywhere until 4
  leaves c for b: 4 c → b, then 3 a → c.
* ``HOPELESS`` — as ``MAINTENANCE``, but 2 is locked and 1 may not share s with 3: no repair at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from opendrs.model.cluster import Cluster, guest_label
from opendrs.model.document import parse
from opendrs.model.snapshot import from_dict

SWAP = """\
version: 1
name: swap
settings: {mode: static}
nodes:
  a: {cpu: 8, memory: 8GiB}
  b: {cpu: 8, memory: 8GiB}
  c: {cpu: 8, memory: 6GiB}
guests:
  - {id: 1, node: a, cpu: 1, memory: 6GiB, uptime: 1d}
  - {id: 5, node: a, cpu: 1, memory: 2GiB, uptime: 1d}
  - {id: 2, node: b, cpu: 1, memory: 6GiB, uptime: 1d}
  - {id: 4, node: b, cpu: 1, memory: 2GiB, uptime: 1d}
rules:
  - {type: affinity, name: one-four, guests: [1, 4]}
  - {type: affinity, name: two-five, guests: [2, 5]}
"""

MAINTENANCE = """\
version: 1
name: maintenance
settings: {mode: static}
nodes:
  m: {cpu: 8, memory: 8GiB, maintenance: true}
  t: {cpu: 8, memory: 8GiB}
  s: {cpu: 8, memory: 4GiB}
guests:
  - {id: 1, node: m, cpu: 2, memory: 6GiB, uptime: 1d}
  - {id: 2, node: t, cpu: 1, memory: 3GiB, uptime: 1d}
"""

OVERLOAD = """\
version: 1
name: overload
settings: {mode: static}
nodes:
  a: {cpu: 8, memory: 8GiB}
  b: {cpu: 8, memory: 8GiB}
  c: {cpu: 8, memory: 4GiB}
guests:
  - {id: 1, node: a, cpu: 1, memory: 6GiB, uptime: 1d}
  - {id: 3, node: a, cpu: 1, memory: 3GiB, uptime: 1d}
  - {id: 2, node: b, cpu: 1, memory: 6GiB, uptime: 1d}
  - {id: 4, node: c, cpu: 1, memory: 2GiB, uptime: 1d}
"""

HOPELESS = """\
version: 1
name: hopeless
settings: {mode: static}
nodes:
  m: {cpu: 8, memory: 8GiB, maintenance: true}
  t: {cpu: 8, memory: 8GiB}
  s: {cpu: 8, memory: 4GiB}
guests:
  - {id: 1, node: m, cpu: 2, memory: 6GiB, uptime: 1d}
  - {id: 2, node: t, cpu: 1, memory: 3GiB, uptime: 1d, lock: backup}
  - {id: 3, node: s, cpu: 1, memory: 1GiB, uptime: 1d}
rules:
  - {type: anti-affinity, name: apart, guests: [1, 3]}
"""

SNAPSHOTS = {"swap": SWAP, "maintenance": MAINTENANCE, "overload": OVERLOAD, "hopeless": HOPELESS}


def cluster(name: str) -> Cluster:
    """The snapshot ``name`` as a cluster."""
    return from_dict(parse(SNAPSHOTS[name], filename=f"{name}.yaml"), filename=f"{name}.yaml")


def write(folder: Path, name: str) -> Path:
    """The snapshot ``name`` as a file in ``folder``."""
    path = folder / f"{name}.yaml"
    path.write_text(SNAPSHOTS[name], encoding="utf-8")
    return path


def write_config(folder: Path, name: str, policy: str = "") -> Path:
    """A configuration for ``opendrs run`` on the snapshot ``name`` (file backend, shadow)."""
    return run_config(write(folder, name), policy)


def run_config(snapshot: Path, policy: str = "") -> Path:
    """A configuration for ``opendrs run`` on the snapshot file ``snapshot``, beside it (file
    backend, shadow; ``policy``: its policy section, as YAML)."""
    name = snapshot.stem
    path = snapshot.parent / f"{name}-run.yaml"
    path.write_text(
        "version: 1\n"
        f"backend: {{type: file, path: {snapshot.name}}}\n"
        f"history: {name}-history.sqlite\n" + (f"policy: {policy}\n" if policy else ""),
        encoding="utf-8",
    )
    return path


def left_on(
    node: str, stays: Mapping[str, str], names: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What opendrs says of each guest of ``stays`` (guest → why it may not move) left on
    ``node``, in maintenance: the guest as ``name (id)`` by ``names``, its id alone without."""
    names = names or {}
    return {
        guest: f"{guest_label(guest, names.get(guest, ''))} is on {node}, in maintenance, and "
        f"stays there: {why}"
        for guest, why in stays.items()
    }
