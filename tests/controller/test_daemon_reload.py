"""SIGHUP with a changed file, as an operator sends it (``systemctl reload opendrs``): ``opendrs
run`` as a subprocess against the fake Proxmox API on loopback, in shadow mode. What a reload
cannot change (the backend, the cluster's name, the history and its lock) is kept until the next
restart and said so; what it can change (the interval, the token's secret) takes effect at once."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

import opendrs.cli.daemon as daemon_module
from backends.fakepve_fixture import TOKEN_ID, TOKEN_SECRET, FakeCluster
from daemon import Daemon, fetch, served, stepped_clock
from opendrs.backends.base import Backend, BackendError, RenewsSecret
from opendrs.cli.daemon import DaemonFiles, DaemonRun, Published
from opendrs.cli.daemon_signals import DaemonSignals
from opendrs.controller.config import Config
from pve_daemon import fake_cluster, secret_file, shadow_config

#: What the warning about a setting a reload cannot change says.
LATER = "it takes effect at the next restart"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path) as cluster:
        yield cluster


def reload_with(daemon: Daemon, config: Path, text: str) -> int:
    """Write ``text`` as the configuration, send SIGHUP, wait for the reload: the log's mark."""
    config.write_text(text)
    mark = daemon.mark
    daemon.signal(signal.SIGHUP)
    daemon.wait_for(r"configuration reloaded", after=mark)
    return mark


def test_a_reload_renaming_the_cluster_keeps_the_daemon_running(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake)
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        mark = reload_with(daemon, config, config.read_text() + "cluster: renamed\n")
        daemon.wait_for(rf"the cluster setting changed: {LATER}", after=mark)
        # It goes on deciding, and recording, under the name its history has.
        daemon.wait_for(r"decision \(shadow\)", after=daemon.mark)
        assert daemon.process.poll() is None, daemon.log()
        assert daemon.stop() == 0
    assert "belongs to cluster" not in daemon.log()


def test_a_reload_naming_another_history_keeps_the_running_one_and_says_so(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake)
    text = config.read_text()
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        mark = reload_with(daemon, config, text + "history: other.sqlite\n")
        kept = rf"the history setting changed: {LATER} \(still \S+history.sqlite\)"
        daemon.wait_for(kept, after=mark)
        daemon.wait_for(r"decision \(shadow\)", after=daemon.mark)
        assert daemon.stop() == 0
    assert not (tmp_path / "other.sqlite").exists()


def test_a_reload_to_a_shorter_interval_decides_at_the_new_interval(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake)
    text = config.read_text()
    assert "interval: 1s" in text
    config.write_text(text.replace("interval: 1s", "interval: 1h"))
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        mark = reload_with(daemon, config, text)
        # The next decision comes a second after the last one, not an hour after it.
        daemon.wait_for(r"decision \(shadow\)", after=mark, timeout=30)
        assert daemon.stop() == 0


@pytest.mark.parametrize("backend_changed", [False, True], ids=["same-backend", "new-timeout"])
def test_a_reload_after_a_new_token_secret_logs_in_with_it(
    tmp_path: Path, fake: FakeCluster, backend_changed: bool
) -> None:
    """The token's secret renewed on Proxmox and written to the token file: ``systemctl reload
    opendrs`` is enough, as for every other change of the file it reads — also when the reload
    changes the backend section too (which waits for a restart; the secret does not)."""
    config = shadow_config(tmp_path, fake)
    text = config.read_text()
    if backend_changed:
        assert "  timeout: 5s\n" in text
        text = text.replace("  timeout: 5s\n", "  timeout: 7s\n")
    renewed = "0c4e1f2a-7d3b-4e5f-9a8b-1c2d3e4f5a6b"
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        fake.pve.apitokens[TOKEN_ID] = renewed
        daemon.wait_for(r"cannot observe the cluster.*authentication failed", after=daemon.mark)
        secret_file(tmp_path / "token", renewed)
        mark = reload_with(daemon, config, text)
        if backend_changed:
            daemon.wait_for(rf"the backend section changed: {LATER}", after=mark)
        daemon.wait_for(r"decision \(shadow\)", after=mark, timeout=30)
        assert daemon.stop() == 0
    assert renewed not in daemon.log() and TOKEN_SECRET not in daemon.log()


