"""The configuration as an operator meets it, each through the command in a subprocess: the
default path (``OPENDRS_CONFIG`` stands in for ``/etc/opendrs/opendrs.yaml``, which no test
writes), ``opendrs init``'s starting configurations, ``opendrs validate --config``, and a policy
threshold written as a percentage or, refused, as a bare number above 1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from daemon import opendrs

SMALL = Path(__file__).resolve().parents[2] / "examples" / "small.yaml"
#: The commands that read the default configuration without --config, each with its arguments.
DEFAULT_READERS = (
    ("run", "--once"),
    ("status",),
    ("history",),
    ("snapshot",),
    ("maintenance", "enter", "pve1"),
    ("validate",),
)


def with_config(path: Path | str) -> dict[str, str]:
    """This environment, the default configuration being ``path``."""
    return {**os.environ, "OPENDRS_CONFIG": str(path)}


def file_config(directory: Path) -> Path:
    """A shadow configuration on a snapshot file (examples/small.yaml)."""
    shutil.copy(SMALL, directory / "cluster.yaml")
    config = directory / "opendrs.yaml"
    config.write_text("backend: {type: file, path: cluster.yaml}\nhistory: history.sqlite\n")
    return config


# -- the default configuration path ----------------------------------------------------------


@pytest.mark.parametrize("argv", DEFAULT_READERS, ids=lambda argv: argv[0])
def test_a_missing_default_configuration_says_where_and_how_to_write_one(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    missing = tmp_path / "etc" / "opendrs.yaml"
    done = opendrs(*argv, env=with_config(missing), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"no configuration file at {missing} (from $OPENDRS_CONFIG)" in done.stderr
    assert "opendrs init --platform proxmox" in done.stderr and "--config FILE" in done.stderr


def test_without_the_variable_the_default_is_etc_opendrs() -> None:
    if os.path.exists("/etc/opendrs/opendrs.yaml"):
        pytest.skip("this host has an /etc/opendrs/opendrs.yaml")
    environ = {k: v for k, v in os.environ.items() if k != "OPENDRS_CONFIG"}
    done = opendrs("status", env=environ, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: no configuration file at /etc/opendrs/opendrs.yaml: ")


def test_the_default_configuration_is_read_without_config(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    env = with_config(config)
    ran = opendrs("run", "--once", env=env, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "history.sqlite").exists()
    history = opendrs("history", "--format", "jsonl", env=env, timeout=60)
    assert history.returncode == 0, history.stderr
    assert json.loads(history.stdout.splitlines()[0])["kind"] == "decision"
    status = opendrs("status", "--format", "json", env=env, timeout=60)
    assert status.returncode == 0, status.stderr
    snapshot = opendrs("snapshot", "-o", str(tmp_path / "live.yaml"), env=env, timeout=60)
    assert snapshot.returncode == 0, snapshot.stderr
    assert yaml.safe_load((tmp_path / "live.yaml").read_text())["nodes"]
    # --config wins over the default.
    other = opendrs("status", "--config", str(tmp_path / "nope.yaml"), env=env, timeout=60)
    assert other.returncode == 2 and "nope.yaml" in other.stderr


# -- opendrs init ----------------------------------------------------------------------------


def proxmox_files(directory: Path) -> None:
    """The token's secret and the CA the Proxmox starting configuration names, beside it."""
    token = directory / "proxmox.token"
    token.write_text("0b5c3c0e-3a4f-4b8e-9d2a-6f1e2d3c4b5a\n")
    token.chmod(0o600)
    (directory / "pve-root-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")


