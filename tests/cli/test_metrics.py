"""``/metrics`` and ``/healthz`` of ``opendrs run``, as Prometheus and a health check see them:
the daemon in a subprocess (the simulator, or a snapshot file read at each observation) with
``http.listen`` on a free loopback port, fetched over loopback only. Every daemon a test starts is
stopped by it."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT
from daemon import SERVING, Daemon, eventually, fetch, run_once, served
from opendrs.controller.config import ConfigError, parse_config


def samples(address: str, **kwargs: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed by the Prometheus client's own parser: (name, labels) → value."""
    status, text = fetch(address, "/metrics", **kwargs)
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    """The sum of a metric's samples over its labels (0 when it has none yet)."""
    return sum(v for (n, _), v in metrics.items() if n == name)


def sim_config(
    directory: Path, *, http: str, scenario: str = "'builtin:demo'", days: int = 60
) -> Path:
    """Active mode on the built-in demo (80 guests packed on three of 8 nodes), a decision every
    5 simulated minutes, for far longer than a test."""
    config = directory / "opendrs.yaml"
    config.write_text(
        "mode: active\n"
        f"backend: {{type: sim, scenario: {scenario}, days: {days}}}\n"
        "history: history.sqlite\n"
        "policy: {interval: 5m, hold: 1, smoothing: 0, threshold: 0.15}\n"
        f"http: {http}\n"
    )
    return config


def test_metrics_follow_what_the_daemon_does(tmp_path: Path) -> None:
    config = sim_config(tmp_path, http="{listen: '127.0.0.1:0'}")
    with Daemon(config) as daemon:
        address = served(daemon)
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        daemon.wait_for(r"started .+ pve\d → pve\d", timeout=60)
        # The metrics follow at the end of the cycle whose plan started the migration.
        eventually(lambda: value(samples(address), "opendrs_decisions_total") >= 1)
        first = samples(address)
        loads = {labels: v for (n, labels), v in first.items() if n == "opendrs_node_load"}
        assert {dict(labels)["node"] for labels in loads} == {f"pve{i}" for i in range(1, 9)}
        assert {dict(labels)["resource"] for labels in loads} == {"cpu", "memory"}
        assert all(0.0 <= v < 2.0 for v in loads.values()) and max(loads.values()) > 0.1
        assert first[("opendrs_threshold", ())] == 0.15
        assert first[("opendrs_spread", ())] > 0.0
        assert first[("opendrs_decisions_total", (("code", "plan"),))] >= 1
        assert value(first, "opendrs_migrations_started_total") >= 1
        assert value(first, "opendrs_cycle_duration_seconds_count") >= 1
        assert first[("opendrs_observation_errors_total", ())] == 0
        assert abs(first[("opendrs_last_observation_timestamp_seconds", ())] - time.time()) < 600

        def moved() -> bool:
            later = samples(address)
            return value(later, "opendrs_decisions_total") > value(
                first, "opendrs_decisions_total"
            ) and value(later, "opendrs_migrations_total") > value(
                first, "opendrs_migrations_total"
            )

        eventually(moved)
        later = samples(address)
        assert later[("opendrs_migrations_total", (("outcome", "done"),))] >= 1
        ended = value(later, "opendrs_migrations_total")
        assert ended <= value(later, "opendrs_migrations_started_total")
        assert later[("opendrs_migrations_in_flight", ())] >= 0
        status, health = fetch(address, "/healthz")
        assert (status, health) == (200, "ok\n")
        assert fetch(address, "/metrics", method="HEAD") == (200, "")
        assert fetch(address, "/nothing")[0] == 404
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert fetch(address, "/metrics", method=method)[0] == 405
        assert fetch(address, "/healthz", method="POST")[0] == 405
        assert daemon.stop() == 0
    assert "stopping: state recorded" in daemon.log()
    with pytest.raises(OSError):
        fetch(address, "/healthz")


