"""``make dist``: the sdist and the wheel, and the wheel installed as an operator installs it —
into a fresh virtual environment outside the checkout, its dependencies from PyPI (or pip's
configured index), no PYTHONPATH — running ``opendrs --version`` and ``opendrs demo --fast``.

Skipped, with the reason, where the index cannot be reached (the dependencies come from it)."""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from install.commands import ROOT, index_unreachable, make_dist, run
from opendrs import __version__

PACKAGE = ROOT / "src" / "opendrs"


def package_data() -> set[str]:
    """The package's files that are not Python source: templates, static files, demo data."""
    return {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``make dist`` wrote the sdist and the wheel to."""
    where = tmp_path_factory.mktemp("dist")
    if reason := index_unreachable(where / "probe"):
        pytest.skip(reason)
    make_dist(where)
    return where


def test_the_wheel_and_the_sdist_hold_the_package_and_its_licence(dist: Path) -> None:
    wheel = zipfile.ZipFile(dist / f"opendrs-{__version__}-py3-none-any.whl")
    names = set(wheel.namelist())
    assert package_data() <= names, "package data missing from the wheel"
    assert {"opendrs/data/demo.yaml", "opendrs/cli/main.py"} <= names
    info = f"opendrs-{__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Apache License" in wheel.read(f"{info}/licenses/LICENSE").decode()
    with tarfile.open(dist / f"opendrs-{__version__}.tar.gz") as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    # The Debian package is built from the sdist (make deb): its packaging comes along.
    assert {
        "LICENSE",
        "debian/rules",
        "contrib/opendrs.service",
    } <= members


def test_the_wheel_runs_from_a_fresh_venv_outside_the_checkout(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    wheel = str(dist / f"opendrs-{__version__}-py3-none-any.whl")
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", wheel], tmp_path)
    where = run([python, "-c", "import opendrs; print(opendrs.__file__)"], tmp_path).stdout
    assert Path(where.strip()).is_relative_to(venv), f"opendrs imported from {where}"
    opendrs = str(venv / "bin" / "opendrs")
    assert run([opendrs, "--version"], tmp_path).stdout == f"opendrs {__version__}\n"
    demo = run([opendrs, "demo", "--fast"], tmp_path)
    assert "What opendrs did over 1 simulated day of the demo cluster" in demo.stdout
    assert "0 capacity violations" in demo.stdout
