"""The Debian packaging's files agree with the project: the package's version is the project's,
and the rotation docs/operations.md shows is the one the package installs."""

from __future__ import annotations

import re

from install.commands import ROOT
from opendrs import __version__


def test_the_packages_version_is_the_projects() -> None:
    first = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    version = re.fullmatch(r"opendrs \(([^)]+)\) \S+; urgency=\w+", first)
    assert version is not None, first
    assert version.group(1).rsplit("-", 1)[0] == __version__


def test_the_documented_rotation_is_the_installed_one() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text()
    (block,) = re.findall(r"```\n(/var/log/opendrs/.*?)```", docs, re.DOTALL)
    installed = (ROOT / "debian" / "opendrs.logrotate").read_text()
    assert block == "".join(line for line in installed.splitlines(True) if not line.startswith("#"))
