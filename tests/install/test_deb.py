"""``make deb``: the Debian package of each release it is built for — Debian 12 (bookworm) and
13 (trixie) — installed with apt into a clean root of that release (debootstrap, cached in
/var/cache/opendrs-test; the network only to Debian's mirror and, for the build, to PyPI), run
there — ``opendrs --version``, ``opendrs demo --fast``, ``systemd-analyze verify`` on its unit,
its man page and completion — then removed and purged: remove leaves the configuration, purge
leaves nothing but the system user. The sdist is made once; the machine's release's package is
built on the machine, the other's in a root of its release (``tools/debian-root``).

Root only (debootstrap, chroot, mount), with debootstrap and debhelper installed (``make
test-packages``, as root): skipped, with the reason, elsewhere. Several minutes per release; the
first run also makes the roots (cold). ``OPENDRS_TEST_DEBS=DIR`` tries the packages ``make
debs`` built before in ``DIR`` instead of building them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from install.commands import ROOT, index_unreachable, make_dist, run
from install.debian_root import RootUnavailable, ScratchRoot, base_root, scratch_root
from opendrs import __version__

#: The releases the package is built for, with their numbers (its version's ~debNN): Debian 12
#: (Proxmox VE 8) and 13 (Proxmox VE 9).
RELEASES = {"bookworm": "12", "trixie": "13"}
#: The package's files an operator edits: dpkg's configuration files.
CONFFILES = ("/etc/opendrs/opendrs.yaml", "/etc/logrotate.d/opendrs")
#: What purge leaves: the system user, as Debian packages do (adduser's backups of its files).
USER_FILES = {"etc/passwd-", "etc/group-", "etc/shadow-", "etc/gshadow-"}


def why_not_here() -> str | None:
    """Why the packages cannot be built and tried here, or None."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot, mount): make test runs it as root"
    for tool in ("debootstrap", "dpkg-buildpackage", "dh", "chroot", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: make test-packages installs it, as root"
    return None


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the packages are: the sdist, made once for both, and each package once built (or
    ``OPENDRS_TEST_DEBS``, with packages built before)."""
    if reason := why_not_here():
        pytest.skip(reason)
    if built := os.environ.get("OPENDRS_TEST_DEBS"):
        return Path(built)
    where = tmp_path_factory.mktemp("deb")
    if reason := index_unreachable(where / "probe"):
        pytest.skip(reason)
    make_dist(where)
    return where


def package(dist: Path, release: str) -> Path:
    """The package of ``release`` in ``dist``, built there from its sdist unless it is there."""
    pattern = f"opendrs_*~deb{RELEASES[release]}_*.deb"
    if not list(dist.glob(pattern)):
        build = [f"DIST={dist}", f"DEB_BUILD={dist / 'build'}", f"RELEASE={release}"]
        run(["make", "deb-from-sdist", *build], ROOT, timeout=3600)
    (deb,) = dist.glob(pattern)
    return deb


@pytest.fixture(scope="module", params=list(RELEASES))
def root(request: pytest.FixtureRequest, dist: Path) -> Iterator[ScratchRoot]:
    """A clean root of a release with the package's dependencies, then its package, installed by
    apt; ``before`` is its file list before the package itself, ``deb`` the package."""
    release: str = request.param
    try:
        base_root(release)
        deb = package(dist, release)
        with scratch_root(release) as scratch:
            scratch.run("apt-get", "update", "-qq")
            fields = [field(deb, name) for name in ("Depends", "Recommends")]
            needs = ", ".join(f for f in fields if f)
            scratch.run("apt-get", "satisfy", "-y", "-qq", "--no-install-recommends", needs)
            scratch.before = scratch.files()  # type: ignore[attr-defined]
            scratch.deb = deb  # type: ignore[attr-defined]
            shutil.copy(deb, scratch.path / "tmp" / deb.name)
            scratch.run("apt-get", "install", "-y", "-qq", f"/tmp/{deb.name}")
            yield scratch
    except RootUnavailable as exc:
        pytest.skip(str(exc))


def field(deb: Path, name: str) -> str:
    """A control field of the package ``deb``."""
    return run(["dpkg-deb", "--field", str(deb), name], ROOT).stdout.strip()


def test_the_installed_program_runs(root: ScratchRoot) -> None:
    assert root.run("opendrs", "--version").stdout == f"opendrs {__version__}\n"
    # Built for this release: its number in the version, its python3 in the venv.
    version = root.run("dpkg-query", "--showformat=${Version}", "--show", "opendrs").stdout
    release = root.run("sh", "-c", ". /etc/os-release && echo $VERSION_ID").stdout.strip()
    deb: Path = root.deb  # type: ignore[attr-defined]
    assert version.endswith(f"~deb{release}") and version == field(deb, "Version")
    python = "import sys; print(sys.version)"
    bundled = root.run("/opt/opendrs/bin/python", "-c", python).stdout
    assert bundled == root.run("/usr/bin/python3", "-c", python).stdout
    assert os.readlink(root.path / "usr/bin/opendrs") == "/opt/opendrs/bin/opendrs"
    demo = root.run("opendrs", "demo", "--fast")
    assert "What opendrs did over 1 simulated day of the demo cluster" in demo.stdout
    assert "0 capacity violations" in demo.stdout


def test_its_configuration_is_in_shadow_mode_and_the_unit_verifies(root: ScratchRoot) -> None:
    conffiles = root.run("dpkg-query", "--showformat=${Conffiles}", "--show", "opendrs").stdout
    assert all(path in conffiles for path in CONFFILES)
    config = (root.path / "etc/opendrs/opendrs.yaml").read_text()
    assert "\nmode: shadow\n" in config
    # The shipped file is read to its end: only the secret it names is missing (exit status 2,
    # one line), no key of it is refused.
    once = root.run(
        "opendrs", "run", "--once", "--config", "/etc/opendrs/opendrs.yaml", check=False
    )
    assert once.returncode == 2 and "proxmox.token" in once.stderr, once.stderr
    unit = (root.path / "usr/lib/systemd/system/opendrs.service").read_text()  # /lib: merged /usr
    assert "ExecStart=/usr/bin/opendrs run --config /etc/opendrs/opendrs.yaml" in unit
    assert "ProtectSystem=strict" in unit
    root.run("systemd-analyze", "verify", "opendrs.service")
    # Installed, neither enabled nor started.
    enabled = root.run("systemctl", "--root=/", "is-enabled", "opendrs.service", check=False)
    assert enabled.stdout == "disabled\n", enabled.stdout + enabled.stderr
    assert root.run("getent", "passwd", "opendrs").stdout.startswith("opendrs:")
    root.run("logrotate", "--debug", "/etc/logrotate.d/opendrs")


def test_its_man_page_and_completion(root: ScratchRoot) -> None:
    page = root.run("zcat", "/usr/share/man/man1/opendrs.1.gz").stdout
    assert ".TH OPENDRS" in page and "opendrs demo" in page and "/etc/opendrs/opendrs.yaml" in page
    complete = (
        "source /usr/share/bash-completion/completions/opendrs; "
        "COMP_WORDS=(opendrs de); COMP_CWORD=1; _shtab_opendrs; echo ${COMPREPLY[@]}; "
        "COMP_WORDS=(opendrs demo --f); COMP_CWORD=2; _shtab_opendrs; echo ${COMPREPLY[@]}"
    )
    assert root.run("bash", "-c", complete).stdout == "demo\n--fast\n"


def test_remove_keeps_the_configuration_and_purge_leaves_nothing(root: ScratchRoot) -> None:
    # Runs last (the file's order): it takes the package away.
    root.run("apt-get", "remove", "-y", "-qq", "opendrs")
    assert not (root.path / "opt/opendrs").exists()
    assert not (root.path / "usr/bin/opendrs").exists()
    assert all((root.path / path.lstrip("/")).exists() for path in CONFFILES)
    root.run("apt-get", "purge", "-y", "-qq", "opendrs")
    after = root.files()
    before: set[str] = root.before  # type: ignore[attr-defined]
    assert sorted(after - before - USER_FILES) == []
    # dpkg takes an empty /opt away with the package when no other package ships it, as it
    # does every directory it installed into; nothing else that was there goes.
    assert sorted(before - after - {"opt"}) == []
    assert root.run("getent", "passwd", "opendrs").returncode == 0
