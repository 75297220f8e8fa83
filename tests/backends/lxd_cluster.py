"""A real two-member LXD 5.0 cluster on loopback, for the Incus backend's tests.

As ``shared/reference/test-peers.md`` §3 describes it: two ``lxd`` daemons (members ``lxd1`` on
127.0.0.1 and ``lxd2`` on 127.0.0.2, the same free port), each with its own ``LXD_DIR`` in a
scratch folder, clustered by preseeds that define **no network** (a bridge would probe private
subnets); a ``dir`` storage pool; image-less containers given a busybox root file system. The
proxy variables point at a closed loopback port, so that LXD's start-up fetch of instance types
fails at once instead of leaving the machine.

:meth:`LxdCluster.start` raises :class:`LxdUnavailable` (the reason to skip, one line) when the
machine cannot run it: not root, no ``lxd``/``lxc``/busybox, a daemon that does not start (the
last line of its log), a container that cannot start. :meth:`LxdCluster.close` always leaves
nothing behind — containers stopped, daemons shut down (killed by their ids if they do not go),
every process whose command line names the scratch folder (``[lxc monitor] …``) killed by its
id, mounts under the folder unmounted, the folder removed — and may be called any number of
times.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

MEMBERS: Final = ("lxd1", "lxd2")
ADDRESSES: Final = {"lxd1": "127.0.0.1", "lxd2": "127.0.0.2"}
#: A closed loopback port: what LXD fetches from the internet fails at once.
NO_PROXY_PORT: Final = "http://127.0.0.1:9"
BUSYBOX: Final = ("/bin/busybox", "/usr/bin/busybox")
#: Seconds a daemon may take to come up, and a command to answer.
START_SECONDS: Final = 20
COMMAND_SECONDS: Final = 60


class LxdUnavailable(Exception):
    """This machine cannot run the cluster: the reason, one line."""


def proxy_environment() -> dict[str, str]:
    """The environment of everything started here: proxies closed, loopback direct."""
    env = dict(os.environ)
    env.update(
        https_proxy=NO_PROXY_PORT,
        http_proxy=NO_PROXY_PORT,
        HTTPS_PROXY=NO_PROXY_PORT,
        HTTP_PROXY=NO_PROXY_PORT,
        no_proxy="127.0.0.1,127.0.0.2,localhost",
        NO_PROXY="127.0.0.1,127.0.0.2,localhost",
    )
    return env


def _free_port() -> int:
    """A TCP port free on both members' addresses."""
    for _ in range(20):
        with socket.socket() as first:
            first.bind((ADDRESSES["lxd1"], 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind((ADDRESSES["lxd2"], port))
                except OSError:
                    continue
            return port
    raise LxdUnavailable("no TCP port free on both 127.0.0.1 and 127.0.0.2")


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else "empty log"


class LxdCluster:
    """Two LXD daemons clustered on loopback, in a scratch folder of their own."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.port = 0
        self.env = proxy_environment()
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._busybox = ""

    # -- paths and commands --------------------------------------------------------------------

    def folder(self, member: str) -> Path:
        assert self.root is not None
        return self.root / member

    def socket(self, member: str) -> Path:
        return self.folder(member) / "unix.socket"

    def _run(
        self, member: str, argv: Sequence[str], *, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, LXD_DIR=str(self.folder(member)))
        result = subprocess.run(
            list(argv),
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_SECONDS,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} on {member}: exit {result.returncode}: "
                f"{(result.stderr or result.stdout).strip()}"
            )
        return result

    def lxc(self, member: str, *args: str, check: bool = True) -> str:
        """``lxc ARGS`` against ``member``'s daemon; its standard output."""
        return self._run(member, ["lxc", *args], check=check).stdout

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start both daemons and cluster them (:class:`LxdUnavailable` when it cannot be)."""
        self._check_machine()
        self.root = Path(tempfile.mkdtemp(prefix="opendrs-lxd-"))
        # The containers' mapped root must traverse it (mkdtemp makes it 0700).
        self.root.chmod(0o755)
        self.port = _free_port()
        for member in MEMBERS:
            self.start_daemon(member)
        self._bootstrap()
        self._join()
        self._probe()

    def _probe(self) -> None:
        """A container must start here (a machine without the kernel's support for them, such
        as an unprivileged container, runs the daemons but not their containers)."""
        try:
            self.create_container("opendrs-probe", "lxd1", run=True)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[-1][:300]
            raise LxdUnavailable(f"a container cannot start on this machine: {reason}") from None
        finally:
            self.lxc("lxd1", "delete", "--force", "opendrs-probe", check=False)

    def _check_machine(self) -> None:
        if os.geteuid() != 0:
            raise LxdUnavailable("the LXD cluster needs root (CI runs the tests as root)")
        missing = [tool for tool in ("lxd", "lxc") if shutil.which(tool) is None]
        if missing:
            raise LxdUnavailable(
                f"{' and '.join(missing)} not installed (Debian package lxd; "
                "tools/install-test-packages installs it as root)"
            )
        busybox = next((p for p in BUSYBOX if os.path.exists(p)), None)
        if busybox is None:
            raise LxdUnavailable("busybox not installed (Debian package busybox-static)")
        self._busybox = busybox
        try:
            grp.getgrnam("lxd")
        except KeyError:
            made = subprocess.run(["groupadd", "--system", "lxd"], capture_output=True, text=True)
            if made.returncode != 0:
                raise LxdUnavailable(
                    f"no group lxd, and groupadd failed: {made.stderr.strip()[:200]}"
                ) from None

    def log(self, member: str) -> Path:
        assert self.root is not None
        return self.root / f"{member}.log"

    def start_daemon(self, member: str) -> None:
        """Start ``member``'s daemon and wait until it is ready."""
        folder = self.folder(member)
        folder.mkdir(exist_ok=True)
        with self.log(member).open("ab") as log:
            process = subprocess.Popen(
                ["lxd", "--group", "lxd"],
                env=dict(self.env, LXD_DIR=str(folder)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._daemons[member] = process
        deadline = time.monotonic() + START_SECONDS
        while not self.socket(member).exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise LxdUnavailable(
                    f"the LXD daemon of {member} did not start: {_last_line(self.log(member))}"
                )
            time.sleep(0.1)
        ready = self._run(member, ["lxd", "waitready", f"--timeout={START_SECONDS}"], check=False)
        if ready.returncode != 0:
            raise LxdUnavailable(
                f"the LXD daemon of {member} is not ready: {_last_line(self.log(member))}"
            )

    def _preseed(self, member: str, text: str) -> None:
        result = self._run(member, ["lxd", "init", "--preseed"], stdin=text, check=False)
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise LxdUnavailable(f"lxd init --preseed on {member} failed: {reason[-1][:300]}")

    def _bootstrap(self) -> None:
        self._preseed(
            "lxd1",
            f"config:\n  core.https_address: {ADDRESSES['lxd1']}:{self.port}\n"
            "storage_pools:\n- name: default\n  driver: dir\n"
            "profiles:\n- name: default\n  devices:\n"
            "    root: {path: /, pool: default, type: disk}\n"
            "cluster:\n  server_name: lxd1\n  enabled: true\n",
        )

    def _join(self) -> None:
        token = self.lxc("lxd1", "cluster", "add", "lxd2").strip().splitlines()[-1]
        self._preseed(
            "lxd2",
            "cluster:\n  enabled: true\n  server_name: lxd2\n"
            f"  server_address: {ADDRESSES['lxd2']}:{self.port}\n"
            f"  cluster_address: {ADDRESSES['lxd1']}:{self.port}\n"
            f"  cluster_token: {token}\n"
            "  member_config:\n"
            '  - {entity: storage-pool, name: default, key: source, value: ""}\n',
        )

    # -- containers ----------------------------------------------------------------------------

    def create_container(
        self, name: str, member: str, *, cpu: int = 1, memory: str = "256MiB", run: bool = False
    ) -> None:
        """An image-less container on ``member`` with a busybox root file system that sleeps."""
        self.lxc(
            "lxd1",
            "init",
            "--empty",
            name,
            "--target",
            member,
            "-c",
            f"limits.cpu={cpu}",
            "-c",
            f"limits.memory={memory}",
        )
        rootfs = self.folder(member) / "storage-pools" / "default" / "containers" / name / "rootfs"
        for sub in ("bin", "sbin", "proc", "sys", "dev", "tmp", "etc", "root"):
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy2(self._busybox, rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep", "timeout"):
            (rootfs / "bin" / applet).symlink_to("busybox")
        init = rootfs / "sbin" / "init"
        # It ends on SIGPWR (LXD's clean stop) at once: a stop need not wait for its timeout.
        init.write_text(
            "#!/bin/sh\ntrap 'exit 0' PWR TERM INT\nwhile true; do sleep 3600 & wait $!; done\n"
        )
        init.chmod(0o755)
        if run:
            self.lxc("lxd1", "start", name)

    def query(self, path: str) -> Any:
        """``lxc query PATH`` on ``lxd1``: the API's answer, decoded."""
        return json.loads(self.lxc("lxd1", "query", path))

    def location(self, name: str) -> tuple[str, str]:
        """Where ``name`` is and its status (``Running``, ``Stopped``), as LXD says."""
        row = self.query(f"/1.0/instances/{name}")
        return str(row["location"]), str(row["status"])

    def members(self) -> dict[str, str]:
        """Each member's status (``Online``, ``Evacuated``, ``Offline``), as LXD says."""
        rows = self.query("/1.0/cluster/members?recursion=1")
        return {str(row["server_name"]): str(row["status"]) for row in rows}

    def ensure_up(self) -> None:
        """Start again the daemon of a member shut down by a test, and wait until the cluster
        sees it online."""
        for member in MEMBERS:
            if member in self._daemons:
                continue
            self.start_daemon(member)
            deadline = time.monotonic() + 60
            while self.members().get(member) != "Online":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{member} is not online again: {self.members()}")
                time.sleep(0.5)

    # -- stop ----------------------------------------------------------------------------------

    def shutdown_daemon(self, member: str) -> None:
        """Stop ``member``'s daemon cleanly (``lxd shutdown``); its containers stop with it."""
        self._run(member, ["lxd", "shutdown", "--timeout=30"], check=False)
        process = self._daemons.pop(member, None)
        if process is not None:
            _end(process)

    def close(self) -> None:
        """Leave nothing behind (see the module docstring); safe to call again."""
        if self.root is None:
            return
        for member in reversed(MEMBERS):  # lxd2 first
            if member in self._daemons and self.socket(member).exists():
                self._run(member, ["lxc", "stop", "--all", "--force"], check=False)
        for member in reversed(MEMBERS):
            if member in self._daemons:
                self.shutdown_daemon(member)
        for pid in _processes_naming(str(self.root)):
            _kill(pid)
        for mount in _mounts_under(str(self.root)):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


def leftovers(root: str) -> list[str]:
    """What a close left behind under ``root``: processes, mounts, the folder (empty: clean)."""
    found = [f"process {pid}" for pid in _processes_naming(root)]
    found += [f"mount {point}" for point in _mounts_under(root)]
    if os.path.exists(root):
        found.append(f"folder {root}")
    return found


def _end(process: subprocess.Popen[bytes]) -> None:
    """Wait for a daemon to go; SIGTERM, then SIGKILL after ~10 s."""
    for sig, seconds in ((None, 5.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if sig is not None and process.poll() is None:
            process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(seconds)
            return


def _processes_naming(text: str) -> Iterator[int]:
    """Ids of the processes whose command line contains ``text``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            yield int(entry.name)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def _mounts_under(root: str) -> list[str]:
    """Mount points under ``root``, deepest first."""
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            point = line.split()[1].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)
