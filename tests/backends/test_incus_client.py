"""The Incus backend's configuration and API client, against a fake Incus API on loopback."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("httpx", reason="the Incus backend's client is httpx")
pytest.importorskip("aiohttp", reason="the fake Incus API is an aiohttp server")
pytest.importorskip("cryptography", reason="the TLS tests make certificates")

from backends.fakeincus import FakeIncus, Served, make_pki
from backends.incus_fixture import served, small_cluster, socket_config
from opendrs.backends.base import BackendError
from opendrs.backends.incus.backend import IncusBackend
from opendrs.backends.incus.client import Client, HttpError
from opendrs.backends.incus.config import (
    INCUS_SOCKET,
    LXD_SOCKETS,
    IncusConfig,
    parse_incus,
)
from opendrs.controller.config import ConfigError, parse_config
from opendrs.model.cluster import Settings
from opendrs.model.document import DocumentError, Reader

__all__ = ["served"]


def parse(section: dict[str, object]) -> IncusConfig:
    return parse_incus(Reader("opendrs.yaml"), {"type": "incus", **section}, ("backend",))


def problem(section: dict[str, object]) -> str:
    with pytest.raises(DocumentError) as caught:
        parse(section)
    return str(caught.value)


# -- configuration ---------------------------------------------------------------------------


def test_defaults_are_the_local_incus_socket() -> None:
    config = parse({})
    assert config.socket == INCUS_SOCKET
    assert (config.project, config.all_projects, config.verify) == ("default", False, True)
    assert not config.leader_only


def test_lxd_flavour_takes_an_lxd_socket() -> None:
    assert parse({"flavour": "lxd"}).socket in LXD_SOCKETS


def test_https_needs_a_client_certificate_and_key(tmp_path: Path) -> None:
    assert "client_cert: required with addresses" in problem({"addresses": ["https://incus1:8443"]})
    pki = make_pki(tmp_path)
    config = parse(
        {
            "addresses": ["https://incus1:8443", "https://[::1]:8443/"],
            "client_cert": pki.client_cert,
            "client_key": pki.client_key,
            "server_cert": pki.server_cert,
            "project": "web",
            "timeout": "30s",
            "migration_timeout": "2h",
        }
    )
    assert config.addresses == ("https://incus1:8443", "https://[::1]:8443")
    assert config.socket is None
    assert (config.timeout, config.migration_timeout, config.project) == (30.0, 7200.0, "web")


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"addresses": ["http://incus1:8443"]}, "backend.addresses[0]: expected https://"),
        ({"addresses": []}, "backend.addresses: must name at least one"),
        ({"project": "web", "all_projects": True}, "backend.project: give project or all_projects"),
        ({"project": "a b"}, "backend.project: not a project name"),
        ({"timeout": "2h"}, "backend.timeout: must be between 1s and 1h"),
        ({"client_cert": "/etc/hostname"}, "backend.client_cert: is for addresses (HTTPS)"),
        ({"flavour": "lxc"}, "backend.flavour: unknown value 'lxc'"),
        ({"sockets": "/x"}, "backend.sockets: unknown key (did you mean 'socket'?)"),
        ({"leader_only": "yes"}, "backend.leader_only: expected true or false"),
        ({"scriptlet_timeout": "2m"}, "backend.scriptlet_timeout: must be between 1s and 1m"),
        ({"placement_scriptlet": 1}, "backend.placement_scriptlet: expected true or false"),
    ],
)
def test_bad_sections_fail_in_one_line(section: dict[str, object], expected: str) -> None:
    message = problem(section)
    assert expected in message
    assert "\n" not in message
    assert message.startswith("opendrs.yaml: ")


def test_a_key_file_every_user_may_read_is_refused(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    os.chmod(pki.client_key, 0o644)
    message = problem(
        {
            "addresses": "https://incus1:8443",
            "client_cert": pki.client_cert,
            "client_key": pki.client_key,
        }
    )
    assert "backend.client_key:" in message and "chmod o-r" in message


def test_missing_files_are_named(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    message = problem(
        {
            "addresses": "https://incus1:8443",
            "client_cert": str(tmp_path / "nope.crt"),
            "client_key": pki.client_key,
        }
    )
    assert "backend.client_cert: cannot read the file" in message


def test_the_configuration_file_takes_type_incus(tmp_path: Path) -> None:
    config = parse_config(
        {"backend": {"type": "incus", "socket": "incus.sock", "all_projects": True}},
        filename=str(tmp_path / "opendrs.yaml"),
    )
    assert config.backend.type == "incus"
    assert config.backend.incus is not None
    assert config.backend.incus.socket == str(tmp_path / "incus.sock")
    assert config.backend.incus.all_projects
    with pytest.raises(ConfigError, match=r"backend\.retries: must be between 0 and 10"):
        parse_config({"backend": {"type": "incus", "retries": 11}})


# -- the client over the unix socket ---------------------------------------------------------


def test_reads_return_the_metadata(served: Served) -> None:
    client = Client(socket_config(served))
    try:
        members = client.get("/1.0/cluster/members", recursion=1)
        assert [m["server_name"] for m in members] == ["m1", "m2", "m3"]
        assert client.get("/1.0")["environment"]["server_name"] == "m1"
    finally:
        client.close()


def test_a_passing_server_error_is_read_again(served: Served) -> None:
    served.fake.fail("GET", "/1.0/cluster/members", 503, "database is busy", times=1)
    client = Client(socket_config(served))
    client.sleep = lambda seconds: None
    try:
        assert len(client.get("/1.0/cluster/members", recursion=1)) == 3
    finally:
        client.close()
    assert len(served.fake.calls("GET", "/1.0/cluster/members")) == 2


def test_errors_are_one_line_with_the_status(served: Served) -> None:
    served.fake.fail("GET", "/1.0/resources", 500, "Failed\nto read\tresources", times=5)
    client = Client(socket_config(served))
    client.sleep = lambda seconds: None
    try:
        with pytest.raises(HttpError) as caught:
            client.get("/1.0/resources", target="m1")
    finally:
        client.close()
    assert str(caught.value) == (
        "GET /1.0/resources at unix:"
        + str(served.socket)
        + ": HTTP 500: Failed to read resources (after 2 tries)"
    )
    assert caught.value.transient


def test_not_found_is_not_asked_again(served: Served) -> None:
    client = Client(socket_config(served))
    try:
        with pytest.raises(HttpError) as caught:
            client.get("/1.0/instances/nope")
    finally:
        client.close()
    assert caught.value.status == 404 and not caught.value.transient
    assert len(served.fake.calls("GET", "/1.0/instances/nope")) == 1


def test_a_change_is_never_sent_twice_once_it_may_have_arrived(served: Served) -> None:
    served.fake.hang("POST", "/1.0/instances/vm1", 3.0)
    client = Client(socket_config(served, timeout=1.0, retries=3))
    client.sleep = lambda seconds: None
    try:
        with pytest.raises(BackendError) as caught:
            client.send(
                "POST",
                "/1.0/instances/vm1",
                {"name": "vm1", "migration": True, "live": True},
                target="m2",
            )
    finally:
        client.close()
    assert caught.value.uncertain
    assert "no answer within 1s" in str(caught.value)
    assert len(served.fake.calls("POST", "/1.0/instances/vm1")) == 1


def test_a_change_is_sent_again_when_it_surely_did_not_arrive(tmp_path: Path) -> None:
    client = Client(IncusConfig(socket=str(tmp_path / "none.sock"), retries=2, timeout=1.0))
    tries: list[float] = []
    client.sleep = tries.append
    try:
        with pytest.raises(BackendError) as caught:
            client.send("POST", "/1.0/instances/vm1", {"migration": True}, target="m2")
    finally:
        client.close()
    assert not caught.value.uncertain
    assert "cannot connect" in str(caught.value) and "(after 3 tries)" in str(caught.value)
    assert tries == [0.5, 1.0]


def test_operations_are_followed(served: Served) -> None:
    client = Client(socket_config(served))
    try:
        reply = client.send(
            "POST",
            "/1.0/instances/vm1",
            {"name": "vm1", "migration": True, "live": True},
            target="m2",
        )
        assert reply.operation is not None
        running = client.wait(reply.operation, 0)
        assert running["status"] == "Running"
        finished = client.wait(reply.operation, 5)
        assert finished["status"] == "Success"
    finally:
        client.close()
    assert served.fake.instance("vm1").location == "m2"


def test_a_stop_request_ends_the_backoff(tmp_path: Path) -> None:
    stop = False
    client = Client(
        IncusConfig(socket=str(tmp_path / "none.sock"), retries=5, backoff=30.0, timeout=1.0),
        lambda: stop,
    )
    started = time.monotonic()

    def stop_soon(seconds: float) -> None:
        nonlocal stop
        stop = True
        client._pause(seconds)

    client.sleep = stop_soon
    with pytest.raises(BackendError, match="opendrs is stopping"):
        client.get("/1.0")
    assert time.monotonic() - started < 5


# -- the client over HTTPS -------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path):  # type: ignore[no-untyped-def]
    pki = make_pki(tmp_path)
    server = Served(small_cluster(FakeIncus()), ssl_context=pki.server_context())
    try:
        yield server, pki
    finally:
        server.close()


def https_config(addresses: tuple[str, ...], cert: str, key: str, server_cert: str) -> IncusConfig:
    return IncusConfig(
        socket=None,
        addresses=addresses,
        client_cert=cert,
        client_key=key,
        server_cert=server_cert,
        retries=0,
        timeout=2.0,
    )


def first_error(config: IncusConfig) -> BackendError:
    client = Client(config)
    try:
        with pytest.raises(BackendError) as caught:
            client.get("/1.0")
    finally:
        client.close()
    return caught.value


def test_https_with_a_trusted_client_certificate(tls, caplog) -> None:  # type: ignore[no-untyped-def]
    server, pki = tls
    addresses = ("https://127.0.0.1:1", server.url)
    client = Client(https_config(addresses, pki.client_cert, pki.client_key, pki.server_cert))
    caplog.set_level(logging.DEBUG)
    try:
        assert client.get("/1.0")["environment"]["server_name"] == "m1"
        assert client.endpoint == server.url
    finally:
        client.close()
    key_text = Path(pki.client_key).read_text()
    assert key_text.splitlines()[1] not in caplog.text


def test_https_refuses_an_unknown_server(tls) -> None:  # type: ignore[no-untyped-def]
    server, pki = tls
    error = first_error(
        https_config((server.url,), pki.client_cert, pki.client_key, pki.other_cert)
    )
    assert "TLS verification failed" in str(error)
    assert not error.transient


def test_https_with_an_untrusted_client_certificate_fails(tls) -> None:  # type: ignore[no-untyped-def]
    server, pki = tls
    error = first_error(https_config((server.url,), pki.other_cert, pki.other_key, pki.server_cert))
    assert "\n" not in str(error)
    assert str(error).startswith(f"GET /1.0 at {server.url}: ")


def test_the_example_configuration_loads() -> None:
    from opendrs.controller.config import load_config

    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "incus.yaml")
    incus = config.backend.incus
    assert incus is not None
    assert (incus.socket, incus.project, incus.leader_only) == (INCUS_SOCKET, "default", True)
    assert (incus.placement_scriptlet, incus.scriptlet_timeout) == (True, 5.0)
    assert config.mode == "shadow"


def test_the_documented_backend_sections_parse() -> None:
    import re

    import yaml

    text = (Path(__file__).resolve().parents[2] / "docs" / "incus.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "backend:" in b]
    assert len(blocks) >= 2
    for block in blocks:
        parse({k: v for k, v in yaml.safe_load(block)["backend"].items() if k != "type"})


def test_platform_defaults_yield_to_the_policy_section() -> None:
    from opendrs.controller.config import with_platform_defaults

    config = parse_config(
        {
            "backend": {"type": "incus"},
            "policy": {"preset": "incus", "batch": 3, "options": {"max_moves": 3}},
        }
    )
    fields = {"interval": 600, "batch": 1, "cooldown": 3600, "options": {"threshold": 30.0}}
    changed, taken = with_platform_defaults(config, fields)
    assert (changed.policy.interval, changed.policy.batch, changed.policy.cooldown) == (
        600,
        3,
        3600,
    )
    assert dict(changed.policy.options) == {"threshold": 30.0, "max_moves": 3}
    assert changed.executor.cooldown == 3600
    assert taken == [
        "policy interval = 600",
        "policy cooldown = 3600",
        "policy option threshold = 30.0",
    ]
    assert with_platform_defaults(config, {}) == (config, [])


@pytest.mark.parametrize(("verify", "warned"), [(False, True), (True, False)])
def test_turning_tls_verification_off_is_warned_about(
    verify: bool, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    config = IncusConfig(addresses=("https://127.0.0.1:9",), verify=verify)
    with caplog.at_level(logging.WARNING, logger="opendrs.backends.incus"):
        IncusBackend(config, Settings())
    assert ("TLS verification of the Incus API is off" in caplog.text) is warned