def test_the_dashboard_is_served_read_only_from_the_daemons_snapshot(tmp_path: Path) -> None:
    config = sim_config(tmp_path, http="{listen: '127.0.0.1:0'}")
    with Daemon(config) as daemon:
        address = served(daemon)
        eventually(lambda: json.loads(fetch(address, "/api/state")[1])["decisions"] != [])
        state = json.loads(fetch(address, "/api/state")[1])
        (group,) = state["groups"]
        assert [n["name"] for n in group["nodes"]] == [f"pve{i}" for i in range(1, 9)]
        assert state["policy"]["mode"] == "active" and state["cluster"]["name"] == "demo"
        assert state["decisions"][-1]["code"] == "plan"
        with urllib.request.urlopen(f"http://{address}/", timeout=10) as answer:
            page = answer.read().decode()
            headers = answer.headers
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert "script-src 'sha256-" in headers["Content-Security-Policy"]
        assert headers["Cache-Control"] == "no-store"
        assert "pve8" in page and 'id="panel"' in page
        version = json.loads(fetch(address, "/api/state")[1])["version"]
        status, panel = fetch(address, f"/api/panel?after={version - 1}")
        assert status == 200 and panel.startswith('<div id="panel"')
        assert fetch(address, "/", method="HEAD") == (200, "")
        for method in ("POST", "PUT", "DELETE"):
            for path in ("/", "/api/state", "/api/panel"):
                assert fetch(address, path, method=method)[0] == 405
        assert daemon.stop() == 0


def test_healthz_fails_when_observations_fail_and_recovers(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "examples" / "small.yaml", snapshot)
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "backend: {type: file, path: cluster.yaml}\n"
        "policy: {interval: 1s, hold: 1, smoothing: 0}\n"
        "http: {listen: '127.0.0.1:0'}\n"
    )
    with Daemon(config) as daemon:
        address = served(daemon)
        eventually(lambda: fetch(address, "/healthz") == (200, "ok\n"))
        snapshot.rename(tmp_path / "away.yaml")
        daemon.wait_for("cannot observe the cluster")
        eventually(lambda: fetch(address, "/healthz")[0] == 503, timeout=30)
        status, reason = fetch(address, "/healthz")
        assert status == 503 and reason.count("\n") == 1
        assert "no successful cycle for" in reason and "the last cycle failed" in reason
        errors = samples(address)[("opendrs_observation_errors_total", ())]
        assert errors >= 1
        (tmp_path / "away.yaml").rename(snapshot)
        eventually(lambda: fetch(address, "/healthz") == (200, "ok\n"), timeout=30)
        assert daemon.stop() == 0


def test_healthz_fails_while_the_simulated_api_fails(tmp_path: Path) -> None:
    data = ROOT / "src" / "opendrs" / "data" / "scenarios"
    text = (data / "demo.yaml").read_text()
    text = text.replace("cluster: demo-cluster.yaml", f"cluster: '{data / 'demo-cluster.yaml'}'")
    scenario = tmp_path / "outage.yaml"
    scenario.write_text(text + "\nfaults:\n  - {type: api-error, at: 1s, duration: 3660d}\n")
    config = sim_config(
        tmp_path, http="{listen: '127.0.0.1:0'}", scenario=f"'{scenario}'", days=3000
    )
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for("cannot observe the cluster")
        eventually(lambda: fetch(address, "/healthz")[0] == 503, timeout=30)
        status, reason = fetch(address, "/healthz")
        assert status == 503 and "simulated API error" in reason
        assert samples(address)[("opendrs_observation_errors_total", ())] >= 1
        assert daemon.stop() == 0


def test_a_token_guards_every_path_and_is_never_logged(tmp_path: Path) -> None:
    token = "s3cret-token-4711"
    (tmp_path / "http-token").write_text(token + "\n")
    (tmp_path / "http-token").chmod(0o600)
    config = sim_config(tmp_path, http="{listen: '127.0.0.1:0', token_file: http-token}")
    with Daemon(config) as daemon:
        address = served(daemon)
        eventually(lambda: fetch(address, "/healthz", token=token) == (200, "ok\n"))
        for path in ("/metrics", "/healthz", "/", "/api/state", "/api/panel"):
            assert fetch(address, path)[0] == 401
            assert fetch(address, path, token="wrong")[0] == 401
            assert fetch(address, path, method="HEAD")[0] == 401
        assert value(samples(address, token=token), "opendrs_decisions_total") >= 1
        assert fetch(address, "/api/state", token=token)[0] == 200
        assert daemon.stop() == 0
    assert token not in daemon.log()


