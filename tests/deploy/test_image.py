"""The container image, built from the repository's Dockerfile and run as the CronJob runs it
(user 10001, read-only root, no capabilities, no-new-privileges, /tmp a tmpfs) against the real
etcd and the Kubernetes API test server: dry run, apply, TLS with the certificates mounted as
the manifests mount them, and SIGTERM to the job as PID 1. `make test` runs it (.ci/run installs
buildah, podman, runc and mmdebstrap); `make test-fast` skips it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness
from tests.support import calico, image
from tests.support import scenario as s
from tests.support.etcd_server import EtcdServer, make_tls_files
from tests.support.hold import HoldingGrpcServer
from tests.support.write_relay import Trigger, WriteRelay

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built() -> str:
    missing = image.missing_tools()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install {', '.join(missing)} (see .ci/run)")
        pytest.skip(f"not installed: {', '.join(missing)} (apt-get install buildah podman runc mmdebstrap)")
    tag = image.build()
    print(f"\nimage {tag}: {image.image_size() / 1e6:.0f} MB")
    return tag


def env_for(harness: Harness, **extra: str) -> dict[str, str]:
    return {
        "ETCD_ENDPOINTS": harness.etcd.url,
        "KUBECONFIG": "/config/kubeconfig",
        "POD_NAMESPACE": "calico-gc",
        "POD_NAME": "calico-gc-test",
        "CALICO_GC_STATE_FILE": "/tmp/state.json",
        "DATASTORE_TYPE": "etcdv3",
        "CALICO_GC_GRACE_PERIOD": "0s",
        "CALICO_GC_OUTPUT": "json",
        **extra,
    }


def mounts(harness: Harness) -> list[tuple[Path, str]]:
    config = harness.tmp / "config"
    config.mkdir(exist_ok=True)
    harness.kubeapi.write_kubeconfig(config / "kubeconfig").chmod(0o644)
    return [(config, "/config")]


def report_of(ran: image.Ran) -> dict[str, Any]:
    assert "Traceback" not in ran.stderr, ran.stderr[-3000:]
    document: dict[str, Any] = json.loads(ran.stdout)
    return document


# Every module the job imports, with a source file, whose bytecode is missing or stale: the
# container would compile it on every run (read-only root, PYTHONDONTWRITEBYTECODE).
UNCOMPILED = """
import os, sys
import job.cli, job.adapters.health, job.adapters.lease, job.adapters.datastores.kdd
found = []
for name, module in list(sys.modules.items()):
    spec = getattr(module, "__spec__", None)
    if spec is None or not spec.cached or not (spec.origin or "").endswith(".py"):
        continue
    try:
        with open(spec.cached, "rb") as pyc:
            header = pyc.read(16)
    except OSError:
        found.append(name)
        continue
    if int.from_bytes(header[4:8], "little") & 1:
        continue  # hash-based: valid whatever the source's timestamp
    stat = os.stat(spec.origin)
    stamp = (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    if (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little")) != stamp:
        found.append(name)
print(len(found), *sorted(found)[:20])
"""


def test_every_module_the_job_imports_is_shipped_compiled(built: str) -> None:
    ran = subprocess.run(
        [*image.RUN, "--rm", "--user", "10001:10001", "--read-only", "--entrypoint", "python", built, "-c", UNCOMPILED],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert ran == ["0"], f"compiled at every run: {' '.join(ran[1:])}"


def test_the_image_runs_as_shipped_and_keeps_nothing_of_the_build_host(built: str) -> None:
    script = (
        'echo "$HOME"; id -u; sha256sum /etc/ssl/certs/ca-certificates.crt; '
        "python -c 'import job.cli, job.adapters.health, job.adapters.lease, job.adapters.datastores.kdd' "
        "&& echo imports-ok; "
        "ls /venv/bin/pip /venv/lib/python3.11/site-packages/kubernetes/aio 2>&1 | grep -c 'No such file'"
    )
    ran = subprocess.run(
        [*image.RUN, "--rm", "--user", "10001:10001", "--read-only", "--entrypoint", "sh", built, "-c", script],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    assert ran[0] == "/tmp" and ran[1] == "10001"
    base = subprocess.run(
        [*image.RUN, "--rm", "--entrypoint", "sha256sum", image.BASE, "/etc/ssl/certs/ca-certificates.crt"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert ran[2].split()[0] == base.split()[0], "the CA bundle mounted for the build is not in the image"
    assert ran[3] == "imports-ok", "everything the job imports is in the image"
    assert ran[4] == "2", "neither pip nor the unused kubernetes.aio is shipped"


def test_dry_run_then_apply_as_the_cronjob_runs_it(built: str, harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    dry = image.run_as_cronjob([], env_for(harness), mounts(harness))
    report = report_of(dry)
    assert dry.code == 0 and report["mode"] == "dry-run" and report["summary"]["would_delete"] == 2
    assert report["lock"]["acquired"], "the Lease is taken as in a cluster"
    assert harness.dump() == before
    applied = image.run_as_cronjob([], env_for(harness, CALICO_GC_APPLY="true"), mounts(harness))
    report = report_of(applied)
    assert applied.code == 0 and report["summary"]["deleted"] == 2
    assert not [k for k in harness.dump() if s.POD_ORPHAN in k]


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[EtcdServer, Path]]:
    tls = make_tls_files(tmp_path)
    server = EtcdServer(tls=tls)
    server.start()
    # As the calico-etcd-secrets Secret is mounted: etcd-ca, etcd-cert, etcd-key, mode 0440,
    # group 10001 (the pod's fsGroup).
    secrets = tmp_path / "calico-secrets"
    secrets.mkdir()
    for name, source in (("etcd-ca", tls.ca), ("etcd-cert", tls.client_cert), ("etcd-key", tls.client_key)):
        shutil.copy(source, secrets / name)
        os.chown(secrets / name, 0, 10001)
        (secrets / name).chmod(0o440)
    yield server, secrets
    server.close()


def test_tls_to_etcd_with_the_certificates_mounted_as_the_manifests_mount_them(
    built: str, harness: Harness, tls_etcd: tuple[EtcdServer, Path]
) -> None:
    server, secrets = tls_etcd
    session = calico._session()
    session.verify = str(secrets / "etcd-ca")
    session.cert = (str(secrets / "etcd-cert"), str(secrets / "etcd-key"))
    scenario = s.kops_cluster()
    calico.load(server.url, scenario.seed.keys, session)
    for name, ip in scenario.k8s_nodes:
        harness.kubeapi.add_node(name, ip)
    env = env_for(
        harness,
        ETCD_ENDPOINTS=server.url,
        ETCD_CA_CERT_FILE="/calico-secrets/etcd-ca",
        ETCD_CERT_FILE="/calico-secrets/etcd-cert",
        ETCD_KEY_FILE="/calico-secrets/etcd-key",
    )
    ran = image.run_as_cronjob([], env, [*mounts(harness), (secrets, "/calico-secrets")])
    report = report_of(ran)
    assert ran.code == 0 and report["summary"]["would_delete"] == 2 and report["errors"] == []


def test_sigterm_to_the_job_as_pid_1_of_the_container(built: str, harness: Harness) -> None:
    harness.seed(s.cross_borrowing_fleet(3))
    relay = WriteRelay(harness.etcd)
    name = f"calico-gc-sigterm-{os.getpid()}"

    def to_container(signum: int) -> None:
        subprocess.run(["podman", "kill", "--signal", signal.Signals(signum).name, name], check=True)

    relay.send_signal = to_container
    relay.reset(Trigger(1, "sigterm"))
    try:
        env = env_for(
            harness,
            ETCD_ENDPOINTS=relay.url,
            CALICO_GC_APPLY="true",
            CALICO_GC_MAX_ORPHAN_FRACTION="1",
        )
        ran = image.run_as_cronjob([], env, mounts(harness), name=name)
    finally:
        relay.close()
    assert relay.fired.is_set()
    report = report_of(ran)
    assert ran.code == 143 and report["outcome"] == "interrupted", ran.stderr[-2000:]
    actions = sorted((h["name"], h["action"]) for h in report["hosts"])
    assert actions == [("gone-0", "deleted"), ("gone-1", "skipped"), ("gone-2", "skipped")]


LEASES = "/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases"


def test_podman_stop_while_etcd_holds_a_grpc_call_ends_the_run_and_releases_the_lease(
    built: str, harness: Harness
) -> None:
    """etcd takes the call and never answers: `podman stop -t 10` (SIGTERM to python as PID 1,
    SIGKILL 10 s later) ends the run on the SIGTERM, with its report, exit 143 and the Lease given
    back, so that the next run is not locked out."""
    held = HoldingGrpcServer()
    name = f"calico-gc-hung-{os.getpid()}"
    env = env_for(harness, ETCD_ENDPOINTS=held.url, CALICO_GC_LOCK="lease")
    process = subprocess.Popen(
        image.cronjob_argv([], env, mounts(harness), name=name),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert held.called.wait(timeout=120), "the job never made the call that hangs"
        subprocess.run(["podman", "stop", "-t", "10", name], check=True, capture_output=True, timeout=60)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        held.close()
    assert process.returncode == 143, f"killed at podman's deadline, not ended on SIGTERM: {stderr[-2000:]}"
    report = report_of(image.Ran(process.returncode, stdout, stderr))
    assert report["outcome"] == "interrupted" and report["errors"][0]["kind"] == "interrupted"
    lease = harness.kubeapi.get(LEASES, "calico-gc")
    assert lease is not None and "holderIdentity" not in lease["spec"], "the Lease is released"
