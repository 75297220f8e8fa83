"""Fixtures for the Incus backend's tests: a fake Incus cluster served on a unix socket; the
``opendrs`` command and its history, for the end-to-end tests (fake and real LXD)."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from backends.fakeincus import FakeIncus, GiB, Served, socket_path
from daemon import opendrs as run_opendrs
from opendrs.backends.incus.config import IncusConfig

#: The six VMs :func:`crowded_cluster` puts on m1.
CROWDED_VMS = tuple(f"vm{i}" for i in range(1, 7))


def crowded_cluster(fake: FakeIncus) -> FakeIncus:
    """Three empty members (16 threads, 64 GiB); six stateful VMs of 8 GiB (7 GiB in use) on
    a shared pool crowd m1 (:func:`packed`); a move takes 0.1 s."""
    fake.migration_seconds = 0.1
    return packed(fake, CROWDED_VMS)


def serve_crowded(tmp_path: Path) -> Iterator[Served]:
    """:func:`crowded_cluster` served on a unix socket in ``tmp_path`` (a fixture's body)."""
    server = Served(crowded_cluster(FakeIncus("m1")), socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def write_config(
    tmp_path: Path,
    server: Served,
    *,
    mode: str,
    backend: str = "",
    extra: str = "",
    level: str = "debug",
) -> Path:
    """A daemon's configuration for ``server``'s socket, its history in ``tmp_path``."""
    path = tmp_path / "opendrs.yaml"
    path.write_text(
        "version: 1\n"
        f"mode: {mode}\n"
        f"backend: {{type: incus, socket: {server.socket}, timeout: 5s{backend}}}\n"
        "history: history.sqlite\n"
        "executor: {max_parallel: 2, poll_interval: 1s}\n"
        f"log: {{level: {level}}}\n" + extra
    )
    return path


def small_cluster(fake: FakeIncus) -> FakeIncus:
    """Three members (m1 the leader), five instances in two projects."""
    fake.add_member("m1", threads=16, memory=64 * GiB, load1=2.0, used_memory=20 * GiB)
    fake.add_member("m2", threads=16, memory=64 * GiB, load1=0.5, used_memory=4 * GiB)
    fake.add_member("m3", threads=8, memory=32 * GiB, arch="aarch64", groups=["arm"])
    fake.projects["web"] = {}
    fake.add_instance(
        "vm1",
        "m1",
        config={"limits.cpu": "4", "limits.memory": "8GiB", "migration.stateful": "true"},
        devices={"root": {"type": "disk", "pool": "ceph", "path": "/"}},
        cpu_rate=2.0,
        memory_usage=6 * GiB,
    )
    fake.add_instance(
        "vm2", "m1", config={"limits.cpu": "0-1,4", "limits.memory": "50%"}, cpu_rate=1.0
    )
    fake.add_instance("c1", "m1", type="container", config={"limits.memory": "512MB"})
    fake.add_instance("c2", "m2", type="container", status="Stopped")
    fake.add_instance("w1", "m2", project="web", config={"limits.cpu": "2"})
    return fake


def packed(fake: FakeIncus, names: Sequence[str]) -> FakeIncus:
    """Three idle members of 16 threads and 64 GiB (m1 the leader) and running VMs ``names`` of
    2 CPUs and 8 GiB (7 GiB used) that may move live, all on m1: any balancer spreads them."""
    for member in ("m1", "m2", "m3"):
        fake.add_member(member, threads=16, memory=64 * GiB, load1=0.0, used_memory=GiB)
    for name in names:
        fake.add_instance(
            name,
            "m1",
            config={"limits.cpu": "2", "limits.memory": "8GiB", "migration.stateful": "true"},
            devices={"root": {"type": "disk", "pool": "ceph", "path": "/"}},
            memory_usage=7 * GiB,
            cpu_rate=0.0,
        )
    fake.members["m1"].used_memory = GiB + len(names) * 7 * GiB
    return fake


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = Served(small_cluster(FakeIncus()), socket=socket_path(tmp_path))
    try:
        yield server
    finally:
        server.close()


def socket_config(server: Served, **fields: object) -> IncusConfig:
    """A configuration for ``server``'s socket, fast to give up."""
    base: dict[str, object] = {"socket": server.socket, "timeout": 2.0, "retries": 1}
    base.update(fields)
    return IncusConfig(**base)  # type: ignore[arg-type]


#: Seconds an ``opendrs`` subprocess may take.
DEADLINE = 120


def opendrs(*args: str) -> subprocess.CompletedProcess[str]:
    """``opendrs ARGS`` in a subprocess, its tables 160 columns wide."""
    return run_opendrs(*args, timeout=DEADLINE, columns=160)


def history(folder: Path, query: str) -> list[tuple[object, ...]]:
    """Rows of ``query`` on ``folder/history.sqlite``."""
    with sqlite3.connect(folder / "history.sqlite") as db:
        return db.execute(query).fetchall()