def test_a_reload_whose_secret_cannot_be_read_is_refused_whole(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """A token file that cannot be read at a reload refuses it, as a file with an error is
    refused: one ERROR line naming the file, the running configuration (its interval) and secret
    kept. Here the file names a new token file (which waits for a restart) and the running one,
    which the backend reads again, is emptied."""
    config = shadow_config(tmp_path, fake)
    text = config.read_text()
    secret_file(tmp_path / "token2", TOKEN_SECRET)
    with Daemon(config) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        (tmp_path / "token").write_text("")
        changed = text.replace("interval: 1s", "interval: 1h")
        config.write_text(changed.replace("token_file: token\n", "token_file: token2\n"))
        mark = daemon.mark
        daemon.signal(signal.SIGHUP)
        refused = (
            rf"ERROR +reload refused, keeping the running configuration: {re.escape(str(config))}"
            rf": backend\.token_file: the secret file '{re.escape(str(tmp_path / 'token'))}' "
            "is empty$"
        )
        daemon.wait_for(refused, after=mark)
        # Still the old interval (a second), and still logged in with the secret read before.
        daemon.wait_for(r"decision \(shadow\)", after=daemon.mark, timeout=30)
        assert daemon.stop() == 0
        after = "\n".join(daemon.lines[mark:])
    assert "configuration reloaded" not in after and "setting changed" not in after
    assert TOKEN_SECRET not in daemon.log()


def test_a_reload_keeps_the_debug_log_of_verbose(tmp_path: Path, fake: FakeCluster) -> None:
    """``opendrs run -v``: its debug lines go on after a reload, whatever the file's
    ``log_level`` says."""
    config = shadow_config(tmp_path, fake, http=True)
    with Daemon(config, "-v") as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(shadow\)")
        mark = reload_with(daemon, config, config.read_text())
        assert fetch(address, "/healthz")[0] == 200
        daemon.wait_for(r"DEBUG +http 127\.0\.0\.1: .*GET /healthz", after=mark)
        assert daemon.stop() == 0


def test_a_reload_or_a_wake_while_the_daemon_starts_does_not_end_it(
    tmp_path: Path, fake: FakeCluster
) -> None:
    """``systemctl reload`` right after ``start`` (or ``opendrs approve``'s SIGUSR1): from the
    moment the process takes signals — before it has even opened its history — a SIGHUP or
    SIGUSR1 is taken, not the signal's default, which ends the process."""
    config = shadow_config(tmp_path, fake)
    with Daemon(config) as daemon:
        wait_until_caught(daemon.process.pid, (signal.SIGHUP, signal.SIGUSR1))
        assert not (tmp_path / "history.sqlite").exists(), "caught only once started"
        daemon.signal(signal.SIGHUP)
        daemon.signal(signal.SIGUSR1)
        daemon.wait_for(r"configuration reloaded")
        daemon.wait_for(r"decision \(shadow\)")
        assert daemon.process.poll() is None, daemon.log()
        assert daemon.stop() == 0


def wait_until_caught(pid: int, signals: tuple[int, ...], timeout: float = 60.0) -> None:
    """Wait until process ``pid`` catches each of ``signals`` (its ``SigCgt`` in /proc)."""
    wanted = sum(1 << (signum - 1) for signum in signals)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"^SigCgt:\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.M)
        assert found is not None
        if int(found.group(1), 16) & wanted == wanted:
            return
        time.sleep(0.002)
    raise AssertionError(f"process {pid} did not catch {signals} within {timeout:g}s")


def test_a_clock_stepped_back_an_hour_does_not_hold_the_next_decision_an_hour(
    tmp_path: Path, fake: FakeCluster
) -> None:
    env, stepped = stepped_clock(tmp_path, 3600)
    config = shadow_config(tmp_path, fake)
    with Daemon(config, env=env) as daemon:
        daemon.wait_for(r"decision \(shadow\)")
        mark = daemon.mark
        stepped.touch()
        # Decided every second on: the next decisions a second after the step, not an hour; the
        # usage window, whose samples are now in the future, starts again.
        daemon.wait_for(r"the clock went back 3[56]\d\d s .*usage window starts again", after=mark)
        daemon.wait_for(r"decision \(shadow\)", after=mark, timeout=30)
        daemon.wait_for(r"decision \(shadow\)", after=daemon.mark, timeout=30)
        assert daemon.process.poll() is None, daemon.log()
        assert daemon.stop() == 0
    assert "internal error" not in daemon.log()


class _Steps:
    """What a reload did, in order: the decision log opened again, the secret taken into use."""

    def __init__(self, secret_error: str | None = None) -> None:
        self.done: list[str] = []
        self.secret_error = secret_error
        self.path = "decisions.log"

    def reopen(self, path: str | None) -> None:
        self.done.append("decision log")

    def read_secret(self) -> Callable[[], None]:
        if self.secret_error is not None:
            raise BackendError(self.secret_error)
        return lambda: self.done.append("secret")


def _reload(steps: _Steps, monkeypatch: pytest.MonkeyPatch) -> Config | None:
    """``DaemonRun.take_reload`` of a SIGHUP, against ``steps`` as decision log and backend."""
    fresh = cast(Config, SimpleNamespace(log_level="info", decision_log=None, http=None))
    monkeypatch.setattr(daemon_module, "setup_logging", lambda level: steps.done.append(level))
    run = DaemonRun(
        cast(Config, SimpleNamespace(file="opendrs.yaml")),
        cast(DaemonSignals, SimpleNamespace(take_reload=lambda: fresh)),
        cast(DaemonFiles, SimpleNamespace(decisions=steps)),
        cast(Published, SimpleNamespace(server=None)),
        once=False,
        shadow=False,
    )
    assert isinstance(steps, RenewsSecret)
    return run.take_reload(cast(Backend, steps))


def test_a_reload_takes_the_secret_read_into_use_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret read again is used only once nothing else can refuse the reload."""
    steps = _Steps()
    assert _reload(steps, monkeypatch) is not None
    assert steps.done == ["info", "decision log", "secret"]


def test_a_reload_whose_secret_cannot_be_read_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    steps = _Steps(secret_error="backend.token_file: the secret file 'token' is empty")
    assert _reload(steps, monkeypatch) is None
    assert steps.done == []
    assert caplog.messages == [
        "reload refused, keeping the running configuration: opendrs.yaml: "
        "backend.token_file: the secret file 'token' is empty"
    ]