@pytest.mark.parametrize("platform", ["proxmox", "incus"])
def test_init_writes_a_starting_configuration_that_validates(tmp_path: Path, platform: str) -> None:
    target = tmp_path / "etc" / "opendrs.yaml"
    done = opendrs("init", "--platform", platform, "--output", str(target), timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"wrote {target}" in done.stdout and "shadow" in done.stdout
    if platform == "proxmox":
        proxmox_files(target.parent)
    checked = opendrs("validate", "--config", str(target), timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"{target}: valid\n")
    assert re.search(r"^  mode +shadow: .*migrates nothing$", checked.stdout, re.M)
    assert {"proxmox": "Proxmox VE at localhost:8006", "incus": "Incus at "}[platform] in (
        checked.stdout
    )
    assert "dashboard http://127.0.0.1:9180 (this host only)" in checked.stdout
    moves = "migrations: 1 at once, 1 into any one node; a migrated guest stays put 6h"
    assert f"  moves     {moves}\n" in checked.stdout


@pytest.mark.parametrize("platform", ["proxmox", "incus"])
def test_the_commented_migration_windows_validate_once_uncommented(
    tmp_path: Path, platform: str
) -> None:
    done = opendrs("init", "--platform", platform, "-o", "-", timeout=60)
    assert done.returncode == 0, done.stderr
    text = re.sub(r"(?m)^  # (timezone|windows|blackouts):", r"  \1:", done.stdout)
    assert text.count("\n  windows: ") == 1 and text != done.stdout
    target = tmp_path / "opendrs.yaml"
    target.write_text(text)
    if platform == "proxmox":
        proxmox_files(tmp_path)
    checked = opendrs("validate", "--config", str(target), timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert (
        "  windows   balance may start migrations only within Mon-Fri 22:00-06:00, "
        "Sat,Sun 00:00-24:00; no balance, maintenance or return migration starts in Sun "
        "01:00-04:00 (Europe/Berlin)\n"
    ) in checked.stdout


@pytest.mark.parametrize("platform", ["proxmox", "incus"])
def test_the_starting_configuration_is_safe_and_explained(platform: str) -> None:
    done = opendrs("init", "--platform", platform, "-o", "-", timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    document = yaml.safe_load(text)
    assert document["mode"] == "shadow"
    backend = document["backend"]
    assert backend.get("verify_tls", True) is True
    assert not {"password", "token", "secret", "password_file"} & set(backend)
    if platform == "proxmox":
        assert backend["token_file"] and backend["ca_file"]
    assert document["http"]["listen"].startswith("127.0.0.1:")
    # Every key is explained: a comment on its line or on the line above.
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if re.match(r"^\s*[a-z_]+:", line):
            above = lines[number - 1].strip() if number else ""
            assert "#" in line or above.startswith("#") or line.startswith("version:"), line


def test_init_leaves_an_existing_file_alone_unless_forced(tmp_path: Path) -> None:
    target = tmp_path / "opendrs.yaml"
    target.write_text("mine: true\n")
    refused = opendrs("init", "--platform", "incus", "-o", str(target), timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "exists" in refused.stderr and "--force" in refused.stderr
    assert target.read_text() == "mine: true\n"
    forced = opendrs("init", "--platform", "incus", "-o", str(target), "--force", timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert "type: incus" in target.read_text()


def test_init_writes_the_default_configuration_path(tmp_path: Path) -> None:
    target = tmp_path / "conf" / "opendrs.yaml"
    done = opendrs("init", "--platform", "incus", env=with_config(target), timeout=60)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(target.read_text())["backend"]["type"] == "incus"
    link = tmp_path / "link.yaml"
    link.symlink_to(target)
    refused = opendrs("init", "--platform", "incus", "-o", str(link), "--force", timeout=60)
    assert refused.returncode == 2 and "symbolic link" in refused.stderr


# -- opendrs validate --config -----------------------------------------------------------------


def test_validate_names_a_problem_in_every_section(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text(
        "backend: {type: proxmox}\n"
        "polcy: {}\n"
        "policy: {threshold: 15}\n"
        "executor: {max_parallel: 0}\n"
        "http: {listen: 'example.com:80'}\n"
    )
    done = opendrs("validate", "--config", str(config), timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    fields = [line.split(": ")[2] for line in lines]
    assert fields == [
        "backend.hosts",
        "polcy",
        "policy.threshold",
        "executor.max_parallel",
        "http.listen",
    ], lines
    assert all(line.startswith(f"error: {config}: ") for line in lines)
    assert "did you mean 15 %? (write 15% or 0.15)" in lines[2]
    as_json = json.loads(opendrs("validate", "--config", str(config), "--format", "json").stdout)
    assert not as_json["valid"] and [p["field"] for p in as_json["problems"]] == fields


def test_validate_summarises_what_a_configuration_does(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    config.write_text(config.read_text() + "mode: active\npolicy: {threshold: 20%, hold: 3}\n")
    done = opendrs("validate", "--config", str(config), timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^  mode +active: migrates guests$", done.stdout, re.M)
    assert "above 20 pp for 3 looks (15m)" in done.stdout
    assert "failover" not in done.stdout
    data = json.loads(opendrs("validate", "--config", str(config), "--format", "json").stdout)
    assert data["valid"] and data["summary"]["platform"].startswith("the snapshot file ")


def validate_with(tmp_path: Path, extra: str) -> subprocess.CompletedProcess[str]:
    """``opendrs validate --config`` on the file configuration with ``extra`` appended."""
    config = file_config(tmp_path)
    config.write_text(config.read_text() + extra)
    return opendrs("validate", "--config", str(config), timeout=60)


def test_validate_summarises_manual_mode_and_keep_failover(tmp_path: Path) -> None:
    done = validate_with(
        tmp_path,
        "mode: manual\nautomatic: [repair, balance]\nproposal_ttl: 30m\n"
        "policy: {keep_failover: 2, failover_recovery: pve-static}\n",
    )
    assert done.returncode == 0, done.stderr
    mode = r"^  mode +manual: proposes, .*\(repair, balance act on their own; a proposal expires"
    assert re.search(mode + r" after 30m\)$", done.stdout, re.M)
    failover = (
        r"^  failover +keeps every HA guest restartable if any 2 nodes fail \(keep_failover 2; "
        r"as Proxmox VE's HA manager restarts them in static mode\)"
    )
    assert re.search(failover, done.stdout, re.M)
    bad = validate_with(tmp_path, "policy: {keep_failover: 1, failover_recovery: pve-dynamic}\n")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "policy.failover_recovery: unknown value 'pve-dynamic'" in bad.stderr


def test_validate_takes_a_snapshot_or_a_configuration(tmp_path: Path) -> None:
    both = opendrs("validate", "demo", "--config", str(tmp_path / "x.yaml"), timeout=60)
    assert both.returncode == 2 and "give a SNAPSHOT or --config FILE" in both.stderr
    assert opendrs("validate", str(SMALL), timeout=60).returncode == 0
    config = file_config(tmp_path)
    as_snapshot = opendrs("validate", str(config), timeout=60)
    assert as_snapshot.returncode == 2 and as_snapshot.stderr == (
        f"error: {config} is a configuration file, not a snapshot: opendrs validate --config "
        f"{config}\n"
    )


def test_validate_alone_checks_the_default_configuration(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    done = opendrs("validate", env=with_config(config), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{config}: valid\n")
    config.write_text(config.read_text() + "mode: sideways\n")
    refused = opendrs("validate", env=with_config(config), timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith(f"error: {config}: mode: ")


def test_a_configuration_that_is_not_yaml_is_one_line_with_where(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text("version: 1\nmode: [shadow\n  backend: {\n")
    for argv in (("validate", "--config", str(config)), ("run", "--once", "--config", str(config))):
        done = opendrs(*argv, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr == (
            f"error: {config}: line 3, column 10: expected ',' or ']', but got ':'\n"
        ), done.stderr


def test_an_empty_configuration_says_it_is_empty(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    config.write_text("# nothing yet\n")
    for argv in (("validate", "--config", str(config)), ("run", "--once", "--config", str(config))):
        done = opendrs(*argv, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"error: {config}: the configuration is empty (")
        assert "opendrs init --platform proxmox" in done.stderr and "got null" not in done.stderr


def test_a_threshold_in_the_configuration_takes_a_percentage(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    config.write_text(config.read_text() + "policy: {threshold: 15%, hot: 85%}\n")
    assert opendrs("validate", "--config", str(config), timeout=60).returncode == 0
    config.write_text(config.read_text().replace("15%", "15"))
    done = opendrs("validate", "--config", str(config), timeout=60)
    assert done.returncode == 2 and "policy.threshold: 15 as a fraction is 1500 %" in done.stderr


@pytest.mark.parametrize(
    ("policy", "field", "reason"),
    [
        ("{threshold: 150%}", "policy.threshold", "150 % is more than the spread can be (100 %)"),
        ("{threshold: 15%, target: 20%}", "policy.target", "the target (20 %) is above the"),
        ("{threshold: 5%}", "policy.threshold", "the target (8 %) is above the threshold (5 %)"),
        ("{target: 150%}", "policy.target", "must not be more than 100%"),
    ],
)
def test_a_threshold_balancing_would_never_act_on_is_refused(
    tmp_path: Path, policy: str, field: str, reason: str
) -> None:
    config = file_config(tmp_path)
    config.write_text(config.read_text() + f"policy: {policy}\n")
    done = opendrs("validate", "--config", str(config), timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {config}: {field}: ") and reason in done.stderr


def test_a_coefficient_of_variation_may_be_above_100_percent(tmp_path: Path) -> None:
    config = file_config(tmp_path)
    config.write_text(config.read_text() + "policy: {metric: cv, threshold: 150%}\n")
    done = opendrs("validate", "--config", str(config), timeout=60)
    assert done.returncode == 0, done.stderr


def test_windows_or_blackouts_applied_to_nothing_are_refused(tmp_path: Path) -> None:
    done = validate_with(
        tmp_path,
        "policy: {timezone: UTC, blackouts: ['Sun 01:00-04:00'], blackouts_apply_to: []}\n",
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "policy.blackouts_apply_to: an empty list holds nothing back" in done.stderr


def test_a_warning_while_reading_is_one_line_once_beside_the_problems(tmp_path: Path) -> None:
    config = tmp_path / "opendrs.yaml"
    assert opendrs("init", "--platform", "proxmox", "-o", str(config), timeout=60).returncode == 0
    proxmox_files(tmp_path)
    (tmp_path / "proxmox.token").chmod(0o644)
    readable = f"warning: {config}: the secret file {tmp_path / 'proxmox.token'} is readable by"
    valid = opendrs("validate", "--config", str(config), timeout=60)
    assert valid.returncode == 0 and valid.stderr.startswith(readable), valid.stderr
    assert valid.stderr.count("\n") == 1
    config.write_text(config.read_text() + "foo: 1\n")  # the reader runs again after a problem
    refused = opendrs("validate", "--config", str(config), timeout=60)
    assert refused.returncode == 2 and refused.stderr.count(readable) == 1, refused.stderr
    assert refused.stderr.splitlines()[1] == f"error: {config}: foo: unknown key " + (
        "(expected one of version, cluster, mode, automatic, proposal_ttl, backend, history, "
        "lock, policy, executor, settings, log, http)"
    )
    as_json = json.loads(opendrs("validate", "--config", str(config), "--format", "json").stdout)
    assert len(as_json["warnings"]) == 1 and "readable by every user" in as_json["warnings"][0]
