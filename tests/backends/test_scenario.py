"""The simulator's scenario format: opendrs.backends.scenario."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendrs.backends import simgen
from opendrs.backends.scenario import (
    Fault,
    MigrationModel,
    Scenario,
    builtin_scenario,
    load_scenario,
    loads_scenario,
)
from opendrs.backends.workload import (
    Diurnal,
    Pattern,
    Ramp,
    Selector,
    Spikes,
    Surge,
    TraceSeries,
    Walk,
    Weekly,
)
from opendrs.engine.usage import CapacityModel, LoadModel
from opendrs.model.document import DocumentError
from opendrs.model.snapshot import loads

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "scenarios.md"
EXAMPLES = ROOT / "examples" / "scenarios"
GiB = 1024**3

SNAPSHOT = """\
version: 1
nodes:
  pve1: {cpu: 16, memory: 64GiB}
  pve2: {cpu: 16, memory: 64GiB}
  pve3: {cpu: 8, memory: 32GiB}
guests:
  - {id: 101, name: web1, node: pve1, cpu: 2, memory: 4GiB, tags: [web], ha: true}
  - {id: 102, name: web2, node: pve1, cpu: 2, memory: 4GiB, tags: [web]}
  - {id: 103, name: db, node: pve2, cpu: 4, memory: 16GiB, usage: {cpu: 1, memory: 8GiB}}
"""


def write(tmp_path: Path, scenario: str, trace: str | None = None) -> Path:
    (tmp_path / "cluster.yaml").write_text(SNAPSHOT)
    if trace is not None:
        (tmp_path / "trace.csv").write_text(trace)
    path = tmp_path / "scenario.yaml"
    path.write_text(scenario)
    return path


def fails(tmp_path: Path, scenario: str, trace: str | None = None) -> str:
    path = write(tmp_path, scenario, trace)
    with pytest.raises(DocumentError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------------------------
# Reading


def test_minimal_scenario_has_the_documented_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, "version: 1\ncluster: cluster.yaml\n"))
    assert scenario.name == "scenario"  # the file stem
    assert scenario.seed == 0
    assert scenario.step == 60.0
    assert scenario.duration == 86400.0
    assert scenario.recovery_delay == 120.0
    assert scenario.migration == MigrationModel(bandwidth=float(GiB), setup=10.0, failure_rate=0.0)
    assert scenario.workloads == () and scenario.trace is None and scenario.faults == ()
    assert [g.id for g in scenario.cluster.guests] == ["101", "102", "103"]
    assert scenario.patterns() == [(None, None)] * 3


def test_every_key_is_read(tmp_path: Path) -> None:
    text = """\
version: 1
name: full
cluster: cluster.yaml
seed: 42
step: 30s
duration: 2d 12h
recovery_delay: 5m
migration: {bandwidth: 512MiB/s, setup: 15s, failure_rate: 0.05}
workloads:
  - guests: [103]
    cpu: {walk: {mean: 0.3, volatility: 0.1, half_life: 2h, min: 0.1, max: 0.6}, noise: 0.02}
    memory: {ramp: {from: 0.2, to: 0.8, at: 1d, over: 12h}}
  - match: "web*"
    cpu: {constant: 0.4, diurnal: {amplitude: 0.2, peak: 9.5}, weekly: {weekend: 0.5}}
    memory: 0.5
  - tag: web
    cpu:
      spikes: {rate: 3, height: 0.5, duration: 15m}
      surges: [{at: 1d, height: 0.4, last: 2h, rise: 30m}]
  - memory: {weekly: {weekday: 1.2}}
trace: trace.csv
faults:
  - {type: node-failure, node: pve3, at: 1d 2h, duration: 4h}
  - {type: node-failure, at: 2d, node: pve2}
  - {type: node-failure, per_day: 0.5, duration: 1h, nodes: [pve1, pve2]}
  - {type: maintenance, node: pve1, at: 10h, duration: 2h}
  - {type: maintenance, per_day: 1, duration: 30m}
  - {type: migration-failure, at: 1h, guest: 101}
  - {type: migration-failure, at: 2h}
  - {type: api-error, at: 3h, duration: 10m}
  - {type: api-error, per_day: 2, duration: 1m}
  - {type: api-error, probability: 0.01}
  - {type: migration-hang, at: 4h, guest: 102}
  - {type: migration-hang, probability: 0.05}
  - {type: api-lost-answer, at: 5h}
  - {type: api-lost-answer, probability: 0.1, guest: 103}