def test_the_http_section_changed_on_reload_is_said_and_the_old_address_kept(
    tmp_path: Path,
) -> None:
    config = sim_config(tmp_path, http="{listen: '127.0.0.1:0'}")
    with Daemon(config) as daemon:
        address = served(daemon)
        daemon.wait_for(r"decision \(active\)")
        config.write_text(config.read_text().replace("127.0.0.1:0", "127.0.0.1:1"))
        mark = daemon.mark
        daemon.signal(signal.SIGHUP)
        line = daemon.wait_for("the http section changed", after=mark)
        assert f"still serving on http://{address}" in line and "WARNING" in line
        daemon.wait_for("configuration reloaded", after=mark)
        eventually(lambda: fetch(address, "/healthz") == (200, "ok\n"))
        assert daemon.stop() == 0


def test_a_non_loopback_address_is_served_with_a_warning(tmp_path: Path) -> None:
    # Only bound: no request is sent to it.
    config = sim_config(tmp_path, http="{listen: '0.0.0.0:0'}")
    with Daemon(config) as daemon:
        line = daemon.wait_for(SERVING)
        assert "WARNING" in line and "not a loopback address" in line
        assert "no http.token_file is set" in line
        assert daemon.stop() == 0


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="this host has no IPv6 loopback (::1)")
def test_an_ipv6_loopback_address_is_served(tmp_path: Path) -> None:
    config = sim_config(tmp_path, http="{listen: '[::1]:0'}")
    with Daemon(config) as daemon:
        line = daemon.wait_for(SERVING)
        assert "INFO" in line
        address = re.search(r"http://(\[::1\]:\d+)", line)
        assert address is not None
        eventually(lambda: fetch(address.group(1), "/healthz") == (200, "ok\n"))
        assert daemon.stop() == 0


# -- bad configurations: one line, exit status 2 -----------------------------------------------


@pytest.mark.parametrize(
    ("http", "reason"),
    [
        ("{listen: [9180]}", "an address and a port are needed"),
        ("{listen: ':'}", "has no address"),
        ("{listen: 'metrics.example.com:9180'}", "is not an IP address"),
        ("{listen: '::1:9180'}", "in brackets"),
        ("{listen: '127.0.0.1:70000'}", "is not a port"),
        ("{listen: '127.0.0.1:http'}", "is not a port"),
        ("{token_file: t}", "listen"),
        ("{listen: '127.0.0.1:0', tokenfile: t}", "tokenfile"),
    ],
)
def test_a_bad_http_section_is_one_line(tmp_path: Path, http: str, reason: str) -> None:
    config = sim_config(tmp_path, http=http)
    done = run_once(config)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "http" in line and reason in line


def test_a_token_file_others_may_change_is_refused(tmp_path: Path) -> None:
    (tmp_path / "http-token").write_text("abc\n")
    (tmp_path / "http-token").chmod(0o666)
    config = sim_config(tmp_path, http="{listen: '127.0.0.1:0', token_file: http-token}")
    done = run_once(config)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "http.token_file" in line and "writable by every user" in line
    assert "abc" not in done.stderr


@pytest.mark.parametrize(
    ("listen", "host", "port", "loopback"),
    [
        ("127.0.0.1:9180", "127.0.0.1", 9180, True),
        ("localhost:0", "127.0.0.1", 0, True),
        ("[::1]:9180", "::1", 9180, True),
        ("0.0.0.0:9180", "0.0.0.0", 9180, False),
        ("[::]:9180", "::", 9180, False),
        ("192.0.2.7:9180", "192.0.2.7", 9180, False),
        (9180, "127.0.0.1", 9180, True),  # a port alone is on loopback
        ("9180", "127.0.0.1", 9180, True),
        (":9180", "127.0.0.1", 9180, True),
    ],
)
def test_listen_addresses(listen: str | int, host: str, port: int, loopback: bool) -> None:
    config = parse_config(
        {"backend": {"type": "sim"}, "http": {"listen": listen}}, filename="c.yaml"
    )
    assert config.http is not None
    assert (config.http.host, config.http.port, config.http.loopback) == (host, port, loopback)
    assert config.http.token_file is None
    assert parse_config({"backend": {"type": "sim"}}, filename="c.yaml").http is None
    with pytest.raises(ConfigError):
        parse_config({"backend": {"type": "sim"}, "http": {"listen": listen, "x": 1}})
