"""etcd v3 over gRPC (issue 21): each way an endpoint can be wrong is one line naming the
endpoint and the setting, and a setting to fix is not retried; answers above gRPC's default
4 MiB are read; failover across the members of a real three-member cluster, with the first
member down and with the leader killed in the middle of an apply."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tenacity import RetryCallState

from job.adapters.datastores.etcdv3 import EtcdV3Datastore
from job.adapters.retry import RetryPolicy
from job.config import Config, EtcdEndpoint
from tests.adapters.test_boundaries import html_server  # noqa: F401 (a fixture)
from tests.conftest import Harness, hosts_by_name, no_sleep_retry
from tests.support import calico
from tests.support import scenario as s
from tests.support.etcd_server import EtcdCluster, EtcdServer, TlsFiles, free_port, make_tls_files
from tests.support.hold import HoldingServer


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tls")


@pytest.fixture(scope="module")
def tls(tls_dir: Path) -> TlsFiles:
    return make_tls_files(tls_dir)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tls_files(tmp_path_factory.mktemp("other-tls")).ca


@pytest.fixture(scope="module")
def tls_etcd(tls: TlsFiles) -> Iterator[EtcdServer]:
    server = EtcdServer(tls=tls)
    server.start()
    yield server
    server.close()


def endpoint(scheme: str, port: int) -> tuple[EtcdEndpoint, ...]:
    return (EtcdEndpoint(scheme, "127.0.0.1", port),)


def failed(harness: Harness, config: Config) -> tuple[dict[str, Any], int, list[int]]:
    """The run's single error, its exit code, and the retries it made."""
    attempts: list[int] = []

    def count(state: RetryCallState) -> None:
        attempts.append(state.attempt_number)

    harness.retry = no_sleep_retry(attempts=3, before_sleep=(count,))
    report, code = harness.run(config)
    (error,) = report["errors"]
    assert "\n" not in error["message"] and "Traceback" not in error["message"]
    assert report["hosts"] == [] and report["summary"]["deleted"] == 0
    return error, code, attempts


def test_a_ca_that_did_not_sign_the_servers_certificate(
    harness: Harness, tls_etcd: EtcdServer, tls: TlsFiles, other_ca: Path
) -> None:
    config = harness.config(
        etcd_endpoints=endpoint("https", tls_etcd.client_port),
        etcd_ca_cert_file=other_ca,
        etcd_cert_file=tls.client_cert,
        etcd_key_file=tls.client_key,
    )
    error, code, attempts = failed(harness, config)
    assert code == 2 and error["kind"] == "tls" and attempts == [], "a setting to fix: no retries"
    assert error["message"].startswith(f"TLS to etcd at {tls_etcd.url} failed: its certificate is not trusted")
    assert "ETCD_CA_CERT_FILE" in error["message"] and "local issuer" in error["message"]


def test_a_client_certificate_and_key_without_a_ca_are_tls_all_the_same(
    harness: Harness, tls_etcd: EtcdServer, tls: TlsFiles
) -> None:
    # The etcd3 package's client falls back to plaintext here; this job trusts the system's roots
    # instead, which did not sign the test CA: refused, never sent in the clear.
    config = harness.config(
        etcd_endpoints=endpoint("https", tls_etcd.client_port),
        etcd_cert_file=tls.client_cert,
        etcd_key_file=tls.client_key,
    )
    error, code, _ = failed(harness, config)
    assert code == 2 and error["kind"] == "tls" and "not trusted" in error["message"]


def test_no_client_certificate_where_etcd_asks_for_one(harness: Harness, tls_etcd: EtcdServer, tls: TlsFiles) -> None:
    config = harness.config(etcd_endpoints=endpoint("https", tls_etcd.client_port), etcd_ca_cert_file=tls.ca)
    error, code, attempts = failed(harness, config)
    assert code == 2 and error["kind"] == "tls" and attempts == []
    assert f"etcd at {tls_etcd.url} refused the client certificate" in error["message"]
    assert "ETCD_CERT_FILE" in error["message"] and "ETCD_KEY_FILE" in error["message"]


