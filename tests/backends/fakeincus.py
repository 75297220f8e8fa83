"""A fake Incus cluster API for the Incus backend's tests (aiohttp, loopback only).

:class:`FakeIncus` holds a cluster — members with capacity, load and roles, instances with their
config, devices and state — and serves the part of Incus's REST API that opendrs uses, with
Incus's envelopes (sync, async, error):

* ``GET /1.0`` (server config, ``environment.server_name``), ``GET /1.0/cluster/members``,
  ``GET /1.0/cluster/members/NAME/state`` (or 501, as LXD 5.0 answers), ``POST`` on it
  (evacuate, restore), ``GET /1.0/resources?target=``;
* ``GET /1.0/instances?recursion=2`` (one project or all), ``GET``/``PATCH /1.0/instances/NAME``,
  ``PUT …/state`` (stop, start), ``POST /1.0/instances/NAME?target=`` (a move that takes
  :attr:`FakeIncus.migration_seconds` and can fail);
* operations: ``GET /1.0/operations``, ``GET …/ID``, ``GET …/ID/wait?timeout=``, ``DELETE``.

Faults: :meth:`FakeIncus.fail` answers a request with an API error a number of times,
:meth:`FakeIncus.hang` answers late, :meth:`FakeIncus.answer_as_proxy` does what a request asks
and answers a proxy's error page (502, 504) instead; an instance's ``move_error`` makes its next
migration's operation fail; a move to an offline member fails as Incus's does. The CPU counter of
a running instance grows at its ``cpu_rate`` cores in real time, so a rate can be measured.

:class:`Served` runs one on its own event loop in a thread, on a unix socket or on 127.0.0.1
over TLS that requires a trusted client certificate (:func:`make_pki`).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import os
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

GiB = 1024**3
#: A request's JSON body, read once by the middleware.
BODY = web.RequestKey("body", object)
MiB = 1024**2


@dataclass
class Member:
    name: str
    threads: int = 16
    memory: int = 64 * GiB
    arch: str = "x86_64"
    status: str = "Online"
    roles: list[str] = field(default_factory=lambda: ["database"])
    groups: list[str] = field(default_factory=lambda: ["default"])
    failure_domain: str = "default"
    load1: float = 0.5
    used_memory: int = 2 * GiB
    config: dict[str, str] = field(default_factory=dict)


@dataclass
class Instance:
    name: str
    location: str
    type: str = "virtual-machine"
    project: str = "default"
    status: str = "Running"
    config: dict[str, str] = field(default_factory=dict)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    cpu_rate: float = 0.5
    memory_usage: int = 512 * MiB
    #: The next migration's operation fails with this.
    move_error: str | None = None
    started: float = field(default_factory=time.monotonic)
    #: When it last started (Incus's ``last_used_at``): an hour ago by default.
    last_used_at: str = field(
        default_factory=lambda: (
            datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
        ).strftime("%Y-%m-%dT%H:%M:%SZ")
    )

    def cpu_usage(self) -> int:
        if self.status != "Running":
            return 0
        return int(self.cpu_rate * (time.monotonic() - self.started) * 1e9)


@dataclass
class Operation:
    id: str
    description: str
    resources: dict[str, list[str]]
    status: str = "Running"
    err: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    created: float = field(default_factory=time.time)
    ended: float | None = None

    def finish(self, status: str, err: str = "") -> None:
        self.status, self.err, self.ended = status, err, time.time()
        self.done.set()

    def render(self) -> dict[str, Any]:
        codes = {"Running": 103, "Success": 200, "Failure": 400, "Cancelled": 401}
        updated = self.ended if self.ended is not None else time.time()
        return {
            "id": self.id,
            "class": "task",
            "description": self.description,
            "status": self.status,
            "status_code": codes[self.status],
            "resources": self.resources,
            "err": self.err,
            "may_cancel": True,
            "created_at": _api_time(self.created),
            "updated_at": _api_time(updated),
        }


def _api_time(at: float) -> str:
    """A time as the API writes it (RFC 3339, nanoseconds, UTC)."""
    whole = datetime.datetime.fromtimestamp(int(at), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{round((at % 1) * 1e9):09d}Z"


class FakeIncus:
    """A fake Incus cluster and its API (see the module docstring)."""

    def __init__(self, server_name: str = "m1", *, flavour: str = "incus") -> None:
        self.server_name = server_name
        self.flavour = flavour
        #: ``environment.server_version``: from 7.0 on, Incus records a running VM's boot state
        #: (``volatile.vm.boot_state``) when it starts with ``migration.stateful`` on, and moves
        #: it live only then.
        self.version = "6.0.4"
        #: The status of the answer refusing an unknown config key: LXD 5.0.2 answers 500.
        self.unknown_key_status = 500
        self.members: dict[str, Member] = {}
        self.instances: dict[tuple[str, str], Instance] = {}
        self.projects: dict[str, dict[str, str]] = {"default": {}}
        self.config: dict[str, str] = {}
        #: Storage pools: name → (driver, size on each member in bytes).
        self.pools: dict[str, tuple[str, int]] = {"local": ("zfs", 500 * GiB), "ceph": ("ceph", 0)}
        self.member_state = True
        self.migration_seconds = 0.2
        self.operations: dict[str, Operation] = {}
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self._faults: list[list[Any]] = []
        self._hangs: dict[tuple[str, str, str], float] = {}
        self._proxied: dict[tuple[str, str], int] = {}
        #: Members and instances (by name) listed twice, as a broken server might.
        self.listed_twice: set[str] = set()

    # -- the cluster ---------------------------------------------------------------------------

    def add_member(self, name: str, **fields: Any) -> Member:
        member = self.members[name] = Member(name, **fields)
        if len(self.members) == 1 and "roles" not in fields:
            member.roles = ["database-leader", "database"]
        return member

    def add_instance(self, name: str, location: str, **fields: Any) -> Instance:
        instance = Instance(name, location, **fields)
        self.instances[(instance.project, name)] = instance
        return instance

    def instance(self, name: str, project: str = "default") -> Instance:
        return self.instances[(project, name)]

    def set_leader(self, name: str) -> None:
        for member in self.members.values():
            member.roles = [r for r in member.roles if r != "database-leader"]
        self.members[name].roles.insert(0, "database-leader")

    def fail(
        self, method: str, path: str, status: int, message: str, times: int = 1, target: str = ""
    ) -> None:
        """Answer the next ``times`` requests ``method path`` (with ``?target=target`` only, when
        given) with an API error."""
        self._faults.append([method, path, status, message, times, target])

    def hang(self, method: str, path: str, seconds: float, *, target: str = "") -> None:
        """Answer every request ``method path`` (with ``?target=target`` only, when given) after
        ``seconds``."""
        self._hangs[(method, path, target)] = seconds

    def answer_as_proxy(self, method: str, path: str, status: int) -> None:
        """Do what every request ``method path`` asks, then answer as a proxy in front of the
        API would when the API's answer did not reach it: ``status`` (502, 504), not JSON."""
        self._proxied[(method, path)] = status

    def calls(self, method: str, path: str) -> list[tuple[str, str, dict[str, str], Any]]:
        return [r for r in self.requests if r[0] == method and r[1] == path]

    # -- rendering -----------------------------------------------------------------------------

    def _member_json(self, member: Member) -> dict[str, Any]:
        messages = {
            "Online": "Fully operational",
            "Offline": "No heartbeat",
            "Evacuated": ("Unavailable due to maintenance"),
        }
        return {
            "server_name": member.name,
            "url": f"https://{member.name}:8443",
            "status": member.status,
            "message": messages.get(member.status, ""),
            "roles": list(member.roles),
            "architecture": member.arch,
            "groups": list(member.groups),
            "failure_domain": member.failure_domain,
            "config": dict(member.config),
            "database": any(r.startswith("database") for r in member.roles),
        }

    def _instance_json(self, inst: Instance, recursion: int) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": inst.name,
            "project": inst.project,
            "type": inst.type,
            "location": inst.location,
            "status": inst.status,
            "status_code": 103 if inst.status == "Running" else 102,
            "last_used_at": inst.last_used_at,
            "config": dict(inst.config),
            "devices": {},
            "expanded_config": dict(inst.config),
            "expanded_devices": {k: dict(v) for k, v in inst.devices.items()},
            "architecture": self.members[inst.location].arch
            if inst.location in self.members
            else "x86_64",
        }
        if recursion >= 2:
            data["state"] = self._state(inst)
        return data

    def _state(self, inst: Instance) -> dict[str, Any]:
        running = inst.status == "Running"
        return {
            "status": inst.status,
            "cpu": {"usage": inst.cpu_usage()},
            "memory": {"usage": inst.memory_usage if running else 0, "total": 0},
            "processes": 10 if running else 0,
        }

    # -- the server ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        get, post = web.get, web.post
        app.add_routes(
            [
                get("/1.0", self._server),
                get("/1.0/cluster/members", self._members),
                get("/1.0/cluster/members/{name}/state", self._member_state),
                post("/1.0/cluster/members/{name}/state", self._member_action),
                get("/1.0/resources", self._resources),
                get("/1.0/storage-pools", self._pools),
                get("/1.0/storage-pools/{name}/resources", self._pool_resources),
                get("/1.0/projects", self._projects),
                get("/1.0/projects/{name}", self._project),
                get("/1.0/instances", self._instances),
                get("/1.0/instances/{name}", self._instance),
                web.patch("/1.0/instances/{name}", self._patch),
                post("/1.0/instances/{name}", self._move),
                web.put("/1.0/instances/{name}/state", self._power),
                get("/1.0/operations", self._operations),
                get("/1.0/operations/{id}", self._operation),
                get("/1.0/operations/{id}/wait", self._wait),
                web.delete("/1.0/operations/{id}", self._cancel),
            ]
        )
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = None
        if request.can_read_body:
            body = await request.json()
        self.requests.append((request.method, request.path, dict(request.query), body))
        delay = self._hangs.get((request.method, request.path, "")) or self._hangs.get(
            (request.method, request.path, request.query.get("target", ""))
        )
        if delay:
            await asyncio.sleep(delay)
        for fault in self._faults:
            aimed = not fault[5] or fault[5] == request.query.get("target", "")
            if fault[0] == request.method and fault[1] == request.path and fault[4] > 0 and aimed:
                fault[4] -= 1
                return _error(fault[2], fault[3])
        request[BODY] = body
        try:
            response = await handler(request)
        except _ApiError as exc:
            return _error(exc.status, exc.message)
        status = self._proxied.get((request.method, request.path))
        if status is not None:
            page = f"<html><body><h1>{status} proxy error</h1></body></html>"
            return web.Response(status=status, text=page, content_type="text/html")
        return response

    @property
    def api_extensions(self) -> list[str]:
        """LXD 5.0 has no migration_vm_live: it moves a running VM by a stateful stop and
        start."""
        extensions = ["clustering", "cluster_rebalance"]
        return extensions if self.flavour == "lxd" else [*extensions, "migration_vm_live"]

    async def _server(self, request: web.Request) -> web.Response:
        return _sync(
            {
                "config": dict(self.config),
                "api_extensions": self.api_extensions,
                "environment": {
                    "server_name": self.server_name,
                    "server_clustered": True,
                    "server": self.flavour,
                    "server_version": self.version,
                },
            }
        )

    async def _members(self, request: web.Request) -> web.Response:
        if request.query.get("recursion") == "1":
            twice = [self.members[n] for n in self.listed_twice if n in self.members]
            return _sync([self._member_json(m) for m in [*self.members.values(), *twice]])
        return _sync([f"/1.0/cluster/members/{n}" for n in self.members])

    def _member(self, request: web.Request) -> Member:
        name = request.match_info["name"]
        if name not in self.members:
            raise _ApiError(404, "Cluster member not found")
        return self.members[name]

    async def _member_state(self, request: web.Request) -> web.Response:
        member = self._member(request)
        if not self.member_state:
            raise _ApiError(501, "not implemented")
        return _sync(
            {
                "sysinfo": {
                    "load_averages": [member.load1, member.load1, member.load1],
                    "total_ram": member.memory,
                    "free_ram": member.memory - member.used_memory,
                    "logical_cpus": member.threads,
                },
                "storage_pools": {},
            }
        )

    async def _member_action(self, request: web.Request) -> web.Response:
        member = self._member(request)
        action = (request[BODY] or {}).get("action")
        if action not in ("evacuate", "restore"):
            raise _ApiError(400, f"Unknown action {action!r}")

        async def work() -> str | None:
            await asyncio.sleep(self.migration_seconds)
            if action == "evacuate":
                member.status = "Evacuated"
                others = [m for m in self.members.values() if m.status == "Online"]
                for inst in list(self.instances.values()):
                    if inst.location == member.name and others:
                        inst.config["volatile.evacuate.origin"] = member.name
                        inst.location = others[0].name
            else:
                member.status = "Online"
                for inst in self.instances.values():
                    if inst.config.pop("volatile.evacuate.origin", None) == member.name:
                        inst.location = member.name
            return None

        return self._async(f"{action} member {member.name}", {}, work)

    async def _resources(self, request: web.Request) -> web.Response:
        target = request.query.get("target", self.server_name)
        member = self.members.get(target)
        if member is None:
            raise _ApiError(404, "Cluster member not found")
        if member.status == "Offline":
            raise _ApiError(503, f"Failed to connect to cluster member {target}")
        return _sync(
            {
                "cpu": {"architecture": member.arch, "total": member.threads, "sockets": []},
                "memory": {"total": member.memory, "used": member.used_memory},
            }
        )

    async def _pools(self, request: web.Request) -> web.Response:
        return _sync([{"name": n, "driver": d} for n, (d, _) in self.pools.items()])

    async def _pool_resources(self, request: web.Request) -> web.Response:
        _driver, size = self.pools[request.match_info["name"]]
        return _sync({"space": {"used": size // 10, "total": size}})

    async def _projects(self, request: web.Request) -> web.Response:
        return _sync([{"name": n, "config": dict(c)} for n, c in self.projects.items()])

    async def _project(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.projects:
            raise _ApiError(404, "Project not found")
        return _sync({"name": name, "config": dict(self.projects[name])})

    def _listed(self, request: web.Request) -> list[Instance]:
        if request.query.get("all-projects") == "true":
            return list(self.instances.values())
        project = request.query.get("project", "default")
        if project not in self.projects:
            raise _ApiError(404, "Project not found")
        return [i for i in self.instances.values() if i.project == project]

    async def _instances(self, request: web.Request) -> web.Response:
        recursion = int(request.query.get("recursion", "0"))
        listed = self._listed(request)
        listed += [i for i in listed if i.name in self.listed_twice]
        if recursion == 0:
            return _sync([f"/1.0/instances/{i.name}" for i in listed])
        return _sync([self._instance_json(i, recursion) for i in listed])

    def _find(self, request: web.Request) -> Instance:
        key = (request.query.get("project", "default"), request.match_info["name"])
        if key not in self.instances:
            raise _ApiError(404, "Instance not found")
        return self.instances[key]

    async def _instance(self, request: web.Request) -> web.Response:
        return _sync(self._instance_json(self._find(request), 1))

    async def _patch(self, request: web.Request) -> web.Response:
        inst = self._find(request)
        config = (request[BODY] or {}).get("config", {})
        for key in config:
            if key.startswith("volatile.") and (
                self.flavour == "lxd" or key != "volatile.rebalance.last_move"
            ):
                raise _ApiError(
                    self.unknown_key_status, f"Invalid config: Unknown configuration key: {key}"
                )
        inst.config.update({k: str(v) for k, v in config.items()})
        return _sync({})

    async def _move(self, request: web.Request) -> web.Response:
        inst = self._find(request)
        body = request[BODY] or {}
        target = request.query.get("target")
        if not body.get("migration") or not target:
            raise _ApiError(400, "Only cluster moves are served by this fake")
        if target not in self.members:
            raise _ApiError(404, "Cluster member not found")
        if target == inst.location:
            raise _ApiError(400, "Instance is already on the target member")
        running = inst.status == "Running"
        if running and inst.type == "container" and body.get("live"):
            raise _ApiError(400, "Unable to perform container live migration. CRIU isn't installed")
        if running and not body.get("live"):
            raise _ApiError(400, "Instance is running")
        if running and inst.type == "virtual-machine" and not self._can_live_migrate(inst):
            raise _ApiError(400, "Live migration requires migration.stateful to be set to true")

        async def work() -> str | None:
            await asyncio.sleep(self.migration_seconds)
            error, inst.move_error = inst.move_error, None
            if error:
                return error
            if self.members[target].status != "Online":
                return f"Failed to connect to cluster member {target}: no route to host"
            inst.location = target
            return None

        url = f"/1.0/instances/{inst.name}?project={inst.project}"
        return self._async("Migrating instance", {"instances": [url]}, work)

    async def _power(self, request: web.Request) -> web.Response:
        inst = self._find(request)
        action = (request[BODY] or {}).get("action")

        async def work() -> str | None:
            await asyncio.sleep(self.migration_seconds / 4)
            if action == "stop":
                inst.status = "Stopped"
            elif action == "start":
                inst.status = "Running"
                inst.started = time.monotonic()
                self._record_boot_state(inst)
            else:
                return f"Unknown action {action}"
            return None

        url = f"/1.0/instances/{inst.name}?project={inst.project}"
        return self._async(f"{str(action).title()}ing instance", {"instances": [url]}, work)

    def _boot_state_recorded(self) -> bool:
        return self.flavour == "incus" and int(self.version.split(".")[0]) >= 7

    def _record_boot_state(self, inst: Instance) -> None:
        """What Incus 7 writes when a VM starts: its machine, when it starts stateful."""
        if inst.type != "virtual-machine" or not self._boot_state_recorded():
            return
        inst.config.pop("volatile.vm.boot_state", None)
        if inst.config.get("migration.stateful") == "true":
            state = {"version": 1, "machine_type": "pc-q35-9.2"}
            inst.config["volatile.vm.boot_state"] = json.dumps(state)

    def _can_live_migrate(self, inst: Instance) -> bool:
        """Incus's ``CanLiveMigrate`` of a running VM."""
        if inst.config.get("migration.stateful") != "true":
            return False
        return not self._boot_state_recorded() or "volatile.vm.boot_state" in inst.config

    def _async(self, description: str, resources: dict[str, list[str]], work: Any) -> web.Response:
        op = Operation(str(uuid.uuid4()), description, resources)
        self.operations[op.id] = op

        async def run() -> None:
            try:
                error = await work()
            except asyncio.CancelledError:
                op.finish("Cancelled", "Operation cancelled")
                raise
            op.finish(*(("Failure", error) if error else ("Success", "")))

        op.task = asyncio.get_running_loop().create_task(run())
        body = {
            "type": "async",
            "status": "Operation created",
            "status_code": 100,
            "operation": f"/1.0/operations/{op.id}",
            "metadata": op.render(),
        }
        return web.json_response(body, status=202)

    def _op(self, request: web.Request) -> Operation:
        op = self.operations.get(request.match_info["id"])
        if op is None:
            raise _ApiError(404, "Operation not found")
        return op

    async def _operations(self, request: web.Request) -> web.Response:
        by_status: dict[str, list[Any]] = {}
        for op in self.operations.values():
            item = op.render() if request.query.get("recursion") == "1" else op.id
            by_status.setdefault(op.status.lower(), []).append(item)
        return _sync(by_status)

    async def _operation(self, request: web.Request) -> web.Response:
        return _sync(self._op(request).render())

    async def _wait(self, request: web.Request) -> web.Response:
        op = self._op(request)
        timeout = float(request.query.get("timeout", "-1"))
        try:
            await asyncio.wait_for(op.done.wait(), None if timeout < 0 else timeout)
        except TimeoutError:
            if self.flavour != "lxd":
                # Incus (operationWaitGet): the wait's deadline passing is an error.
                return _error(500, "context deadline exceeded")
        return _sync(op.render())

    async def _cancel(self, request: web.Request) -> web.Response:
        op = self._op(request)
        if op.task is not None and not op.task.done():
            op.task.cancel()
        return _sync({})


class _ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


def _sync(metadata: Any) -> web.Response:
    return web.json_response(
        {"type": "sync", "status": "Success", "status_code": 200, "metadata": metadata}
    )


def _error(status: int, message: str) -> web.Response:
    body = {"type": "error", "error": message, "error_code": status}
    return web.json_response(body, status=status)


class Served:
    """A :class:`FakeIncus` served on its own event loop in a daemon thread: on the unix socket
    ``socket``, or on 127.0.0.1 over TLS with ``ssl_context``."""

    def __init__(
        self,
        fake: FakeIncus,
        *,
        socket: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.fake = fake
        self.socket = socket
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start(ssl_context))
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="fakeincus", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Incus server did not start")

    async def _start(self, ssl_context: ssl.SSLContext | None) -> None:
        self._runner = web.AppRunner(self.fake.app(), access_log=None)
        await self._runner.setup()
        if self.socket is not None:
            site: web.BaseSite = web.UnixSite(self._runner, self.socket)
        else:
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        if self.socket is None:
            server = site._server  # the port the system picked
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def call(self, coroutine_function: Any) -> Any:
        """Run ``coroutine_function()`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine_function(), self._loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            for op in self.fake.operations.values():
                if op.task is not None:
                    op.task.cancel()
            if self._runner is not None:
                await self._runner.cleanup()
            # Every task still pending (operations under way, handlers) ends here, awaited, so
            # that none is left for the garbage collector to find pending on a closed loop.
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


@dataclass
class Pki:
    """Certificates on disk for a TLS test: a server cert, a trusted and an untrusted client."""

    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_cert: str
    other_key: str

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.server_cert, self.server_key)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(self.client_cert)
        return context


def make_pki(folder: Path) -> Pki:
    """Self-signed certificates (as Incus's server and clients use) in ``folder``."""
    paths: dict[str, str] = {}
    for name, common_name in (("server", "incus-test"), ("client", "opendrs"), ("other", "eve")):
        cert, key = _self_signed(common_name)
        for kind, data in (("cert", cert), ("key", key)):
            path = folder / f"{name}.{kind}"
            path.write_bytes(data)
            os.chmod(path, 0o600)
            paths[f"{name}_{kind}"] = str(path)
    return Pki(**paths)


def _self_signed(common_name: str) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


_counter = itertools.count()


def socket_path(folder: Path) -> str:
    """A unix socket path in ``folder`` (short enough for the 108-byte limit)."""
    path = folder / f"incus{next(_counter)}.sock"
    if len(str(path)) > 100:
        short = Path(f"/tmp/fakeincus-{os.getpid()}-{next(_counter)}.sock")
        return str(short)
    return str(path)


__all__ = ["FakeIncus", "Instance", "Member", "Pki", "Served", "make_pki", "socket_path"]
