"""Configuration errors said as such: a secret no HTTP header can carry, a secret from the
environment held to the rules of one from a file, a history path that names another kind of
file — each one line and exit status 2, from ``opendrs run`` and ``opendrs history`` as
subprocesses (``run`` against the fake Proxmox API on loopback)."""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "fakepve", reason="fakepve (a test-only dev dependency: pip install -e '.[dev]') is missing"
)
pytest.importorskip("cryptography", reason="fakepve's certificates need cryptography")

from backends.fakepve_fixture import TOKEN_ID, TOKEN_SECRET, FakeCluster
from daemon import opendrs
from pve_daemon import clean_environment, fake_cluster, secret_file, shadow_config

#: A token with a character outside Latin-1 (the euro sign).
NOT_LATIN1 = "9f1c2e7a-5b3d-4c1e-8a6f-0d2b4e6f8a1\u20ac"
ENV_TOKEN = "OPENDRS_PROXMOX_TOKEN"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeCluster]:
    with fake_cluster(tmp_path, nodes=1, vms=0) as cluster:
        yield cluster


def run_once(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``opendrs run --once`` with no ``OPENDRS_*`` variable but ``env``."""
    return opendrs(
        "run", "--once", "--config", str(config), timeout=120, env=clean_environment(**env)
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and "UnicodeEncodeError" not in result.stderr
    return result.stderr.strip()


def env_config(tmp_path: Path, fake: FakeCluster) -> Path:
    """A configuration whose token comes from the environment."""
    config = tmp_path / "env.yaml"
    config.write_text(
        "mode: shadow\n"
        "backend:\n"
        "  type: proxmox\n"
        f"  hosts: ['{fake.address}']\n"
        f"  user: '{TOKEN_ID}'\n"
        f"  ca_file: '{fake.cafile}'\n"
        "  timeout: 5s\n"
        "  retries: 0\n"
    )
    return config


def test_a_token_file_outside_latin1_is_a_configuration_error(
    tmp_path: Path, fake: FakeCluster
) -> None:
    config = shadow_config(tmp_path, fake, token=NOT_LATIN1)
    line = one_line(run_once(config))
    assert line == (
        f"error: {config}: backend.token_file: the secret file '{tmp_path / 'token'}' holds a "
        "character outside Latin-1, which an HTTP header cannot carry (a token is ASCII)"
    )
    assert NOT_LATIN1 not in line


def test_a_token_from_the_environment_outside_latin1_is_a_configuration_error(
    tmp_path: Path, fake: FakeCluster
) -> None:
    line = one_line(run_once(env_config(tmp_path, fake), **{ENV_TOKEN: NOT_LATIN1}))
    assert line.endswith(
        f"backend: the environment variable {ENV_TOKEN} holds a character outside Latin-1, which "
        "an HTTP header cannot carry (a token is ASCII)"
    )
    assert NOT_LATIN1 not in line


@pytest.mark.parametrize("value", [TOKEN_SECRET + " extra", "x" * 5000])
def test_a_secret_from_the_environment_is_held_to_the_rules_of_a_file(
    tmp_path: Path, fake: FakeCluster, value: str
) -> None:
    line = one_line(run_once(env_config(tmp_path, fake), **{ENV_TOKEN: value}))
    assert f"backend: the environment variable {ENV_TOKEN} " in line
    assert line.endswith(
        ("must hold only the secret, on one line", "too large to hold only a secret")
    )
    assert value not in line
    # The same value in a file is refused the same way.
    config = shadow_config(tmp_path, fake, token=value)
    from_file = one_line(run_once(config))
    assert from_file.split("' ", 1)[1] == line.split(f"{ENV_TOKEN} ", 1)[1]


def test_a_good_token_from_the_environment_still_works(tmp_path: Path, fake: FakeCluster) -> None:
    result = run_once(env_config(tmp_path, fake), **{ENV_TOKEN: TOKEN_SECRET})
    assert result.returncode == 0, result.stderr


def test_a_dashboard_token_outside_latin1_is_a_configuration_error(
    tmp_path: Path, fake: FakeCluster
) -> None:
    token = secret_file(tmp_path / "http.token", NOT_LATIN1)
    config = shadow_config(tmp_path, fake, http_token=token)
    line = one_line(run_once(config))
    assert line == (
        f"error: http.token_file: the secret file '{token}' holds a character outside Latin-1, "
        "which an HTTP header cannot carry (a token is ASCII)"
    )


# -- opendrs history on a file that is not a history ----------------------------------------


def not_histories(folder: Path) -> dict[str, tuple[Path, str]]:
    text = folder / "notes.txt"
    text.write_text("not a database at all\n" * 200)
    other = folder / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    empty = folder / "empty.sqlite"
    empty.write_bytes(b"")
    return {
        "text": (text, "not an SQLite database"),
        "other": (other, "a database with tables photos"),
        "empty": (empty, "an empty database"),
    }


@pytest.mark.parametrize("kind", ["text", "other", "empty"])
def test_history_on_a_file_that_is_not_a_history_says_so(tmp_path: Path, kind: str) -> None:
    path, why = not_histories(tmp_path)[kind]
    config = tmp_path / "opendrs.yaml"
    config.write_text(f"backend: {{type: sim, scenario: 'builtin:demo'}}\nhistory: {path.name}\n")
    before = path.read_bytes()
    result = opendrs("history", "--config", str(config), timeout=60)
    assert one_line(result) == f"error: {path}: not an opendrs history ({why})"
    assert path.read_bytes() == before  # read-only: nothing written