def test_a_tls_port_given_as_http(harness: Harness, tls_etcd: EtcdServer) -> None:
    error, code, attempts = failed(harness, harness.config(etcd_endpoints=endpoint("http", tls_etcd.client_port)))
    assert code == 1 and error["kind"] == "unavailable" and attempts == [1, 2], "a proxy with etcd down looks alike"
    url = f"http://127.0.0.1:{tls_etcd.client_port}"
    assert f"etcd at {url} did not answer: the connection was closed at once" in error["message"]
    assert "a TLS port? then https:// with ETCD_CA_CERT_FILE" in error["message"]


def test_a_plaintext_port_given_as_https(harness: Harness, tls: TlsFiles) -> None:
    config = harness.config(etcd_endpoints=endpoint("https", harness.etcd.client_port), etcd_ca_cert_file=tls.ca)
    error, code, _ = failed(harness, config)
    assert code == 1 and error["kind"] == "unavailable"
    assert "closed at once (a plaintext port? then http://)" in error["message"]


def test_an_http_server_given_as_https(harness: Harness, html_server: str, tls: TlsFiles) -> None:  # noqa: F811
    port = int(html_server.rsplit(":", 1)[1])
    config = harness.config(etcd_endpoints=endpoint("https", port), etcd_ca_cert_file=tls.ca)
    error, code, attempts = failed(harness, config)
    assert code == 2 and error["kind"] == "tls" and attempts == []
    assert error["message"].startswith(f"https://127.0.0.1:{port} does not speak TLS: give the endpoint as http://")


def test_an_endpoint_that_never_answers_times_out(harness: Harness) -> None:
    holding = HoldingServer()
    url = holding.url
    try:
        port = int(url.rsplit(":", 1)[1])
        config = harness.config(etcd_endpoints=endpoint("http", port), etcd_timeout=timedelta(seconds=1))
        error, code, attempts = failed(harness, config)
    finally:
        holding.close()
    assert code == 1 and error["kind"] == "unavailable" and attempts == [1, 2]
    assert f"etcd at {url} did not answer: timed out after 1s" in error["message"]
    assert "ETCD_ENDPOINTS" in error["message"]


def test_an_unreachable_endpoint(harness: Harness) -> None:
    port = free_port()
    error, code, attempts = failed(harness, harness.config(etcd_endpoints=endpoint("http", port)))
    assert code == 1 and error["kind"] == "unavailable" and attempts == [1, 2]
    assert f"etcd at http://127.0.0.1:{port} did not answer: Connection refused; gave up" in error["message"]


def test_answers_above_grpcs_default_4_mib_are_read(etcd: EtcdServer) -> None:
    """A first page of 1,000 blocks is 5 MB: gRPC refuses answers above 4 MiB unless told otherwise."""
    prefix = "/calico/ipam/v2/handle/"
    value = "x" * 1_000_000
    for i in range(6):  # one a request: etcd takes 1.5 MiB a request at most
        calico.load(etcd.url, {f"{prefix}big-{i}": value})
    store = EtcdV3Datastore(Config(etcd_endpoints=endpoint("http", etcd.client_port), page_size=10), RetryPolicy())
    try:
        (page, _), *rest = store.scan(prefix)
    finally:
        store.close()
    assert len(page) == 6 and rest == [] and sum(len(kv.value) for kv in page) == 6_000_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    members = EtcdCluster()
    members.start()
    yield members
    members.close()


def on_cluster(harness: Harness, cluster: EtcdCluster) -> Harness:
    """The harness with its etcd one of the cluster's, the live member listed after the others."""
    for member in cluster.members:
        if member.process is None:
            member.start(wait=False)
    for member in cluster.members:
        member.wait_healthy()
    calico.wipe(cluster.members[0].url)
    return replace(harness, etcd=cluster.members[0])


def cluster_config(harness: Harness, cluster: EtcdCluster, first: EtcdServer) -> Config:
    members = [first, *[m for m in cluster.members if m is not first]]
    return harness.config(
        apply=True,
        etcd_endpoints=tuple(EtcdEndpoint("http", "127.0.0.1", m.client_port) for m in members),
    )


