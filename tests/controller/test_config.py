"""The configuration file: defaults, paths, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from opendrs.controller.config import ConfigError, load_config, parse_config
from opendrs.controller.loop import InstanceLock, LockError
from opendrs.engine.policy import PRESETS


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "opendrs.yaml"
    path.write_text(text)
    return path


def test_a_minimal_file_takes_the_safe_defaults(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("nodes: {a: {cpu: 4, memory: 8GiB}}\n")
    config = load_config(_write(tmp_path, "backend: {type: file, path: cluster.yaml}\n"))
    assert config.mode == "shadow" and not config.active
    assert config.backend.type == "file"
    assert config.backend.path == str(tmp_path / "cluster.yaml")
    assert config.history == str(tmp_path / "history.sqlite")
    assert config.lock == str(tmp_path / "history.sqlite") + ".lock"
    assert config.policy == PRESETS["opendrs"]
    assert config.settings is None


def test_every_section_is_read(tmp_path: Path) -> None:
    config = load_config(
        _write(
            tmp_path,
            """
version: 1
cluster: prod
mode: active
backend: {type: sim, scenario: builtin:demo, days: 0.5}
history: /var/lib/opendrs/h.sqlite
lock: /run/opendrs.lock
policy: {threshold: 0.2, hold: 2, interval: 10m, cooldown: 1h}
executor: {max_parallel: 3, timeout: 30m, poll_interval: 5s}
settings: {cpu_overcommit: 2, reserve: {memory: 4GiB}}
log: {level: debug}
""",
        )
    )
    assert config.active and config.cluster == "prod"
    assert config.backend.builtin == "demo" and config.backend.days == 0.5
    assert config.history == "/var/lib/opendrs/h.sqlite" and config.lock == "/run/opendrs.lock"
    assert (config.policy.threshold, config.policy.hold, config.policy.interval) == (0.2, 2, 600)
    assert config.executor.max_parallel == 3 and config.executor.timeout == 1800
    assert config.executor.poll_interval == 5 and config.executor.cooldown == 3600
    assert config.settings is not None and config.settings.cpu_overcommit == 2
    assert config.log_level == "debug"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: {type: file}\n", "C: backend.path: required key is missing"),
        ("backend: {type: flie, path: x}\n", "C: backend.type: unknown value 'flie'"),
        ("mode: activ\nbackend: {type: sim}\n", "C: mode: unknown value 'activ'"),
        ("backend: {type: sim}\nexecutor: {timeout: 0}\n", "C: executor.timeout: must be"),
        ("backend: {type: sim}\nexecutor: {max_paralel: 2}\n", "C: executor.max_paralel"),
        ("backend: {type: sim}\nversion: 2\n", "C: version: this opendrs reads version 1"),
        ("backend: {type: sim}\nlog: {level: loud}\n", "C: log.level: expected one of"),
        ("backend: {type: sim}\nsettings: {cpu_overcommit: -1}\n", "C: settings.cpu_overcommit"),
        ("backend: {type: sim}\npolicy: {hold: x}\n", "C: policy.hold"),
        ("{}\n", "C: backend: required key is missing"),
        ("- a\n", "C: expected a mapping"),
        ("backend: [\n", "C: line"),
    ],
)
def test_problems_are_one_line_with_file_and_field(text: str, message: str) -> None:
    from opendrs.model.document import parse

    with pytest.raises(ConfigError) as info:
        parse_config(parse(text, filename="C"), filename="C")
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "nope.yaml")


def test_one_instance_per_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "x.lock")
    with InstanceLock(path):
        with pytest.raises(LockError) as info:
            InstanceLock(path).acquire()
        assert "another opendrs instance (pid " in str(info.value)
    # Released: it can be taken again.
    with InstanceLock(path):
        pass
