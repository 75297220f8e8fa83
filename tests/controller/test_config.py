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
backend: {type: sim, scenario: builtin:demo, days: 0.5, speed: 60}
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
    assert config.backend.speed == 60
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
        ("backend: {type: sim, speed: 0}\n", "C: backend.speed: must be greater than 0"),
        ("backend: {type: sim, speed: fast}\n", "C: backend.speed"),
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


# --------------------------------------------------------------------------------------------
# Configuration that validates also runs: every value out of range is refused up front.

_SNAPSHOT = (
    "version: 1\n"
    "nodes: {a: {cpu: 8, memory: 16GiB}, b: {cpu: 8, memory: 16GiB}}\n"
    "guests:\n"
    "  - {id: 101, node: a, cpu: 2, memory: 2GiB, usage: {cpu: 1, memory: 1GiB}}\n"
)

OUT_OF_RANGE = [
    ("cluster: 'prod '", "cluster", "surrounding blanks"),
    ("cluster: ' prod'", "cluster", "surrounding blanks"),
    (f"cluster: {'x' * 300}", "cluster", "at most 255 characters"),
    ("executor: {timeout: 100000000d}", "executor.timeout", "at most 7d"),
    ("executor: {poll_interval: 100000000d}", "executor.poll_interval", "at most 1h"),
    ("executor: {poll_interval: 0}", "executor.poll_interval", "at least 1s"),
    ("executor: {avoid_after_failure: 100000000d}", "executor.avoid_after_failure", "365d"),
    ("policy: {name: 'mine '}", "policy.name", "surrounding blanks"),
    ("policy: {interval: 100000000d}", "policy.interval", "at most 7d"),
    ("policy: {interval: 0}", "policy.interval", "at least 1 second"),
    ("policy: {cooldown: 100000000d}", "policy.cooldown", "at most 365d"),
    ("policy: {no_return: 100000000d}", "policy.no_return", "at most 365d"),
    ("policy: {min_uptime: 100000000d}", "policy.min_uptime", "at most 365d"),
    ("policy: {smoothing: 100000000d}", "policy.smoothing", "at most 30d"),
    ("policy: {avoid_after_failure: 100000000d}", "policy.avoid_after_failure", "365d"),
    ("policy: {interval: 1s, smoothing: 1d}", "policy.smoothing", "observations"),
    ("policy: {hold: 1000000}", "policy.hold", "between 0 and 10000"),
    ("policy: {batch: 10000000}", "policy.batch", "between 0 and 100000"),
    ("policy: {max_parallel: 1000000}", "policy.max_parallel", "between 1 and 100000"),
    ("policy: {threshold: 15}", "policy.threshold", "did you mean 15 %? (write 15% or 0.15)"),
    ("policy: {threshold: '1e300%'}", "policy.threshold", "not be more than 10000%"),
    ("policy: {threshold: '10001%'}", "policy.threshold", "not be more than 10000%"),
    ("policy: {target: 1.0e+15}", "policy.target", "a fraction from 0 to 1 or a percentage"),
    ("policy: {margin: 2}", "policy.margin", "did you mean 2 %?"),
    ("policy: {margin: '101%'}", "policy.margin", "not be more than 100%"),
    ("policy: {hot: 85}", "policy.hot", "did you mean 85 %?"),
    ("policy: {options: {target_spread: 5}}", "policy.options.target_spread", "did you mean 5 %"),
    ("policy: {options: {wide: 0}}", "policy.options.wide", "wide"),
    ("policy: {options: {max_moves: -1}}", "policy.options.max_moves", "max_moves"),
    ("policy: {options: {max_moves: 1, wide: -1}}", "policy.options.wide", "wide"),
    (
        "policy: {options: {wide: 100000000000000000000}}",
        "policy.options.wide",
        "at most 2147483647",
    ),
    (
        "policy: {strategy: optimal, options: {w_balance: abc}}",
        "policy.options.w_balance",
        "strategy optimal: ",
    ),
    (
        "policy: {strategy: optimal, options: {time_limit: 1.0e+300}}",
        "policy.options.time_limit",
        "at most 1e+15",
    ),
    ("settings: {cpu_overcommit: 1.0e+6}", "settings.cpu_overcommit", "more than 1000"),
    ("settings: {memory_overcommit: 1.0e+6}", "settings.memory_overcommit", "more than 1000"),
    ("settings: {weights: {cpu: 1.0e+12}}", "settings.weights.cpu", "more than 1000"),
    ("settings: {min_uptime: 100000000d}", "settings.min_uptime", "at most 365d"),
    ("settings: {reserve: {cpu: 1.0e+9}}", "settings.reserve.cpu", "more than 100000"),
    ("settings: {reserve: {memory: 100PiB}}", "settings.reserve.memory", "8 PiB"),
    (
        "settings: {migration: {cost_disk_factor: 1.0e+9}}",
        "settings.migration.cost_disk_factor",
        "more than 1000",
    ),
    ("settings: {migration: {cost_unit: 1}}", "settings.migration.cost_unit", "at least 1MiB"),
]


def _config(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "cluster.yaml").write_text(_SNAPSHOT)
    return _write(tmp_path, f"backend: {{type: file, path: cluster.yaml}}\n{extra}\n")


@pytest.mark.parametrize(("extra", "field", "reason"), OUT_OF_RANGE, ids=lambda v: str(v)[:40])
def test_out_of_range_values_are_refused_by_run_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, field: str, reason: str
) -> None:
    from opendrs.cli.main import main

    path = _config(tmp_path, extra)
    code = main(["run", "--config", str(path), "--once"])
    _out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith(f"error: {path}: {field}: ") and err.count("\n") == 1, err
    assert reason in err
    assert not (tmp_path / "history.sqlite").exists()


def test_in_range_values_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from opendrs.cli.main import main

    path = _config(
        tmp_path,
        "cluster: prod\n"
        "policy: {interval: 7d, cooldown: 365d, smoothing: 30d, hold: 10000, margin: 1,"
        " metric: cv, threshold: '10000%', name: mine}\n"
        "executor: {timeout: 7d, poll_interval: 1h}\n"
        "settings: {cpu_overcommit: 1000, min_uptime: 365d, reserve: {cpu: 1}}\n",
    )
    code = main(["run", "--config", str(path), "--once"])
    _out, err = capsys.readouterr()
    assert code == 0, err


def test_out_of_range_values_are_refused_as_a_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    for extra, field in (
        ("executor: {timeout: 100000000d}", "executor.timeout"),
        ("cluster: 'prod '", "cluster"),
    ):
        path = _config(tmp_path, extra)
        proc = subprocess.run(
            [sys.executable, "-m", "opendrs", "run", "--config", str(path), "--once"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"error: {path}: {field}: ")
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
