"""``opendrs run`` stopped while an API call hangs: SIGTERM ends the daemon with exit status 0 and
no traceback within :data:`~opendrs.backends.tries.CLOSE_GRACE` seconds (and a margin), whatever
the API does. A call whose answer does not come has its connection shut and its thread ends at
once; one stuck opening its connection (a host that does not answer it: no socket to shut yet)
is waited for no longer than the bound, and a warning says it was left running. Against the
fake Proxmox API, the daemon a subprocess."""

from __future__ import annotations

import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fakepve", reason="fakepve (a test-only dev dependency) is missing")
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster, proxmox_config, running_on_pve1, three_nodes
from daemon import Daemon, eventually, write_proxmox_config
from opendrs.backends.tries import CLOSE_GRACE

#: Seconds a stop may take beyond the bound: the state recorded, the interpreter's exit.
MARGIN = 4.0
LEFT_RUNNING = r"1 call\(s\) to the Proxmox API still running 3s after their connections"
CRASHES = ("Traceback", "Fatal Python error", "terminate called", "Exception occurred")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with three_nodes(str(tmp_path)) as cluster:
        running_on_pve1(cluster.pve, range(100, 104))
        yield cluster


@pytest.fixture
def unanswered() -> Iterator[int]:
    """A port on 127.0.0.1 whose connections are never answered: its listener takes none and
    its queue is full, so a client's connection stays being opened (SYN_SENT)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield port
    finally:
        queued.close()
        listener.close()


def stopped(daemon: Daemon) -> tuple[int, float, str]:
    """SIGTERM: the exit status, the seconds the daemon took to exit, its log."""
    signalled = time.monotonic()
    daemon.signal(signal.SIGTERM)
    status = daemon.wait(CLOSE_GRACE + 30)
    return status, time.monotonic() - signalled, daemon.log()


def assert_clean_stop(status: int, took: float, log: str) -> None:
    assert status == 0, log
    assert took < CLOSE_GRACE + MARGIN, f"stopped in {took:.1f}s:\n{log}"
    assert "opendrs is stopping" in log or "stopping: state recorded" in log, log
    for crash in CRASHES:
        assert crash not in log, log


def test_sigterm_while_the_api_withholds_its_answer(tmp_path: Path, fake: FakeCluster) -> None:
    fake.pve.withhold("GET", "/cluster/resources", secs=60)
    config = proxmox_config(tmp_path, fake, mode="manual")
    with Daemon(config) as daemon:
        eventually(lambda: fake.pve.held_back, log=daemon.log)
        status, took, log = stopped(daemon)
    assert_clean_stop(status, took, log)
    assert not re.search(LEFT_RUNNING, log), log  # its connection shut, the call ended


def test_sigterm_while_a_connection_is_being_opened(
    tmp_path: Path, fake: FakeCluster, unanswered: int
) -> None:
    config = write_proxmox_config(
        tmp_path,
        f"127.0.0.1:{unanswered}",
        fake.cafile,
        user="opendrs@pve!drs",
        token="secret",
        mode="manual",
    )
    config.write_text(config.read_text().replace("timeout: 5s", "timeout: 60s"))
    with Daemon(config) as daemon:
        eventually(lambda: opening(unanswered), log=daemon.log)
        status, took, log = stopped(daemon)
    assert_clean_stop(status, took, log)
    assert re.search(LEFT_RUNNING, log), log


def opening(port: int) -> bool:
    """Whether a connection to 127.0.0.1:``port`` is being opened (SYN_SENT), from /proc."""
    suffix = f":{port:04X}"
    with open("/proc/net/tcp") as table:
        return any(
            fields[2] == f"0100007F{suffix}" and fields[3] == "02"
            for fields in (line.split() for line in table.readlines()[1:])
        )
