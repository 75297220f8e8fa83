"""One test per case folder under tests/cases/: the daemon against the simulator, its log against
``decisions.expect`` (see tests/cases/README.md).

A missing expect file is written for review and the test fails. ``OPENDRS_CASES_WRITE=1``
rewrites the expect files of the cases that run instead of comparing. A case with a
``KNOWN_BUG`` file is a strict expected failure: its hand-written expect file says what opendrs
should do, and the test fails once the run matches it — delete ``KNOWN_BUG`` then.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cases.runner import (
    CASES,
    EXPECT,
    KNOWN_BUG,
    WRITE_ENV,
    case_folders,
    check,
    known_bug,
    load_case,
)
from opendrs.model.document import DocumentError


def _params() -> list[object]:
    params: list[object] = []
    for folder in case_folders():
        bug = known_bug(folder)
        # Without its expect file a known-bug case must fail for real, never as expected.
        marks = (
            [pytest.mark.xfail(reason=f"known bug: {bug}", strict=True)]
            if bug is not None and (folder / EXPECT).is_file()
            else []
        )
        params.append(pytest.param(folder, id=folder.name, marks=marks))
    return params


def test_there_are_cases() -> None:
    assert len(case_folders()) >= 8


@pytest.mark.parametrize("folder", _params())
def test_case(folder: Path) -> None:
    outcome = check(folder, write=os.environ.get(WRITE_ENV, "") not in ("", "0"))
    assert outcome.ok, outcome.message


# --------------------------------------------------------------------------------------------
# The runner itself


def _copy(case: str, to: Path) -> Path:
    folder = to / case
    folder.mkdir()
    for file in (CASES / case).iterdir():
        if file.name != EXPECT:
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


def test_a_missing_oracle_is_written_and_fails(tmp_path: Path) -> None:
    folder = _copy("anti_affinity_repair", tmp_path)
    first = check(folder)
    assert not first.ok and "was missing: written to" in first.message
    written = (folder / EXPECT).read_text(encoding="utf-8")
    assert written == (CASES / "anti_affinity_repair" / EXPECT).read_text(encoding="utf-8")
    assert check(folder).ok  # reviewed (here: the same), it passes


def test_a_difference_is_shown_as_a_diff_and_write_takes_it(tmp_path: Path) -> None:
    folder = _copy("anti_affinity_repair", tmp_path)
    (folder / EXPECT).write_text("00:00:00 nothing\n", encoding="utf-8")
    outcome = check(folder)
    assert not outcome.ok
    assert "-00:00:00 nothing" in outcome.message and "--write" in outcome.message
    assert check(folder, write=True).ok and check(folder).ok


def test_a_known_bug_keeps_its_hand_written_oracle(tmp_path: Path) -> None:
    folder = _copy("anti_affinity_repair", tmp_path)
    (folder / KNOWN_BUG).write_text("it moves 202, it should move 201\n", encoding="utf-8")
    missing = check(folder)
    assert not missing.ok and not missing.passed and not (folder / EXPECT).exists()
    (folder / EXPECT).write_text("00:00:00 what should happen\n", encoding="utf-8")
    outcome = check(folder, write=True)
    assert outcome.passed and not outcome.ok and outcome.known_bug
    assert (folder / EXPECT).read_text(encoding="utf-8") == "00:00:00 what should happen\n"


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ("events: []\n", "events.yaml: duration: required key is missing"),
        ("duration: 1h\nevents:\n  - {at: 5m, maintenance: pve9, for: 1h}\n", "unknown node"),
        ("duration: 1h\nevents:\n  - {at: 5m, maintenance: pve1}\n", "needs `for`"),
        ("duration: 1h\nevents:\n  - {at: 2h, load: 101, cpu: 1}\n", "not before the end"),
        ("duration: 1h\nevents:\n  - {at: 5m, load: 999, cpu: 1}\n", "unknown guest '999'"),
        ("duration: 1h\nevents:\n  - {at: 5m, node-failur: pve1}\n", "give exactly one of"),
        ("duration: 1h\nsed: 1\n", "sed: unknown key (did you mean 'seed'?)"),
        ("duration: 1h\nmigration: {setup: x}\n", "events.yaml: migration.setup:"),
    ],
)
def test_bad_events_are_one_line(tmp_path: Path, events: str, message: str) -> None:
    folder = _copy("anti_affinity_repair", tmp_path)
    (folder / "events.yaml").write_text(events, encoding="utf-8")
    with pytest.raises(DocumentError) as info:
        load_case(folder)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_policy_is_one_line(tmp_path: Path) -> None:
    folder = _copy("anti_affinity_repair", tmp_path)
    (folder / "policy.yaml").write_text("policy: {treshold: 0.2}\n", encoding="utf-8")
    with pytest.raises(DocumentError, match=r"policy.treshold: unknown key \(did you mean"):
        load_case(folder)
    (folder / "policy.yaml").write_text("mode: shadow\n", encoding="utf-8")
    with pytest.raises(DocumentError, match="mode: unknown key"):
        load_case(folder)


def test_load_events_become_a_trace() -> None:
    case = load_case(CASES / "flapping_load")
    assert case.scenario.trace is not None
    series = {s.guest: s for s in case.scenario.trace.series}
    assert series["101"].times[:3] == (6 * 3600.0, 7 * 3600.0, 8 * 3600.0)
    assert series["101"].cpu[:3] == (12.0, 1.0, 12.0)
    assert series["101"].memory[0] == 12 * 1024**3  # left out: the snapshot's measured use
    assert series["101"].times[-1] < 24 * 3600
