"""The daemon's own files, as an operator meets them: ``opendrs run`` as a subprocess against the
fake Proxmox API on loopback — the decision log on a full disk, and the lock of one history
named by two configurations."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import FakeCluster
from daemon import Daemon, opendrs
from pve_daemon import fake_cluster, shadow_config


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path) as cluster:
        yield cluster


# -- the decision log on a full disk ---------------------------------------------------------

#: The largest file the first run may write (RLIMIT_FSIZE): a write beyond it is cut short, as
#: on a full disk (Python ignores SIGXFSZ; the write returns what fitted, the next fails).
LIMIT = 4 << 20


def run_once_limited(config: Path, limit: int | None) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return opendrs("run", "--once", "--config", str(config), timeout=120, preexec_fn=limited)


def test_a_line_that_does_not_fit_leaves_no_half_line_in_the_decision_log(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake, extra="log: {decisions: decisions.jsonl}\n")
    log = tmp_path / "decisions.jsonl"
    # Whole lines up to 60 bytes short of the limit: the next decision's line does not fit.
    filler = json.dumps({"kind": "filler", "pad": "x" * 200}) + "\n"
    count, rest = divmod(LIMIT - 60, len(filler))
    log.write_text(filler * count + json.dumps({"kind": "filler", "pad": "y" * (rest - 30)}) + "\n")
    before = log.read_bytes()
    assert LIMIT - len(before) < 100

    full = run_once_limited(config, LIMIT)
    assert full.returncode == 0, full.stderr
    assert "cannot write the decision log" in full.stderr
    assert "Traceback" not in full.stderr
    # Nothing of the line that did not fit stays behind.
    assert log.read_bytes() == before

    # Room again: the next run's lines follow whole lines, and every line is JSON.
    freed = run_once_limited(config, None)
    assert freed.returncode == 0, freed.stderr
    lines = log.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records[-1]["kind"] == "decision"
    assert len(records) > count + 1
    assert log.read_bytes().startswith(before)


# -- one history, two configurations ---------------------------------------------------------


def test_two_configurations_with_their_own_lock_on_one_history_do_not_both_run(
    tmp_path: Path, fake: FakeCluster
) -> None:
    history = tmp_path / "history.sqlite"
    first = shadow_config(tmp_path / "a", fake, extra=f"history: {history}\nlock: a.lock\n")
    second = shadow_config(tmp_path / "b", fake, extra=f"history: {history}\nlock: b.lock\n")
    with Daemon(first) as daemon:
        daemon.wait_for(r"shadow: would migrate|balanced|nothing to do")
        result = opendrs("run", "--config", str(second), timeout=60)
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"error: {history}: another opendrs instance is running on this history (with "
            f"another lock file than {tmp_path / 'b' / 'b.lock'})\n"
        )
        # The probe of `opendrs status` sees it too.
        status = opendrs("status", "--config", str(second), "--format", "json", timeout=60)
        assert json.loads(status.stdout)["daemon"]["running"] is True, status.stdout
        status = opendrs("status", "--config", str(second), timeout=60, columns=200)
        assert (
            f"running: a daemon holds the history {history} (with another lock file than "
            f"{tmp_path / 'b' / 'b.lock'})"
        ) in status.stdout, status.stdout
        assert daemon.process.poll() is None


def test_a_hard_link_to_a_running_history_is_the_same_history(
    tmp_path: Path, fake: FakeCluster
) -> None:
    history = tmp_path / "history.sqlite"
    first = shadow_config(tmp_path / "a", fake, extra=f"history: {history}\n")
    with Daemon(first) as daemon:
        daemon.wait_for(r"shadow: would migrate|balanced|nothing to do")
        linked = tmp_path / "b" / "linked.sqlite"
        linked.parent.mkdir()
        os.link(history, linked)
        second = shadow_config(tmp_path / "b", fake, extra=f"history: {linked}\n")
        result = opendrs("run", "--once", "--config", str(second), timeout=60)
        assert result.returncode == 1, result.stderr
        assert "another opendrs instance is running on this history" in result.stderr
        assert daemon.process.poll() is None
    # Once the first stopped, the second runs.
    result = opendrs("run", "--once", "--config", str(second), timeout=120)
    assert result.returncode == 0, result.stderr
