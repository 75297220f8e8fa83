"""The failover headroom through the daemon and ``opendrs status``: ``/metrics``, the dashboard's
state and the status of a configuration whose snapshot file is read at each observation, the
daemon in a subprocess, fetched over loopback."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_metrics import samples, value

from daemon import Daemon, eventually, fetch, opendrs, served

# a fails: its HA guest of 20 GiB fits only on c; with keep_failover 2 any two nodes failing
# leave an HA guest down (hard anti-affinity keeps 101 and 102 apart).
SNAPSHOT = """\
version: 1
name: lab
settings: {mode: static}
nodes:
  a: {cpu: 16, memory: 32GiB}
  b: {cpu: 16, memory: 32GiB}
  c: {cpu: 16, memory: 32GiB}
guests:
  - {id: 101, name: db, node: a, memory: 20GiB, cpu: 4, ha: true, uptime: 86400}
  - {id: 102, name: db2, node: b, memory: 20GiB, cpu: 4, ha: true, uptime: 86400}
  - {id: 103, name: web, node: c, memory: 4GiB, cpu: 2, ha: true, uptime: 86400}
  - {id: 104, name: scratch, node: c, memory: 8GiB, cpu: 2, uptime: 86400}
rules:
  - {type: anti-affinity, guests: [101, 102]}
"""


def _config(directory: Path, keep: int) -> Path:
    (directory / "lab.yaml").write_text(SNAPSHOT)
    config = directory / "opendrs.yaml"
    config.write_text(
        "backend: {type: file, path: lab.yaml}\n"
        "history: history.sqlite\n"
        f"policy: {{interval: 1s, hold: 1, smoothing: 0, keep_failover: {keep}}}\n"
        "http: {listen: '127.0.0.1:0'}\n"
    )
    return config


def test_metrics_and_dashboard_show_it(tmp_path: Path) -> None:
    with Daemon(_config(tmp_path, 2)) as daemon:
        address = served(daemon)
        eventually(lambda: value(samples(address), "opendrs_decisions_total") >= 1)
        metrics = samples(address)
        assert metrics[("opendrs_failover_headroom", ())] == 0
        assert metrics[("opendrs_failover_unrestartable_guests", ())] == 1
        state = json.loads(fetch(address, "/api/state")[1])
        assert state["failover"]["summary"] == (
            "failover headroom: no, 1 HA guest cannot restart when a and b fail"
        )
        assert 'id="failover"' in fetch(address, "/api/panel")[1]
        assert daemon.stop() == 0


def test_status_says_it(tmp_path: Path) -> None:
    config = _config(tmp_path, 1)
    done = opendrs("status", "--config", str(config))
    assert "failover headroom: yes, for any 1 node failing (3 HA guests)" in done.stdout
    data = json.loads(opendrs("status", "--config", str(config), "--format", "json").stdout)
    assert data["cluster"]["failover"]["ok"] is True
    config = _config(tmp_path, 2)
    done = opendrs("status", "--config", str(config))
    assert "failover headroom: no, 1 HA guest cannot restart when a and b fail" in done.stdout
    assert "  if a and b fail: 1 HA guest of 2 cannot restart: db2 (102)" in done.stdout