"""
    trace = "time,guest,cpu,memory\n0,103,1.5,8GiB\n1h,103,2.5,9GiB\n30m,102,0.5,1024\n"
    scenario = load_scenario(write(tmp_path, text, trace))
    assert (scenario.name, scenario.seed, scenario.step, scenario.duration) == (
        "full",
        42,
        30.0,
        2.5 * 86400,
    )
    assert scenario.recovery_delay == 300.0
    assert scenario.migration == MigrationModel(512 * 1024**2, 15.0, 0.05)
    w = scenario.workloads
    assert w[0].selector == Selector(guests=("103",))
    assert w[0].cpu == Pattern(walk=Walk(0.3, 0.1, 7200.0, 0.1, 0.6), noise=0.02)
    assert w[0].memory == Pattern(ramp=Ramp(to=0.8, over=43200.0, start=0.2, begin=86400.0))
    assert w[1].selector == Selector(match="web*")
    assert w[1].cpu == Pattern(
        constant=0.4, diurnal=Diurnal(0.2, 9.5), weekly=Weekly(weekday=1.0, weekend=0.5)
    )
    assert w[1].memory == Pattern(constant=0.5)
    surge = Surge(at=86400.0, height=0.4, last=7200.0, rise=1800.0)
    assert w[2].cpu == Pattern(spikes=Spikes(3.0, 0.5, 900.0), surges=(surge,))
    assert w[2].memory is None
    assert w[3].selector == Selector() and w[3].cpu is None
    assert w[3].memory == Pattern(weekly=Weekly(weekday=1.2, weekend=1.0))
    assert scenario.trace is not None
    assert scenario.trace.series == (
        TraceSeries("102", (1800.0,), (0.5,), (1024,)),
        TraceSeries("103", (0.0, 3600.0), (1.5, 2.5), (8 * GiB, 9 * GiB)),
    )
    assert scenario.faults == (
        Fault("node-failure", at=93600.0, node="pve3", duration=14400.0),
        Fault("node-failure", at=172800.0, node="pve2"),
        Fault("node-failure", per_day=0.5, duration=3600.0, nodes=("pve1", "pve2")),
        Fault("maintenance", at=36000.0, node="pve1", duration=7200.0),
        Fault("maintenance", per_day=1.0, duration=1800.0),
        Fault("migration-failure", at=3600.0, guest="101"),
        Fault("migration-failure", at=7200.0),
        Fault("api-error", at=10800.0, duration=600.0),
        Fault("api-error", per_day=2.0, duration=60.0),
        Fault("api-error", probability=0.01),
        Fault("migration-hang", at=14400.0, guest="102"),
        Fault("migration-hang", probability=0.05),
        Fault("api-lost-answer", at=18000.0),
        Fault("api-lost-answer", probability=0.1, guest="103"),
    )


def test_first_matching_workload_wins(tmp_path: Path) -> None:
    text = """\
version: 1
cluster: cluster.yaml
workloads:
  - {guests: [102], cpu: 0.1}
  - {tag: web, cpu: 0.2, memory: 0.3}
  - {match: "1*", memory: 0.9}
