"""etcd's own users (ETCD_USERNAME, ETCD_PASSWORD, as Calico's components take them), on a real
etcd with authentication on: a run reads and deletes as its user; a wrong password, no user, a
user without a role on /calico/ each end in one line naming the setting (exit 2); a token etcd no
longer takes is replaced, once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from job.adapters.datastores.etcd_grpc import EtcdGrpc
from job.config import Config, EtcdEndpoint, Secret, effective
from tests.conftest import Harness, hosts_by_name, no_sleep_retry
from tests.support import calico, calico2
from tests.support import scenario as s
from tests.support.etcd_server import EtcdServer
from tests.support.kubeapi import KubeApiServer

USER, PASSWORD = "calico-gc", "its-password"


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own: authentication, once on, stays on."""
    (tmp_path / "etcd").mkdir()
    server = EtcdServer(tmp_path / "etcd")
    server.start()
    yield server
    server.close()


def harness_on(etcd: EtcdServer, kubeapi: KubeApiServer, tmp_path: Path) -> Harness:
    harness = Harness(etcd, kubeapi, tmp_path)
    harness.seed(s.kops_cluster())
    return harness


def as_user(harness: Harness, user: str | None = USER, password: str = PASSWORD, **overrides: object) -> Config:
    return harness.config(etcd_username=user, etcd_password=Secret(password if user else ""), **overrides)


def test_a_run_reads_and_deletes_as_its_etcd_user(own_etcd: EtcdServer, kubeapi: KubeApiServer, tmp_path: Path) -> None:
    harness = harness_on(own_etcd, kubeapi, tmp_path)
    own_etcd.enable_auth({USER: PASSWORD})
    with capture_logs() as logs:
        report, code = harness.run(as_user(harness, apply=True))
    assert code == 0 and report["errors"] == []
    assert hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    (clear,) = [line for line in logs if line["event"] == "etcd_password_in_the_clear"]
    assert clear["endpoints"] == [own_etcd.url], "a password sent to an http:// endpoint is said at start"
    again, code = harness.run(as_user(harness))
    assert code == 0 and s.POD_ORPHAN not in hosts_by_name(again)


@pytest.mark.parametrize(
    ("user", "password", "prefix", "said"),
    [
        (USER, "wrong", "/calico/", "refused user 'calico-gc': etcdserver: authentication failed, invalid user ID or "
         "password; check ETCD_USERNAME and ETCD_PASSWORD"),
        (None, "", "/calico/", "has authentication on and was given no user (etcdserver: user name is empty): set "
         "ETCD_USERNAME and ETCD_PASSWORD"),
        (USER, PASSWORD, None, "refused Range (etcdserver: permission denied): the etcd user (ETCD_USERNAME, or the "
         "client certificate's common name) needs a role that may read and write the /calico/ prefix"),
    ],
)  # fmt: skip
def test_a_user_etcd_refuses_is_a_setting_to_fix_in_one_line(
    own_etcd: EtcdServer,
    kubeapi: KubeApiServer,
    tmp_path: Path,
    user: str | None,
    password: str,
    prefix: str | None,
    said: str,
) -> None:
    harness = harness_on(own_etcd, kubeapi, tmp_path)
    own_etcd.enable_auth({USER: PASSWORD}, prefix=prefix)
    report, code = harness.run(as_user(harness, user, password, apply=True))
    (error,) = report["errors"]
    assert code == 2 and error["kind"] == "unauthorized" and said in error["message"], error
    assert error["message"].startswith(f"etcd at {own_etcd.url} ")


def test_a_token_etcd_no_longer_takes_is_replaced_once(own_etcd: EtcdServer, tmp_path: Path) -> None:
    """etcd no longer takes the token a call carries ("invalid auth token": it expired, or the
    user's password was set since): a new one is asked for and the call made again."""
    calico.load(own_etcd.url, {"/calico/resources/v3/projectcalico.org/nodes/a": "{}"})
    own_etcd.enable_auth({USER: PASSWORD})
    endpoint = EtcdEndpoint("http", "127.0.0.1", own_etcd.client_port)
    config = Config(etcd_endpoints=(endpoint,), etcd_username=USER, etcd_password=Secret(PASSWORD))
    client = EtcdGrpc(config, no_sleep_retry())
    try:
        key = b"/calico/resources/v3/projectcalico.org/nodes/a"
        assert len(client.get([key], 0)) == 1
        own_etcd.set_password(USER, PASSWORD)  # every token it had is dropped
        assert len(client.get([key], 0)) == 1
        own_etcd.set_password(USER, PASSWORD)
        assert client.write_if_unchanged([(key, 0, b"{}")]) is False  # a conditional write, refused as such
    finally:
        client.close()


def test_the_password_is_never_in_the_log_line_at_start(
    own_etcd: EtcdServer, kubeapi: KubeApiServer, tmp_path: Path
) -> None:
    harness = harness_on(own_etcd, kubeapi, tmp_path)
    shown = effective(as_user(harness))
    assert shown["etcd_username"] == USER and shown["etcd_password"] == "(set)"
    assert PASSWORD not in repr(as_user(harness)) and PASSWORD not in str(shown)


@pytest.mark.parametrize(("password", "code"), [(PASSWORD, 0), ("wrong", 2)])
def test_calico_2_on_etcd_v2_runs_as_its_user(
    own_etcd: EtcdServer, kubeapi: KubeApiServer, tmp_path: Path, password: str, code: int
) -> None:
    """etcd v2's users, by HTTP basic authentication, as Calico 2.x's components send them."""
    seed, nodes = calico2.kops_18_cluster()
    seed.load(own_etcd.url)
    for name, ip in nodes:
        kubeapi.add_node(name, ip)
    own_etcd.enable_v2_auth(USER, PASSWORD)
    harness = Harness(own_etcd, kubeapi, tmp_path)
    report, exit_code = harness.run(as_user(harness, USER, password, datastore_type="etcdv2", apply=True))
    assert exit_code == code
    if code == 0:
        assert report["summary"]["deleted"] == 2 and report["errors"] == []
    else:
        (error,) = report["errors"]
        assert error["kind"] == "unauthorized" and "refused the request (HTTP 401" in error["message"]
        assert error["message"].endswith("check ETCD_USERNAME and ETCD_PASSWORD, or ETCD_CERT_FILE and ETCD_KEY_FILE")