def test_the_first_member_down_costs_one_attempt_not_the_run(harness: Harness, cluster: EtcdCluster) -> None:
    harness = on_cluster(harness, cluster)
    harness.seed(s.kops_cluster())
    down = cluster.members[2]
    down.stop()
    harness.retry = RetryPolicy(attempts=4, sleep=lambda _: None)
    report, code = harness.run(cluster_config(harness, cluster, down))
    assert code == 0 and report["summary"]["deleted"] == 2, report["errors"]
    assert not [k for k in calico.dump(cluster.members[0].url) if s.POD_ORPHAN in k]


def test_the_leader_killed_in_the_middle_of_an_apply(harness: Harness, cluster: EtcdCluster) -> None:
    harness = on_cluster(harness, cluster)
    harness.seed(s.kops_cluster())
    leader = cluster.leader()
    killed: list[EtcdServer] = []

    def kill_the_leader() -> None:  # the re-check of the first host, just before its writes
        if not killed and leader.process is not None:
            leader.process.kill()
            leader.process.wait()
            leader.process = None
            killed.append(leader)

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", kill_the_leader)
    harness.retry = RetryPolicy(attempts=8, max_wait_s=0.5)  # the other two elect a leader meanwhile
    report, code = harness.run(cluster_config(harness, cluster, leader))
    assert killed, "the leader was killed during the apply"
    assert code == 0 and report["summary"]["deleted"] == 2, report["errors"]
    assert hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    survivor = next(m for m in cluster.members if m.process is not None)
    left = calico.dump(survivor.url)
    assert not [k for k in left if s.POD_ORPHAN in k or s.CONFLICT_ORPHAN in k]
    assert calico.ipam_problems({k: v for k, (v, _) in left.items()}) == []


@pytest.mark.parametrize(
    ("setting", "content", "said"),
    [
        ("etcd_key_file", b"not a key\n", "ETCD_KEY_FILE {path} is not a private key in PEM form"),
        ("etcd_key_file", "client_cert", "ETCD_KEY_FILE {path} is not a private key in PEM form"),
        ("etcd_key_file", "server_key", "ETCD_KEY_FILE {path} does not go with ETCD_CERT_FILE"),
        (
            "etcd_key_file",
            b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
            "ETCD_KEY_FILE {path} does not go with ETCD_CERT_FILE",
        ),
        ("etcd_key_file", b"-----BEGIN ENCRYPTED PRIVATE KEY-----\n", "ETCD_KEY_FILE {path} is an encrypted key"),
        ("etcd_cert_file", "client_key", "ETCD_CERT_FILE {path} is not a client certificate in PEM form"),
        ("etcd_ca_cert_file", b"", "ETCD_CA_CERT_FILE {path} is not a CA certificate in PEM form"),
    ],
    ids=[
        "garbage-key",
        "a-certificate-as-key",
        "another-key",
        "a-key-that-is-not-one",
        "encrypted",
        "a-key-as-cert",
        "empty-ca",
    ],
)
@pytest.mark.parametrize("datastore_type", ["etcdv3", "etcdv2"])
def test_a_tls_file_that_is_not_what_its_setting_says_is_named(
    harness: Harness,
    tls_etcd: EtcdServer,
    tls: TlsFiles,
    tmp_path: Path,
    setting: str,
    content: bytes | str,
    said: str,
    datastore_type: str,
) -> None:
    """Not an unreachable etcd: one line naming the file and its setting, exit 2, no attempt."""
    files = {"etcd_ca_cert_file": tls.ca, "etcd_cert_file": tls.client_cert, "etcd_key_file": tls.client_key}
    path = tmp_path / "given.pem"
    path.write_bytes(getattr(tls, content).read_bytes() if isinstance(content, str) else content)
    files[setting] = path
    config = harness.config(
        etcd_endpoints=endpoint("https", tls_etcd.client_port), datastore_type=datastore_type, **files
    )
    error, code, attempts = failed(harness, config)
    assert code == 2 and error["kind"] == "tls" and attempts == []
    assert error["message"].startswith(said.format(path=path)) and "\n" not in error["message"]