"""
    scenario = load_scenario(write(tmp_path, text))
    cpu = [c.constant if c else None for c, _ in scenario.patterns()]
    memory = [m.constant if m else None for _, m in scenario.patterns()]
    assert cpu == [0.2, 0.1, None]
    assert memory == [0.3, None, 0.9]


def test_glob_matches_id_or_name(tmp_path: Path) -> None:
    scenario = load_scenario(
        write(tmp_path, "version: 1\ncluster: cluster.yaml\nworkloads: [{match: db, cpu: 1}]\n")
    )
    assert [c is not None for c, _ in scenario.patterns()] == [False, False, True]
    assert Selector(match="10[12]").matches(scenario.cluster.guests[1])


def test_bandwidth_units(tmp_path: Path) -> None:
    for text, expected in (
        ("1GiB/s", GiB),
        ("100MB/s", 100 * 10**6),
        ("2G", 2 * GiB),
        ("5B/s", 5),
        (2**20, 2**20),
    ):
        body = f"version: 1\ncluster: cluster.yaml\nmigration: {{bandwidth: {text}}}\n"
        assert load_scenario(write(tmp_path, body)).migration.bandwidth == expected


def test_json_scenario(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(SNAPSHOT)
    path = tmp_path / "s.json"
    path.write_text('{"version": 1, "cluster": "cluster.yaml", "seed": 3, "step": "2m"}')
    scenario = load_scenario(path)
    assert (scenario.name, scenario.seed, scenario.step) == ("s", 3, 120.0)


def test_loads_scenario_with_a_given_cluster() -> None:
    cluster = loads(SNAPSHOT)
    scenario = loads_scenario("version: 1\nseed: 9\n", cluster=cluster)
    assert scenario.cluster is cluster and scenario.seed == 9


def test_scenario_checks_its_own_values() -> None:
    cluster = loads(SNAPSHOT)
    with pytest.raises(ValueError, match="step"):
        Scenario(cluster, step=0)
    with pytest.raises(ValueError, match="duration"):
        Scenario(cluster, duration=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        Scenario(cluster, migration=MigrationModel(bandwidth=0))


# --------------------------------------------------------------------------------------------
# Errors: one line, FILE: PATH: REASON

BAD = [
    ("sead: 1", "sead: unknown key (did you mean 'seed'?)"),
    ("seed: x", "seed: expected a whole number, got 'x'"),
    ("seed: -1", "seed: must be between 0 and"),
    ("step: 5 parsecs", "step: cannot read '5 parsecs' as a duration"),
    ("step: 0", "step: must be longer than 0 seconds, got 0"),
    ("duration: true", "duration: expected a duration"),
    ("migration: {bandwith: 1GiB}", "migration.bandwith: unknown key (did you mean 'bandwidth'?)"),
    ("migration: {bandwidth: 0}", "migration.bandwidth: must be greater than 0"),
    ("migration: {bandwidth: fast}", "migration.bandwidth: cannot read 'fast' as a size"),
    ("migration: {failure_rate: 2}", "migration.failure_rate: 2 as a fraction is 200 %: did you"),
    ("migration: {failure_rate: '101%'}", "migration.failure_rate: must not be more than 100%"),
    ("workloads: {tag: web}", "workloads: expected a list, got a mapping"),
    ("workloads: [{tag: web}]", "workloads[0]: a workload needs `cpu`, `memory` or both"),
    ("workloads: [{tag: nope, cpu: 1}]", "workloads[0].tag: 'nope' matches no guest tag"),
    ("workloads: [{match: 'x*', cpu: 1}]", "workloads[0].match: 'x*' matches no guest id or name"),
    ("workloads: [{guests: [101, 999], cpu: 1}]", "workloads[0].guests[1]: unknown guest '999'"),
    ("workloads: [{guests: [101, 101], cpu: 1}]", "workloads[0].guests[1]: guest '101' is listed"),
    ("workloads: [{tag: web, match: x, cpu: 1}]", "workloads[0].tag: give only one of"),
    ("workloads: [{tag: web, cpu: 1.5}]", "workloads[0].cpu: 1.5 is more than 1 (100 %)"),
    ("workloads: [{tag: web, cpu: 75}]", "workloads[0].cpu: 75 as a fraction is 7500 %: did you"),
    ("workloads: [{tag: web, cpu: high}]", "workloads[0].cpu: cannot read 'high' as a fraction"),
    ("workloads: [{tag: web, cpu: [1]}]", "workloads[0].cpu: expected a fraction (0–1) or a"),
    (
        "workloads: [{tag: web, cpu: {diurnall: {amplitude: 0.1}}}]",
        "workloads[0].cpu.diurnall: unknown key (did you mean 'diurnal'?)",
    ),
    (
        "workloads: [{tag: web, cpu: {constant: 0.1, walk: {}}}]",
        "workloads[0].cpu.walk: give only one of constant, walk, ramp (also constant)",
    ),
    (
        "workloads: [{tag: web, cpu: {walk: {min: 0.5, max: 0.2}}}]",
        "workloads[0].cpu.walk.max: must not be less than min (0.5)",
    ),
    (
        "workloads: [{tag: web, cpu: {ramp: {to: 0.5}}}]",
        "workloads[0].cpu.ramp.over: required key is missing",
    ),
    (
        "workloads: [{tag: web, cpu: {diurnal: {amplitude: 0.1, peak: 25}}}]",
        "workloads[0].cpu.diurnal.peak: must not be more than 24",
    ),
    (
        "workloads: [{tag: web, cpu: {spikes: {rate: 0, height: 0.1}}}]",
        "workloads[0].cpu.spikes.rate: must be greater than 0",
    ),
    ("workloads: [{tag: web, cpu: {}}]", "workloads[0].cpu: expected at least one of"),
    (
        "workloads: [{tag: web, cpu: {surges: [{at: 1h, height: 0.5}]}}]",
        "workloads[0].cpu.surges[0].last: required key is missing",
    ),
    (
        "workloads: [{tag: web, cpu: {surges: {at: 1h}}}]",
        "workloads[0].cpu.surges: expected a list, got",
    ),
    ("faults: [{type: node-failur, node: pve1, at: 1h}]", "did you mean 'node-failure'?"),
    ("faults: [{type: node-failure, node: pve4, at: 1h}]", "faults[0].node: unknown node 'pve4'"),
    ("faults: [{type: node-failure, at: 1h}]", "faults[0].node: required key is missing"),
    ("faults: [{type: node-failure, node: pve1}]", "faults[0]: say when: at or per_day"),
    ("faults: [{type: node-failure, node: pve1, at: soon}]", "faults[0].at: cannot read 'soon'"),
    (
        "faults: [{type: node-failure, node: pve1, at: 1h, per_day: 1}]",
        "faults[0].per_day: give only one of at, per_day, probability (also at)",
    ),
    (
        "faults: [{type: node-failure, nodes: [pve1, pve9], per_day: 1}]",
        "faults[0].nodes[1]: unknown node 'pve9'",
    ),
    ("faults: [{type: maintenance, node: pve1, at: 1h}]", "faults[0].duration: required key is"),
    (
        "faults: [{type: migration-failure, at: 1h, guest: 999}]",
        "faults[0].guest: unknown guest '999'",
    ),
    (
        "faults: [{type: migration-failure, probability: 0.1}]",
        "faults[0].probability: random migration failures are set with migration.failure_rate",
    ),
    (
        "faults: [{type: api-error, at: 1h, duration: 1m, guest: 101}]",
        "faults[0].guest: unknown key (expected one of type, at, duration, per_day, probability) "
        "for an api-error fault",
    ),
    (
        "faults: [{type: api-error, probability: 0.1, duration: 1m}]",
        "faults[0].duration: a per-call probability has no duration",
    ),
    ("faults: [{type: api-error, probability: 1.5}]", "faults[0].probability: must not be more"),
    ("faults: [{type: migration-hang}]", "faults[0]: say when: at or probability is required"),
    (
        "faults: [{type: migration-hang, per_day: 1}]",
        "faults[0].per_day: unknown key (expected one of type, at, guest, probability) for a "
        "migration-hang fault",
    ),
    (
        "faults: [{type: migration-hang, at: 1h, probability: 0.5}]",
        "faults[0].probability: give only one of at, per_day, probability (also at)",
    ),
    ("faults: [{type: migration-hang, probability: 0}]", "faults[0].probability: must be greater"),
    (
        "faults: [{type: api-lost-answer, at: 1h, guest: 999}]",
        "faults[0].guest: unknown guest '999'",
    ),
    (
        "faults: [{type: api-lost-answer, probability: 0.1, duration: 1m}]",
        "faults[0].duration: unknown key (expected one of type, at, guest, probability) for an "
        "api-lost-answer fault",
    ),
    ("faults: [{type: api-lost-answr, at: 1h}]", "did you mean 'api-lost-answer'?"),
    ("version: 2", "version: unsupported version 2"),
]


@pytest.mark.parametrize(("line", "expected"), BAD)
def test_bad_scenarios_give_one_line(tmp_path: Path, line: str, expected: str) -> None:
    body = "version: 1\ncluster: cluster.yaml\n" if not line.startswith("version") else ""
    body += line + "\n" + ("cluster: cluster.yaml\n" if line.startswith("version") else "")
    message = fails(tmp_path, body)
    assert message.startswith(f"{tmp_path / 'scenario.yaml'}: ")
    assert expected in message, message


def test_missing_and_broken_files(tmp_path: Path) -> None:
    message = fails(tmp_path, "version: 1\n")
    assert message == f"{tmp_path / 'scenario.yaml'}: cluster: required key is missing"
    message = fails(tmp_path, "version: 1\ncluster: nowhere.yaml\n")
    assert message.startswith(
        f"{tmp_path / 'scenario.yaml'}: cluster: {tmp_path / 'nowhere.yaml'}: cannot read the file"
    )
    (tmp_path / "bad.yaml").write_text("version: 1\nnodes: {pve1: {cpu: lots, memory: 1GiB}}\n")
    message = fails(tmp_path, "version: 1\ncluster: bad.yaml\n")
    assert message.startswith(f"{tmp_path / 'bad.yaml'}: nodes.pve1.cpu: expected a number")
    message = fails(tmp_path, "version: 1\ncluster: [a\n")
    assert re.match(rf"{re.escape(str(tmp_path / 'scenario.yaml'))}: line \d+, column \d+", message)
    message = fails(tmp_path, "")
    assert message.endswith("the scenario is empty (it needs at least `version: 1` and `cluster`)")


TRACE_BAD = [
    ("time,guest,cpu\n", "line 1: missing column 'memory'"),
    ("time,guest,cpus,memory\n", "line 1: unknown column 'cpus' (did you mean 'cpu'?)"),
    ("time,guest,cpu,memory\n0,999,1,1GiB\n", "line 2, guest: unknown guest '999'"),
    ("time,guest,cpu,memory\n0,101,lots,1GiB\n", "line 2, cpu: expected a number of cores"),
    ("time,guest,cpu,memory\n0,101,-1,1GiB\n", "line 2, cpu: expected a finite number of cores"),
    ("time,guest,cpu,memory\n0,101,1,1 parsec\n", "line 2, memory: unknown size unit 'parsec'"),
    ("time,guest,cpu,memory\nlater,101,1,1GiB\n", "line 2, time: cannot read 'later'"),
    ("time,guest,cpu,memory\n0,101,1\n", "line 2: expected 4 fields, got 3"),
    ("time,guest,cpu,memory\n1m,101,1,1G\n60,101,2,1G\n", "line 3: a second sample for guest"),
    ("# only a comment\n", "the trace is empty"),
]


@pytest.mark.parametrize(("trace", "expected"), TRACE_BAD)
def test_bad_traces_give_one_line(tmp_path: Path, trace: str, expected: str) -> None:
    message = fails(tmp_path, "version: 1\ncluster: cluster.yaml\ntrace: trace.csv\n", trace)
    assert message.startswith(f"{tmp_path / 'trace.csv'}: ")
    assert expected in message, message


def test_trace_samples_are_sorted_by_time(tmp_path: Path) -> None:
    trace = "# comment\ntime,guest,cpu,memory\n2h,101,1,1G\n\n0,101,0.5,512M\n1h,101,2,2G\n"
    scenario = load_scenario(
        write(tmp_path, "version: 1\ncluster: cluster.yaml\ntrace: trace.csv\n", trace)
    )
    assert scenario.trace is not None
    (series,) = scenario.trace.series
    assert series.times == (0.0, 3600.0, 7200.0)
    assert series.cpu == (0.5, 2.0, 1.0)
    assert series.memory == (512 * 1024**2, 2 * GiB, GiB)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
KEYS = ["seed", "step", "duration", "migration", "workloads", "trace", "faults", "recovery_delay"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4))
def test_any_document_gives_a_scenario_or_one_line(extra: dict[str, object]) -> None:
    cluster = loads(SNAPSHOT)
    document = {"version": 1, **extra}
    try:
        loads_scenario(json.dumps(document), filename="s.yaml", cluster=cluster)
    except DocumentError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("s.yaml: ")
        assert "internal error" not in str(exc)


# --------------------------------------------------------------------------------------------
# Built-in scenarios and examples


def test_builtin_month_scenario() -> None:
    scenario = builtin_scenario("month")
    cluster = scenario.cluster
    assert (scenario.name, scenario.duration, scenario.step) == ("month", 30 * 86400.0, 60.0)
    assert len(cluster.nodes) == 16 and len(cluster.guests) == 400
    assert all(g.kind == "vm" for g in cluster.guests)
    assert sum(g.ha for g in cluster.guests) >= 350
    assert len({g.memory for g in cluster.guests}) >= 5  # a mix of sizes
    assert scenario.migration.failure_rate == 0.02
    types = [f.type for f in scenario.faults]
    assert types.count("node-failure") == 1 and types.count("maintenance") == 1
    assert types.count("api-error") == 2
    failure = next(f for f in scenario.faults if f.type == "node-failure")
    assert failure.duration is not None and 3600 <= failure.duration <= 6 * 3600
    # Every guest has a workload; unbalanced at the start, but within capacity.
    assert all(w is not None for w in map(scenario.workload_of, cluster.guests))
    fractions = LoadModel.build(cluster).fractions()
    assert (fractions.max(axis=0) - fractions.min(axis=0)).max() > 0.3
    capacity = CapacityModel.build(cluster)
    assert not capacity.over(capacity.committed()).any()
    # Spread evenly, the busiest moment fits with a node down (checked over the whole month in
    # test_sim's balanced run).
    assert sum(g.memory for g in cluster.guests) < 0.7 * sum(n.memory for n in cluster.nodes)


def test_builtin_demo_scenario() -> None:
    scenario = builtin_scenario("demo")
    assert len(scenario.cluster.nodes) == 8 and len(scenario.cluster.guests) == 80
    assert scenario.duration == 86400.0
    fractions = LoadModel.build(scenario.cluster).fractions()
    assert (fractions.max(axis=0) - fractions.min(axis=0)).max() > 0.3


def test_unknown_builtin_scenario() -> None:
    with pytest.raises(DocumentError, match=r"^mnth\.yaml: no built-in scenario 'mnth' \(did you"):
        builtin_scenario("mnth")


@pytest.mark.parametrize("filename", sorted(simgen.OUTPUTS))
def test_shipped_snapshots_are_what_the_generator_makes(filename: str) -> None:
    shipped = (resources.files("opendrs") / "data" / "scenarios" / filename).read_text("utf-8")
    assert shipped == simgen.render(filename), "run: python -m opendrs.backends.simgen"


def test_generator_writes_its_files(tmp_path: Path) -> None:
    assert simgen.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(simgen.OUTPUTS)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.cluster.guests
    if path.name == "small-week.yaml":
        assert scenario.trace is not None  # the example shows a trace
    if path.name == "incus-week.yaml":
        assert scenario.platform == "incus" and scenario.server_config
        assert {n.arch for n in scenario.cluster.nodes} == {"x86_64", "aarch64"}
        assert {g.kind for g in scenario.cluster.guests} == {"vm", "ct"}


def _doc_blocks() -> list[str]:
    text = DOCS.read_text("utf-8")
    return [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "version: 1" in b]


def test_docs_examples_are_valid() -> None:
    blocks = _doc_blocks()
    assert len(blocks) >= 3
    cluster = loads((ROOT / "examples" / "small.yaml").read_text("utf-8"))
    for block in blocks:
        trace = "time,guest,cpu,memory\n0,103,1,1GiB\n"

        def opener(name: str, where: object, trace: str = trace) -> tuple[str, bytes]:
            return name, trace.encode()

        scenario = loads_scenario(block, filename="doc.yaml", cluster=cluster, opener=opener)
        assert scenario.cluster is cluster


def test_docs_mention_every_key() -> None:
    from opendrs.backends import scenario as module

    text = DOCS.read_text("utf-8")
    keys = (
        module._TOP_KEYS
        + module._MIGRATION_KEYS
        + module._WORKLOAD_KEYS
        + module._PATTERN_KEYS
        + module._WALK_KEYS
        + module._RAMP_KEYS
        + module._DIURNAL_KEYS
        + module._WEEKLY_KEYS
        + module._SPIKE_KEYS
        + tuple(k for keys in module._FAULT_KEYS.values() for k in keys)
        + module.FAULT_TYPES
    )
    missing = sorted({k for k in keys if f"`{k}`" not in text})
    assert not missing, missing
