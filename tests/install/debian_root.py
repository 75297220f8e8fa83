"""Clean Debian roots for the Debian package's test: debootstrap's minimal base of a release,
with systemd (for ``systemd-analyze``), made once and kept by ``tools/debian-root``, and a throwaway
copy of it — an overlay on the cached base where the kernel allows one, else a plain copy — in
which a test installs, runs and purges the package through ``chroot``. Root only."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from install.commands import ROOT, run

#: The environment of the commands run inside a root.
INSIDE = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C.UTF-8",
    "HOME": "/root",
}
#: What apt and dpkg keep about themselves inside a root: left out of its file lists.
PACKAGE_TOOLS_STATE = (
    "var/lib/apt",
    "var/lib/dpkg",
    "var/cache/apt",
    "var/cache/debconf",
    "var/cache/ldconfig",
    "var/log/apt",
    "var/log/dpkg.log",
    "var/log/alternatives.log",
)
#: tools/debian-root's exit status when it cannot make the root (debootstrap failed: no mirror...).
CANNOT_MAKE_ROOT = 3


class RootUnavailable(Exception):
    """No clean root of the release can be made here (debootstrap failed: no mirror...)."""


def base_root(codename: str) -> Path:
    """The cached base root of release ``codename`` (``tools/debian-root base``: debootstrap
    makes it when missing, in /var/cache/opendrs-test or ``OPENDRS_TEST_CACHE``)."""
    made = subprocess.run(
        [str(ROOT / "tools" / "debian-root"), "base", codename],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if made.returncode == CANNOT_MAKE_ROOT:
        raise RootUnavailable(made.stderr.strip())
    assert made.returncode == 0, made.stderr
    return Path(made.stdout.strip())


class ScratchRoot:
    """A throwaway root at :attr:`path`, with /proc and /dev, where :meth:`run` runs commands."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``command`` inside the root; with ``check``, an exit status other than 0 fails."""
        argv = ["chroot", str(self.path), *command]
        if check:
            return run(argv, Path("/"), env=INSIDE, timeout=900)
        return subprocess.run(
            argv, env=INSIDE, capture_output=True, text=True, timeout=900, check=False
        )

    def files(self) -> set[str]:
        """Every path in the root, apt's and dpkg's own state left out."""
        skip = tuple(f"{part}/" for part in PACKAGE_TOOLS_STATE)
        found = set()
        for folder, dirs, names in os.walk(self.path):
            here = Path(folder).relative_to(self.path).as_posix()
            if here in ("proc", "dev", "sys", "tmp", "run"):
                dirs.clear()
                continue
            for name in (*dirs, *names):
                path = name if here == "." else f"{here}/{name}"
                if path not in PACKAGE_TOOLS_STATE and not path.startswith(skip):
                    found.add(path)
        return found


def _remove_unless_mounted(work: Path, root: Path) -> None:
    """Removes ``work`` unless ``root`` below it, its /proc or its /dev is still mounted: never
    the host's /dev."""
    if not any(os.path.ismount(path) for path in (root, root / "proc", root / "dev")):
        shutil.rmtree(work, ignore_errors=True)


def _mount(stack: ExitStack, args: Sequence[str], target: Path) -> None:
    subprocess.run(["mount", *args, str(target)], check=True, capture_output=True)
    stack.callback(subprocess.run, ["umount", "--lazy", str(target)], check=False)


@contextmanager
def scratch_root(codename: str) -> Iterator[ScratchRoot]:
    """A throwaway root of release ``codename`` on its cached base, removed on leaving."""
    base = base_root(codename)
    work = Path(tempfile.mkdtemp(prefix="opendrs-deb-test-"))
    with ExitStack() as stack:
        merged = work / "root"
        stack.callback(_remove_unless_mounted, work, merged)
        merged.mkdir()
        (work / "upper").mkdir()
        (work / "work").mkdir()
        layers = f"lowerdir={base},upperdir={work / 'upper'},workdir={work / 'work'}"
        try:
            _mount(stack, ["-t", "overlay", "overlay", "-o", layers], merged)
        except subprocess.CalledProcessError:
            merged.rmdir()
            subprocess.run(["cp", "-a", str(base), str(merged)], check=True)
        _mount(stack, ["-t", "proc", "proc"], merged / "proc")
        _mount(stack, ["--bind", "/dev"], merged / "dev")
        shutil.copy("/etc/resolv.conf", merged / "etc" / "resolv.conf")
        yield ScratchRoot(merged)
