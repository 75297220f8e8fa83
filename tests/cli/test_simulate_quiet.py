"""``opendrs simulate --no-progress`` says nothing on standard error, even when the simulated
controller logs an error (an API outage long enough to count as one); without it, the error is
said, as the daemon would log it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon import opendrs

CLUSTER = """\
version: 1
nodes:
  pve1: {cpu: 16, memory: 64GiB}
  pve2: {cpu: 16, memory: 64GiB}
guests:
  - {id: 101, node: pve1, cpu: 4, memory: 16GiB, usage: {cpu: 2, memory: 12GiB}, uptime: 1d}
  - {id: 102, node: pve2, cpu: 4, memory: 16GiB, usage: {cpu: 2, memory: 12GiB}, uptime: 1d}
"""

#: 20 minutes without the API: observation fails on more cycles in a row than the daemon lets pass.
OUTAGE = """\
version: 1
cluster: cluster.yaml
step: 1m
duration: 1h
faults:
  - {type: api-error, at: 10m, duration: 20m}
"""


def _simulate(tmp_path: Path, *extra: str) -> tuple[str, str]:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "outage.yaml").write_text(OUTAGE)
    argv = ("simulate", str(tmp_path / "outage.yaml"), "--policy", "opendrs", "--format", "json")
    done = opendrs(*argv, *extra, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["policy"] == "opendrs"
    return done.stdout, done.stderr


def test_no_progress_leaves_stderr_silent_through_an_api_outage(tmp_path: Path) -> None:
    _, stderr = _simulate(tmp_path, "--no-progress")
    assert stderr == ""


def test_without_no_progress_the_simulated_error_is_said(tmp_path: Path) -> None:
    _, stderr = _simulate(tmp_path)
    assert "cannot observe the cluster (3 in a row): simulated API error" in stderr
