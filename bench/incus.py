"""The Incus backend's observation at scale: 50 members and 5,000 instances, against the fake Incus
API of the tests (``tests/backends/fakeincus.py``) on a unix socket.

``python -m bench.incus [--members 50] [--instances 5000] [--target 5] [--json FILE]``

Times :meth:`IncusBackend.observe` twice — the first observation (connections opened, the CPU
counters read once), then the second (the CPU rates between the two) — each all told: the
requests, the fake server answering them on the same machine, and the parsing. The target is
under 5 s for an observation. Exit status 1 when an observation misses it. ``make bench`` runs
it too (:func:`section`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 5.0


def populate(fake: Any, members: int, instances: int) -> None:
    """A cluster of ``members`` members in two architectures and three groups, and ``instances``
    instances — VMs and containers, running and stopped, on local and remote pools, some with
    pinned CPUs, passed-through devices and opendrs keys."""
    gib = 1024**3
    names = [f"m{i:02d}" for i in range(1, members + 1)]
    for index, name in enumerate(names):
        fake.add_member(
            name,
            threads=64,
            memory=512 * gib,
            arch="aarch64" if index % 10 == 9 else "x86_64",
            groups=[f"g{index % 3}"],
            load1=8.0,
            used_memory=200 * gib,
        )
    for index in range(instances):
        vm = index % 3 != 0
        config = {"limits.cpu": "2" if index % 7 else "0-3", "limits.memory": "4GiB"}
        if vm:
            config["migration.stateful"] = "true"
        if index % 50 == 0:
            config["user.opendrs.anti_affinity"] = f"db{index % 5}"
        pool = "local" if index % 4 == 0 else "ceph"
        devices: dict[str, dict[str, str]] = {"root": {"type": "disk", "pool": pool, "path": "/"}}
        if index % 97 == 0:
            devices["gpu0"] = {"type": "gpu"}
        fake.add_instance(
            f"i{index:05d}",
            names[index % members],
            type="virtual-machine" if vm else "container",
            status="Stopped" if index % 11 == 0 else "Running",
            config=config,
            devices=devices,
            cpu_rate=0.5,
        )


def measure(members: int, instances: int) -> dict[str, float]:
    """Seconds of the first and second observation, and the counts observed."""
    sys.path.insert(0, str(ROOT / "tests"))
    from backends.fakeincus import FakeIncus, Served
    from opendrs.backends.incus import IncusBackend, IncusConfig
    from opendrs.model.cluster import Settings

    fake = FakeIncus("m01")
    populate(fake, members, instances)
    with tempfile.TemporaryDirectory(prefix="opendrs-bench-incus-") as folder:
        server = Served(fake, socket=str(Path(folder) / "incus.sock"))
        backend = IncusBackend(
            IncusConfig(socket=server.socket, timeout=30.0, retries=0), Settings()
        )
        try:
            times = []
            for _ in range(2):
                started = time.perf_counter()
                cluster = backend.observe()
                times.append(time.perf_counter() - started)
        finally:
            backend.close()
            server.close()
    return {
        "members": float(len(cluster.nodes)),
        "instances": float(len(cluster.guests)),
        "first_s": times[0],
        "second_s": times[1],
    }


def section(members: int = 50, instances: int = 5000) -> tuple[str, bool]:
    """A Markdown section of the measurement, and whether both observations met the target."""
    result = measure(members, instances)
    worst = max(result["first_s"], result["second_s"])
    met = worst < TARGET_SECONDS
    text = "\n".join(
        [
            "### Incus backend: one observation",
            "",
            f"{int(result['members'])} members, {int(result['instances'])} instances (fake Incus "
            f"API on a unix socket): first observation {result['first_s']:.2f} s, second "
            f"{result['second_s']:.2f} s; target under {TARGET_SECONDS:g} s: "
            f"{'met' if met else 'MISSED'}.",
            "",
        ]
    )
    return text, met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.incus", description=__doc__)
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--json", type=Path, default=None, metavar="FILE")
    args = parser.parse_args(argv)
    result = measure(args.members, args.instances)
    print(
        f"observe {int(result['members'])} members, {int(result['instances'])} instances: "
        f"first {result['first_s']:.2f} s, second {result['second_s']:.2f} s "
        f"(target < {TARGET_SECONDS:g} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0 if max(result["first_s"], result["second_s"]) < TARGET_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
