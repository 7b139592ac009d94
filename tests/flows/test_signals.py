"""Signals and the Lease (issue 8, point 2): SIGTERM finishes the host in flight, starts no new
one, writes the report and releases the Lease, also as PID 1; a SIGKILLed run locks later runs
out for one short Lease duration at most; the Lease is renewed while the run reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Harness, hosts_by_name
from tests.support import calico
from tests.support.hold import HoldingGrpcServer, HoldingServer
from tests.support.job_process import REPO, job_argv, run_job
from tests.support.scenario import LEAK_CANDIDATES_POD, cross_borrowing_fleet
from tests.support.write_relay import Action as RelayAction
from tests.support.write_relay import Trigger, WriteRelay

LEASES = "/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases"
PID_ONE = ("unshare", "--pid", "--fork", "--kill-child")


def pid_namespaces_work() -> bool:
    try:
        return subprocess.run([*PID_ONE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def relay(harness: Harness) -> Iterator[WriteRelay]:
    relay = WriteRelay(harness.etcd)
    yield relay
    relay.close()


@pytest.fixture
def fleet(harness: Harness) -> None:
    harness.seed(cross_borrowing_fleet(3))


@pytest.mark.usefixtures("fleet")
@pytest.mark.parametrize(
    ("action", "as_pid_one"),
    [("sigterm", False), ("sigterm", True), ("sigint", False)],
    ids=["sigterm", "sigterm-pid-1", "sigint"],
)
def test_a_stop_signal_finishes_the_host_in_flight_reports_and_releases_the_lease(
    harness: Harness, relay: WriteRelay, action: RelayAction, as_pid_one: bool
) -> None:
    if as_pid_one and not pid_namespaces_work():
        pytest.skip("unshare --pid --fork is not permitted here")
    argv = job_argv(harness.kubeapi, relay, harness.tmp)
    # The signal arrives while the first host's second transaction is on its way to etcd.
    finished = run_job(argv, relay, Trigger(1, action), launcher=PID_ONE if as_pid_one else ())
    assert finished.code == 143, finished.stderr[-2000:]
    assert "Traceback" not in finished.stderr and f'"signal": "{action.upper()}"' in finished.stderr
    report = finished.report
    assert report is not None and report["outcome"] == "interrupted" and report["exit_code"] == 143
    hosts = hosts_by_name(report)
    assert (hosts["gone-0"]["action"], hosts["gone-0"]["reason"]) == ("deleted", "k8s_node_missing")
    for name in ("gone-1", "gone-2"):
        assert (hosts[name]["action"], hosts[name]["reason"]) == ("skipped", "interrupted")
    keys = harness.dump()
    assert not [k for k in keys if "gone-0" in k], "the host in flight is finished"
    assert f"{calico.R}nodes/gone-1" in keys and f"{calico.R}nodes/gone-2" in keys, "no new host is started"
    assert calico.ipam_problems({k: v for k, (v, _) in keys.items()}) == []
    lease = harness.kubeapi.get(LEASES, "calico-gc")
    assert lease is not None and "holderIdentity" not in lease["spec"], "the Lease is released"
    # The report kept before the writes (`unfinished`) is replaced by this one.
    keeper = harness.dependencies(harness.config()).reports
    assert keeper is not None
    assert [(k["run-id"], k["outcome"]) for k in keeper.list()] == [(report["run_id"], "interrupted")]


@pytest.mark.usefixtures("fleet")
def test_a_sigkilled_run_locks_out_the_next_for_one_short_lease_at_most(harness: Harness, relay: WriteRelay) -> None:
    argv = job_argv(harness.kubeapi, relay, harness.tmp)
    assert run_job(argv, relay, Trigger(1, "kill_after")).code == -signal.SIGKILL
    lease = harness.kubeapi.get(LEASES, "calico-gc")
    assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 120  # the default: 2 minutes
    config = harness.config(apply=True, max_orphan_fraction=1.0, lease_duration=timedelta(minutes=2))
    harness.now = datetime.now(UTC)
    report, code = harness.run(config, lock=True)
    assert code == 0 and report["outcome"] == "lock_held", "a live-looking Lease is respected"
    harness.now = datetime.now(UTC) + timedelta(minutes=2, seconds=1)
    report, code = harness.run(config, lock=True)
    assert code == 0 and report["lock"]["acquired"] and report["summary"]["deleted"] == 3


@pytest.mark.usefixtures("fleet")
def test_the_lease_is_renewed_while_the_run_is_still_reading(harness: Harness, relay: WriteRelay) -> None:
    renewed = threading.Event()
    renewals = []

    def count_renewal() -> None:
        renewals.append(1)
        if len(renewals) == 2:
            renewed.set()

    harness.kubeapi.on("PUT", f"^{LEASES}/calico-gc$", count_renewal, times=2)
    relay.reads_wait_for = renewed  # etcd answers no read until the Lease was renewed twice
    argv = job_argv(harness.kubeapi, relay, harness.tmp, "--lease-duration=3s")
    finished = run_job(argv, relay, None)
    assert renewed.is_set(), "the Lease was not renewed during the read"
    assert finished.code == 0, finished.stderr[-2000:]
    assert finished.report is not None and finished.report["summary"]["deleted"] == 3


@pytest.fixture
def holding() -> Iterator[HoldingServer]:
    server = HoldingServer()
    yield server
    server.close()


def stop_while_reading(argv: list[str], called: threading.Event) -> tuple[int, str, dict[str, Any] | None]:
    """Run the job, SIGTERM it once the held call has come in, and return its exit code, stderr and
    report. The run must end on its own: nothing answers the call it waits on."""
    report = next(Path(a.split("=", 1)[1]) for a in argv if a.startswith("--report-file="))
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ETCD_ENDPOINTS")}
    process = subprocess.Popen(argv, cwd=REPO, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert called.wait(timeout=60), "the job never made the call that hangs"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, stderr.decode(), json.loads(report.read_text()) if report.exists() else None


@pytest.mark.parametrize("datastore", ["etcdv3", "etcdv3-call-in-flight", "etcdv2"])
def test_a_stop_signal_never_waits_on_a_hung_datastore_read(
    harness: Harness, holding: HoldingServer, datastore: str
) -> None:
    """A server that takes the connection and says nothing, and (gRPC) one that takes the call
    and never answers it: the run ends at the signal, its call cancelled as the channel closes."""
    held: HoldingServer | HoldingGrpcServer = HoldingGrpcServer() if datastore.endswith("in-flight") else holding
    try:
        argv = [a for a in job_argv(harness.kubeapi, held, harness.tmp) if not a.startswith("--datastore-type")]
        argv.append(f"--datastore-type={datastore.split('-', 1)[0]}")
        code, stderr, report = stop_while_reading(argv, held.called)
    finally:
        if held is not holding:
            held.close()
    assert code == 143 and "Traceback" not in stderr, stderr[-2000:]
    assert report is not None and report["outcome"] == "interrupted" and report["exit_code"] == 143
    (error,) = report["errors"]
    assert error["kind"] == "interrupted" and "the Calico datastore" in error["message"]
    lease = harness.kubeapi.get(LEASES, "calico-gc")
    assert lease is not None and "holderIdentity" not in lease["spec"], "the Lease is released"


def test_a_stop_signal_never_waits_on_a_hung_pods_read(harness: Harness, holding: HoldingServer) -> None:
    harness.seed(cross_borrowing_fleet(3, leak=True))
    before = harness.dump()
    release = threading.Event()

    def hang() -> None:  # the leak check's read of the candidate's pod: the API server never answers it
        holding.called.set()
        release.wait(60)

    harness.kubeapi.on("GET", LEAK_CANDIDATES_POD, hang)
    try:
        argv = job_argv(harness.kubeapi, holding, harness.tmp, etcd_url=harness.etcd.url)
        code, stderr, report = stop_while_reading(argv, holding.called)
    finally:
        release.set()
    assert code == 143 and "Traceback" not in stderr, stderr[-2000:]
    assert report is not None and report["outcome"] == "interrupted"
    assert [e["kind"] for e in report["errors"]] == ["interrupted"] and "the pods" in report["errors"][0]["message"]
    assert harness.dump() == before, "a run stopped while reading writes nothing"
    lease = harness.kubeapi.get(LEASES, "calico-gc")
    assert lease is not None and "holderIdentity" not in lease["spec"], "the Lease is released"


def test_a_stopped_run_does_not_wait_on_a_hung_lease_release(harness: Harness, holding: HoldingServer) -> None:
    """When the API server is what hangs, the Lease cannot be given up: the run waits 2 s at most,
    says so, and exits 143 all the same (the Lease then expires on its own)."""
    harness.seed(cross_borrowing_fleet(3, leak=True))
    release = threading.Event()

    def hang_pods() -> None:
        holding.called.set()
        release.wait(120)

    def hang_lease_once_stopping() -> None:  # the Lease was taken before the pods were read
        if holding.called.is_set():
            release.wait(120)

    harness.kubeapi.on("GET", LEAK_CANDIDATES_POD, hang_pods)
    harness.kubeapi.on("GET", f"^{LEASES}/calico-gc$", hang_lease_once_stopping, times=100)
    try:
        argv = job_argv(harness.kubeapi, holding, harness.tmp, etcd_url=harness.etcd.url)
        code, stderr, report = stop_while_reading(argv, holding.called)
    finally:
        release.set()
    assert code == 143 and "Traceback" not in stderr, stderr[-2000:]
    assert report is not None and report["outcome"] == "interrupted"
    assert "lock_release_abandoned" in stderr
