"""A real two-member cluster on loopback — LXD 5.0 or Incus 6.0 LTS — for the Incus backend's
tests.

As ``shared/reference/test-peers.md`` §3 describes it for LXD, and the same for Incus: two
daemons (members ``lxd1``/``incus1`` on 127.0.0.1 and ``lxd2``/``incus2`` on 127.0.0.2, the same
free port), each with its own ``LXD_DIR``/``INCUS_DIR`` in a scratch folder, clustered by
preseeds that define **no network** (a bridge would probe private subnets); a ``dir`` storage
pool; image-less containers given a busybox root file system. The proxy variables point at a
closed loopback port, so that the daemons' start-up fetch of instance types fails at once instead
of leaving the machine.

Where ``/dev/kvm`` is usable and QEMU and SeaBIOS are installed, the LXD cluster can also run a
small virtual machine (:meth:`RealCluster.create_vm`): this host's KVM has no ``vhost_vsock`` and
caps locked memory, so the daemons get a ``modprobe`` that does nothing first in their ``PATH``
and an ``LXD_EXEC_PATH`` wrapper that drops the ``limit=memlock:unlimited:unlimited`` argument of
``forklimits``; the VM has no vsock device, boots SeaBIOS (and no disk: it idles in the BIOS),
and has ``migration.stateful=true``. :attr:`RealCluster.vm_unavailable` says why not otherwise.

:meth:`RealCluster.start` raises :class:`ClusterUnavailable` (the reason to skip, one line) when
the machine cannot run it: not root, the packages missing, a daemon that does not start (the last
line of its log), a container that cannot start. :meth:`RealCluster.close` always leaves nothing
behind — instances stopped, daemons shut down (killed by their ids if they do not go), every
process whose command line or environment names the scratch folder (``[lxc monitor] …``, QEMU,
a daemon's ``INCUS_DIR``) killed by its id, mounts under the folder unmounted, the folder
removed — and may be called any number of times; it is also registered with :mod:`atexit`. A
run that was killed outright leaves its folder: the next start cleans every such folder whose
owning process is gone (:func:`clean_aborted_runs`).
"""

from __future__ import annotations

import atexit
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ADDRESSES: Final = ("127.0.0.1", "127.0.0.2")
#: A closed loopback port: what the daemons fetch from the internet fails at once.
NO_PROXY_PORT: Final = "http://127.0.0.1:9"
BUSYBOX: Final = ("/bin/busybox", "/usr/bin/busybox")
SEABIOS: Final = "/usr/share/seabios/bios.bin"
#: Seconds a daemon may take to come up, and a command to answer.
START_SECONDS: Final = 20
COMMAND_SECONDS: Final = 120
#: The scratch folders' prefix, and the file in each naming the process that owns it.
PREFIX: Final = "opendrs-cluster-"
OWNER: Final = "owner.pid"


@dataclass(frozen=True, slots=True)
class Flavour:
    """How one server is run: its daemon, client, admin commands, folder variable and group."""

    name: str
    daemon: tuple[str, ...]
    client: str
    admin: tuple[str, ...]
    folder_variable: str
    group: str
    package: str

    @property
    def members(self) -> tuple[str, str]:
        return (f"{self.name}1", f"{self.name}2")


LXD: Final = Flavour(
    name="lxd",
    daemon=("lxd", "--group", "lxd"),
    client="lxc",
    admin=("lxd",),
    folder_variable="LXD_DIR",
    group="lxd",
    package="Debian package lxd",
)
INCUS: Final = Flavour(
    name="incus",
    daemon=("/usr/libexec/incus/incusd", "--group", "incus-admin"),
    client="incus",
    admin=("incus", "admin"),
    folder_variable="INCUS_DIR",
    group="incus-admin",
    package="Debian package incus-base, Incus 6.0 LTS from bookworm-backports",
)
FLAVOURS: Final = {flavour.name: flavour for flavour in (LXD, INCUS)}


