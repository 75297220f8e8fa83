"""A small fake Proxmox cluster for tests that run ``opendrs`` as a subprocess against it, and
the configuration files that go with it (shadow mode, a token file, optionally the HTTP server
with its own token). Import after ``pytest.importorskip("fakepve")``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from backends.fakepve_fixture import TOKEN_ID, TOKEN_SECRET, FakeCluster, GiB, proxmox_config

__all__ = [
    "clean_environment",
    "fake_cluster",
    "secret_file",
    "shadow_config",
]


@contextlib.contextmanager
def fake_cluster(folder: Path, *, nodes: int = 3, vms: int = 4) -> Iterator[FakeCluster]:
    """``nodes`` nodes (pve1…) and ``vms`` running VMs of 1 core and 3 GiB, all on pve1, up a
    day; the token ``TOKEN_ID`` with ``TOKEN_SECRET``."""
    cluster = FakeCluster(str(folder), time_scale=0.01)
    pve = cluster.pve
    pve.apitokens[TOKEN_ID] = TOKEN_SECRET
    for index in range(1, nodes + 1):
        pve.add_node(f"pve{index}", cpu=8, memory=32 * GiB, base_memory=1 * GiB)
    for i in range(vms):
        vm = pve.add_vm(
            100 + i, f"vm{i}", node="pve1", status="running", config={"cores": 1, "memory": 3072}
        )
        vm.started_at = time.time() - 86400
        vm.stats.update(cpu=0.3, mem=3 * GiB)
    try:
        yield cluster
    finally:
        cluster.stop()


def secret_file(path: Path, secret: str) -> Path:
    """``path`` holding ``secret`` on one line, mode 600."""
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def shadow_config(
    directory: Path,
    fake: FakeCluster,
    *,
    token: str = TOKEN_SECRET,
    http_token: Path | None = None,
    http: bool = False,
    extra: str = "",
) -> Path:
    """``directory/opendrs.yaml`` (the directory made if needed) in shadow mode for ``fake``,
    the token in ``directory/token``; with ``http`` (or an ``http_token`` file) the HTTP server on
    a free loopback port."""
    directory.mkdir(parents=True, exist_ok=True)
    if http or http_token is not None:
        guard = "" if http_token is None else f", token_file: {http_token}"
        extra = f"http: {{listen: '127.0.0.1:0'{guard}}}\n" + extra
    return proxmox_config(directory, fake, mode="shadow", token=token, extra=extra)


def clean_environment(**variables: str) -> dict[str, str]:
    """This process's environment without any ``OPENDRS_*`` variable, plus ``variables``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OPENDRS_")} | variables