class ClusterUnavailable(Exception):
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
            first.bind((ADDRESSES[0], 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind((ADDRESSES[1], port))
                except OSError:
                    continue
            return port
    raise ClusterUnavailable("no TCP port free on both 127.0.0.1 and 127.0.0.2")


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return "no log"
    lines = [line for line in lines if line]
    return lines[-1][:300] if lines else "empty log"


def kvm_unavailable() -> str | None:
    """Why this machine cannot run the VM (``None``: it can)."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as exc:
        return f"/dev/kvm is not usable ({exc.strerror})"
    if shutil.which("qemu-system-x86_64") is None:
        return "QEMU is not installed (Debian package qemu-system-x86)"
    if not os.path.exists(SEABIOS):
        return "SeaBIOS is not installed (Debian package seabios)"
    return None


class RealCluster:
    """Two daemons of ``flavour`` clustered on loopback, in a scratch folder of their own."""

    def __init__(self, flavour: Flavour) -> None:
        self.flavour = flavour
        self.names = flavour.members
        self.root: Path | None = None
        self.port = 0
        self.env = proxy_environment()
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}
        self._busybox = ""
        #: Why this cluster runs no VM (``None``: it can).
        self.vm_unavailable: str | None = (
            "Debian's incus-base runs containers only (Incus's VMs need the incus package, "
            "which wants QEMU 8 or later)"
        )

    # -- paths and commands --------------------------------------------------------------------

    def folder(self, member: str) -> Path:
        assert self.root is not None
        return self.root / member

    def socket(self, member: str | None = None) -> Path:
        return self.folder(member or self.names[0]) / "unix.socket"

    def address(self, member: str) -> str:
        return ADDRESSES[self.names.index(member)]

    def member_env(self, member: str) -> dict[str, str]:
        return dict(self.env, **{self.flavour.folder_variable: str(self.folder(member))})

    def _run(
        self, member: str, argv: Sequence[str], *, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            list(argv),
            input=stdin,
            env=self.member_env(member),
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

    def cli(self, *args: str, member: str | None = None, check: bool = True) -> str:
        """The client (``lxc``/``incus``) with ``args`` against ``member``'s daemon (the first
        member's by default); its standard output."""
        member = member or self.names[0]
        return self._run(member, [self.flavour.client, *args], check=check).stdout

    def run_client(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The client with ``args`` on the first member, whatever its exit status: its exit
        status, standard output and error."""
        return self._run(self.names[0], [self.flavour.client, *args], check=False)

    def admin(self, member: str, *args: str, stdin: str | None = None) -> Any:
        """The server's admin command (``lxd …``/``incus admin …``) on ``member``."""
        return self._run(member, [*self.flavour.admin, *args], stdin=stdin, check=False)

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start both daemons and cluster them (:class:`ClusterUnavailable` when it cannot be)."""
        self._check_machine()
        clean_aborted_runs()
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{self.flavour.name}-"))
        atexit.register(self.close)
        (self.root / OWNER).write_text(str(os.getpid()))
        # The containers' mapped root must traverse it (mkdtemp makes it 0700).
        self.root.chmod(0o755)
        self.port = _free_port()
        if self.flavour is LXD:
            self.vm_unavailable = kvm_unavailable()
            if self.vm_unavailable is None:
                self._vm_environment()
        for member in self.names:
            self.start_daemon(member)
        self._bootstrap()
        self._join()
        self._probe()

    def _vm_environment(self) -> None:
        """The two stand-ins the VM needs on this host (see the module docstring)."""
        assert self.root is not None
        tools = self.root / "bin"
        tools.mkdir()
        modprobe = tools / "modprobe"
        modprobe.write_text("#!/bin/sh\nexit 0\n")
        modprobe.chmod(0o755)
        daemon = shutil.which(self.flavour.daemon[0])
        assert daemon is not None
        wrapper = tools / "lxd-exec"
        wrapper.write_text(
            "#!/bin/bash\n"
            "args=()\n"
            'for arg in "$@"; do\n'
            "    if [[ $1 == forklimits && $arg == limit=memlock:unlimited:unlimited ]]; then\n"
            "        continue\n"
            "    fi\n"
            '    args+=("$arg")\n'
            "done\n"
            f'exec {daemon} "${{args[@]}}"\n'
        )
        wrapper.chmod(0o755)
        self.env["PATH"] = f"{tools}:{self.env.get('PATH', '/usr/bin:/bin')}"
        self.env["LXD_EXEC_PATH"] = str(wrapper)

    def _probe(self) -> None:
        """A container must start here (a machine without the kernel's support for them, such
        as an unprivileged container, runs the daemons but not their containers)."""
        try:
            self.create_container("opendrs-probe", self.names[0], run=True)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[-1][:300]
            raise ClusterUnavailable(
                f"a container cannot start on this machine: {reason}"
            ) from None
        finally:
            self.cli("delete", "--force", "opendrs-probe", check=False)

    def _check_machine(self) -> None:
        flavour = self.flavour
        if os.geteuid() != 0:
            raise ClusterUnavailable(
                f"the {flavour.name} cluster needs root (CI runs the tests as root)"
            )
        missing = [tool for tool in (flavour.daemon[0], flavour.client) if not shutil.which(tool)]
        if missing:
            raise ClusterUnavailable(
                f"{' and '.join(missing)} not installed ({flavour.package}; "
                "tools/install-test-packages installs it as root)"
            )
        busybox = next((p for p in BUSYBOX if os.path.exists(p)), None)
        if busybox is None:
            raise ClusterUnavailable("busybox not installed (Debian package busybox-static)")
        self._busybox = busybox
        try:
            grp.getgrnam(flavour.group)
        except KeyError:
            made = subprocess.run(
                ["groupadd", "--system", flavour.group], capture_output=True, text=True
            )
            if made.returncode != 0:
                raise ClusterUnavailable(
                    f"no group {flavour.group}, and groupadd failed: {made.stderr.strip()[:200]}"
                ) from None

    def log(self, member: str) -> Path:
        assert self.root is not None
        return self.root / f"{member}.log"

    def start_daemon(self, member: str) -> None:
        """Start ``member``'s daemon and wait until it is ready."""
        self.folder(member).mkdir(exist_ok=True)
        with self.log(member).open("ab") as log:
            process = subprocess.Popen(
                list(self.flavour.daemon),
                env=self.member_env(member),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._daemons[member] = process
        deadline = time.monotonic() + START_SECONDS
        while not self.socket(member).exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise ClusterUnavailable(
                    f"the {self.flavour.name} daemon of {member} did not start: "
                    f"{_last_line(self.log(member))}"
                )
            time.sleep(0.1)
        ready = self.admin(member, "waitready", f"--timeout={START_SECONDS}")
        if ready.returncode != 0:
            raise ClusterUnavailable(
                f"the {self.flavour.name} daemon of {member} is not ready: "
                f"{_last_line(self.log(member))}"
            )

    def _preseed(self, member: str, text: str) -> None:
        result = self.admin(member, "init", "--preseed", stdin=text)
        if result.returncode != 0:
            reason = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise ClusterUnavailable(f"init --preseed on {member} failed: {reason[-1][:300]}")

    def _bootstrap(self) -> None:
        first = self.names[0]
        self._preseed(
            first,
            f"config:\n  core.https_address: {ADDRESSES[0]}:{self.port}\n"
            "storage_pools:\n- name: default\n  driver: dir\n"
            "profiles:\n- name: default\n  devices:\n"
            "    root: {path: /, pool: default, type: disk}\n"
            f"cluster:\n  server_name: {first}\n  enabled: true\n",
        )

    def _join(self) -> None:
        second = self.names[1]
        token = self.cli("cluster", "add", second).strip().splitlines()[-1]
        self._preseed(
            second,
            f"cluster:\n  enabled: true\n  server_name: {second}\n"
            f"  server_address: {ADDRESSES[1]}:{self.port}\n"
            f"  cluster_address: {ADDRESSES[0]}:{self.port}\n"
            f"  cluster_token: {token}\n"
            "  member_config:\n"
            '  - {entity: storage-pool, name: default, key: source, value: ""}\n',
        )

    # -- instances -----------------------------------------------------------------------------

    def create_container(
        self,
        name: str,
        member: str,
        *,
        cpu: int = 1,
        memory: str = "256MiB",
        run: bool = False,
        project: str = "default",
        target: str | None = None,
    ) -> None:
        """An image-less container on ``member`` (placed there by ``target``: the member, or
        ``@GROUP``) with a busybox root file system that sleeps."""
        self._settled(
            "init",
            "--empty",
            name,
            "--project",
            project,
            "--target",
            target or member,
            "-c",
            f"limits.cpu={cpu}",
            "-c",
            f"limits.memory={memory}",
        )
        volume = name if project == "default" else f"{project}_{name}"
        pool = self.folder(member) / "storage-pools" / "default" / "containers"
        rootfs = pool / volume / "rootfs"
        for sub in ("bin", "sbin", "proc", "sys", "dev", "tmp", "etc", "root"):
            (rootfs / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy2(self._busybox, rootfs / "bin" / "busybox")
        for applet in ("sh", "sleep", "timeout"):
            (rootfs / "bin" / applet).symlink_to("busybox")
        init = rootfs / "sbin" / "init"
        # It ends on SIGPWR (a clean stop) at once: a stop need not wait for its timeout.
        init.write_text(
            "#!/bin/sh\ntrap 'exit 0' PWR TERM INT\nwhile true; do sleep 3600 & wait $!; done\n"
        )
        init.chmod(0o755)
        if run:
            self.cli("start", name, "--project", project)

    def _settled(self, *args: str) -> str:
        """The client with ``args``, again while the server says it is not ready yet (a member
        started again is online some seconds before it takes new instances)."""
        deadline = time.monotonic() + START_SECONDS * 3
        while True:
            try:
                return self.cli(*args)
            except RuntimeError as exc:
                if "isn't ready yet" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def create_vm(
        self, name: str, member: str, *, memory: str = "256MiB", config: Sequence[str] = ()
    ) -> None:
        """A running VM on ``member`` that may move by a stateful stop and start (see the module
        docstring; only where :attr:`vm_unavailable` is ``None``), with ``config`` (``KEY=VALUE``:
        set before it starts, as a running VM without an agent takes no change)."""
        assert self.vm_unavailable is None, self.vm_unavailable
        self.cli(
            "init",
            "--empty",
            "--vm",
            name,
            "--target",
            member,
            *("-c", "limits.cpu=1", "-c", f"limits.memory={memory}"),
            *("-c", "security.secureboot=false", "-c", "migration.stateful=true"),
            *("-c", f"raw.qemu=-cpu qemu64 -bios {SEABIOS}"),
            *("-c", 'raw.qemu.conf=[device "qemu_vsock"]'),
            *("-d", "root,size=64MiB", "-d", "root,size.state=300MiB"),
            *(arg for item in config for arg in ("-c", item)),
        )
        self.cli("start", name)

    def query(self, path: str) -> Any:
        """``lxc query PATH`` (``incus query``) on the first member: the API's answer, decoded."""
        return json.loads(self.cli("query", path))

    def location(self, name: str, project: str = "default") -> tuple[str, str]:
        """Where ``name`` is and its status (``Running``, ``Stopped``), as the server says."""
        row = self.query(f"/1.0/instances/{name}?project={project}")
        return str(row["location"]), str(row["status"])

    def members(self) -> dict[str, str]:
        """Each member's status (``Online``, ``Evacuated``, ``Offline``), as the server says."""
        rows = self.query("/1.0/cluster/members?recursion=1")
        return {str(row["server_name"]): str(row["status"]) for row in rows}

    def ensure_up(self) -> None:
        """Start again the daemon of a member shut down by a test, and wait until the cluster
        sees it online; restore a member a test left evacuated."""
        for member in self.names:
            if member in self._daemons:
                continue
            self.start_daemon(member)
            deadline = time.monotonic() + 60
            while self.members().get(member) != "Online":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{member} is not online again: {self.members()}")
                time.sleep(0.5)
            # Answering for itself through the other member, too.
            self._settled("query", f"/1.0/resources?target={member}")
        for member, status in self.members().items():
            if status == "Evacuated":
                self.cli("cluster", "restore", member, "--force")

    # -- stop ----------------------------------------------------------------------------------

    def shutdown_daemon(self, member: str) -> None:
        """Stop ``member``'s daemon cleanly; its instances stop with it."""
        self.admin(member, "shutdown", "--timeout=30")
        process = self._daemons.pop(member, None)
        if process is not None:
            _end(process)

    def close(self) -> None:
        """Leave nothing behind (see the module docstring); safe to call again."""
        if self.root is None:
            return
        for member in reversed(self.names):  # the joining member first
            if member in self._daemons and self.socket(member).exists():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.cli("stop", "--all", "--force", member=member, check=False)
        for member in reversed(self.names):
            if member in self._daemons:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.shutdown_daemon(member)
        for process in self._daemons.values():
            _end(process)
        self._daemons.clear()
        _remove(str(self.root))
        self.root = None


def _remove(root: str) -> None:
    """Kill what names ``root``, unmount what is under it, and remove it."""
    for pid in _processes_naming(root):
        _kill(pid)
    for mount in _mounts_under(root):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    shutil.rmtree(root, ignore_errors=True)


def clean_aborted_runs() -> list[str]:
    """Remove the scratch folders of earlier runs whose process is gone (a run killed outright
    could not clean up): their daemons, instances and mounts too. Returns the folders removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((folder / OWNER).read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and Path(f"/proc/{owner}").exists():
            continue  # a run still going
        _remove(str(folder))
        removed.append(str(folder))
    return removed


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
    """Ids of the processes whose command line or environment contains ``text``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or _environment_names(entry, text):
            yield int(entry.name)


def _environment_names(entry: Path, text: str) -> bool:
    """Whether the environment of the process ``entry`` names ``text`` — a daemon started with
    ``INCUS_DIR``/``LXD_DIR`` in the scratch folder, whose command line does not."""
    try:
        return text.encode() in (entry / "environ").read_bytes()
    except OSError:
        return False


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
