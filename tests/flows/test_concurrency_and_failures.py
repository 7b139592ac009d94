"""Races and outages: the lock, the state ConfigMap, a Node re-created mid-run, a key that
changes under a delete, etcd going away mid-run, and TLS with client certificates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from tenacity import RetryCallState

from job.adapters.datastores.etcdv3 import EtcdV3Datastore
from job.adapters.kube import Kube, api_client
from job.adapters.state import ConfigMapStateStore
from job.config import Config, EtcdEndpoint
from job.core.ipam import block_shape_problem
from job.flows.run import Dependencies
from tests.conftest import Harness, applied_losing_answers, down_at_the_first_write, hosts_by_name, no_sleep_retry
from tests.support import calico
from tests.support import scenario as s
from tests.support.cut_link import CutLink
from tests.support.etcd_server import EtcdServer, make_tls_files

LEASES = "/apis/coordination.k8s.io/v1/namespaces/calico-gc/leases"
CONFIGMAPS = "/api/v1/namespaces/calico-gc/configmaps"
ORPHAN_BLOCK_KEY = "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"  # the pod orphan's block


def lease(holder: str, renewed: str, seconds: int = 3600) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "calico-gc", "namespace": "calico-gc"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": renewed},
    }


def test_lock_held_by_another_run_exits_0_and_touches_nothing(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.put(LEASES, lease("manual-run", "2026-11-30T11:50:00.000000Z"))
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True), lock=True)
    assert code == 0 and report["outcome"] == "lock_held"
    assert report["lock"] == {"mode": "none", "acquired": False, "holder": "manual-run"}
    assert harness.dump() == before
    assert harness.kubeapi.count("GET", "^/api/v1/nodes") == 0, "nothing is read without the lock"


@pytest.mark.parametrize(
    ("renewed", "seconds", "outcome"),
    [("9999-12-31T23:59:59.999999Z", 2**31 - 1, "lock_held"), ("0001-01-01T00:00:00.000000Z", 2**31 - 1, "ok")],
)
def test_a_lease_renewed_at_either_end_of_time_is_decided(
    harness: Harness, renewed: str, seconds: int, outcome: str
) -> None:
    """A Lease another holder renewed in the year 9999 (a clock gone wrong) is held, not an
    OverflowError (the run's `unexpected`, exit 1): the expiry is worked out as time left, which
    cannot overflow. One renewed in the year 1, for the longest duration a Lease takes, expired."""
    harness.seed(s.kops_cluster())
    harness.kubeapi.put(LEASES, lease("clock-gone-wrong", renewed, seconds=seconds))
    report, code = harness.run(harness.config(), lock=True)
    assert (code, report["outcome"]) == (0, outcome)


# Answers to the Lease's GET that are no Lease (a proxy's), each with the field the error names.
NOT_A_LEASE = [
    ({"kind": "Lease", "spec": ["calico-gc"]}, "`$.spec`"),
    (
        {"kind": "Lease", "spec": {"renewTime": "2026-11-30T11:50:00.000000Z", "leaseDurationSeconds": "1h"}},
        "`$.spec.leaseDurationSeconds`",
    ),
    ({"kind": "Lease", "spec": {"holderIdentity": 7}}, "`$.spec.holderIdentity`"),
    ({"kind": "Lease", "spec": {"leaseTransitions": 2**40}}, "`$.spec.leaseTransitions`"),
]


@pytest.mark.parametrize(("answer", "field"), NOT_A_LEASE)
def test_a_lease_the_job_cannot_read_is_one_line_and_nothing_is_done(
    harness: Harness, answer: dict[str, Any], field: str
) -> None:
    """The Lease answered in a shape the lock cannot read: one `bad_answer` line naming the
    field, exit 2 (as any `bad_answer`), nothing read or written. It was a traceback (`spec` not an object, a duration
    that is no number), or a holder taken from a number."""
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("GET", f"^{LEASES}/calico-gc$", 200, body=answer)
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True), lock=True)
    assert (code, report["outcome"]) == (2, "error"), "a server or proxy to look at, as any bad_answer"
    [error] = report["errors"]
    assert error["kind"] == "bad_answer" and "is not a Lease" in error["message"], error
    assert field in error["message"], error["message"]
    assert harness.dump() == before and harness.kubeapi.count("GET", "^/api/v1/nodes") == 0


def test_a_lease_taken_over_at_the_end_of_its_transitions_count_keeps_it_there(harness: Harness) -> None:
    """An expired Lease whose leaseTransitions is int32's largest: taken over, the count stays
    there, where one more was a write the API server refuses (`invalid`, "a bug in calico-gc")."""
    harness.seed(s.kops_cluster())
    expired = lease("crashed-run", "2026-11-30T10:00:00.000000Z", seconds=600)
    expired["spec"] = {**expired["spec"], "leaseTransitions": 2**31 - 1}  # type: ignore[dict-item]
    harness.kubeapi.put(LEASES, expired)
    report, code = harness.run(harness.config(), lock=True)
    assert (code, report["outcome"], report["errors"]) == (0, "ok", [])
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and held["spec"]["leaseTransitions"] == 2**31 - 1


def test_a_lease_that_is_no_lease_when_released_only_warns(harness: Harness) -> None:
    """The Lease, taken, reads as no Lease when the run gives it up: the run's own result stands
    (the Lease expires on its own, one short duration later); it was a traceback."""
    harness.seed(s.kops_cluster())
    broken = {"kind": "Lease", "spec": ["calico-gc"]}
    harness.kubeapi.on(
        "POST", f"^{LEASES}$", lambda: harness.kubeapi.fail("GET", f"^{LEASES}/calico-gc$", 200, body=broken)
    )
    report, code = harness.run(harness.config(), lock=True)
    assert (code, report["outcome"], report["errors"]) == (0, "ok", [])
    assert report["lock"]["acquired"] is True
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and held["spec"]["holderIdentity"], "not given up: it expires on its own"


def test_expired_lock_is_taken_over_and_released_at_the_end(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.put(LEASES, lease("crashed-run", "2026-11-30T10:00:00.000000Z", seconds=600))
    report, code = harness.run(harness.config(apply=True), lock=True)
    assert code == 0 and report["summary"]["deleted"] == 2
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and "holderIdentity" not in held["spec"]
    assert held["spec"]["leaseTransitions"] == 1


def test_free_lock_is_created_then_released(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    _, code = harness.run(harness.config(), lock=True)
    assert code == 0
    assert harness.kubeapi.count("POST", f"^{LEASES}$") == 1
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and "holderIdentity" not in held["spec"]


def test_losing_the_lease_race_on_create_is_lock_held(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("POST", f"^{LEASES}$", 409)
    report, code = harness.run(harness.config(apply=True), lock=True)
    assert (code, report["outcome"]) == (0, "lock_held")


def test_a_lease_taken_or_renewed_whose_answer_was_lost_is_held(harness: Harness) -> None:
    """The create, then a renewal, are carried out and their answers lost; each retry conflicts
    with its own first try. The run holds the Lease all the same, deletes, and releases it."""
    harness.seed(s.kops_cluster())
    harness.kubeapi.lose("POST", f"^{LEASES}$")
    harness.kubeapi.lose("PUT", f"^{LEASES}/calico-gc$")  # the first renewal
    report, code = harness.run(renewing_at_every_host(harness), lock=True)
    assert (code, report["outcome"]) == (0, "ok") and report["summary"]["deleted"] == 2
    assert harness.kubeapi.count("POST", f"^{LEASES}$") == 2, "the create was tried again"
    assert harness.kubeapi.losses[1].times == 0, "a renewal's answer was lost"
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and "holderIdentity" not in held["spec"], "released at the end"


def renewing_at_every_host(harness: Harness) -> Config:
    """An apply with the shortest Lease the job takes (3 s; a real server refuses 0), and a clock
    that each read of Nodes moves on 2 s (the list after the Lease is taken, each host's re-check):
    every host renews it (a third of its duration)."""

    def tick() -> None:
        harness.now += timedelta(seconds=2)

    harness.kubeapi.on("GET", "^/api/v1/nodes(/[^/]+)?$", tick, times=1000)
    return harness.config(apply=True, lease_duration=timedelta(seconds=3))


def test_a_run_whose_lease_was_taken_over_stops_deleting(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()

    def another_run_takes_the_lease() -> None:
        taken = harness.kubeapi.get(LEASES, "calico-gc")
        assert taken is not None and taken["spec"]["holderIdentity"].startswith("test-run-")
        harness.kubeapi.put(LEASES, {**taken, "spec": {**taken["spec"], "holderIdentity": "other-run"}})

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.CONFLICT_ORPHAN}$", another_run_takes_the_lease)
    report, code = harness.run(renewing_at_every_host(harness), lock=True)
    hosts = hosts_by_name(report)
    assert code == 0 and hosts[s.CONFLICT_ORPHAN]["action"] == "deleted"
    assert (hosts[s.POD_ORPHAN]["action"], hosts[s.POD_ORPHAN]["reason"]) == ("skipped", "lock_lost")
    assert {k: v for k, v in harness.dump().items() if s.POD_ORPHAN in k} == {
        k: v for k, v in before.items() if s.POD_ORPHAN in k
    }
    held = harness.kubeapi.get(LEASES, "calico-gc")
    assert held is not None and held["spec"]["holderIdentity"] == "other-run", "not released: it is not ours"


def test_the_lease_is_renewed_while_deleting(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.run(renewing_at_every_host(harness), lock=True)
    assert harness.kubeapi.count("PUT", f"^{LEASES}/calico-gc$") >= 3  # two renewals and the release


def configmap_store(harness: Harness) -> ConfigMapStateStore:
    config = harness.config()
    return ConfigMapStateStore(Kube(api_client(config), harness.retry), "calico-gc", "calico-gc-state")


def test_grace_state_lives_in_a_configmap_across_runs(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    config = harness.config(apply=True, grace_period=timedelta(minutes=30), conflict_grace_period=timedelta(minutes=30))
    harness.run(config, state=configmap_store(harness))
    stored = harness.kubeapi.get(CONFIGMAPS, "calico-gc-state")
    assert stored is not None
    assert set(json.loads(stored["data"]["state.json"])["orphans"]) == {s.CONFLICT_ORPHAN, s.POD_ORPHAN}
    harness.now += timedelta(minutes=30)
    report, _ = harness.run(config, state=configmap_store(harness))
    assert report["summary"]["deleted"] == 2
    stored = harness.kubeapi.get(CONFIGMAPS, "calico-gc-state")
    assert stored is not None and json.loads(stored["data"]["state.json"])["orphans"] == {}


def test_conflict_on_the_state_configmap_rereads_and_keeps_the_earliest_sighting(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    config = harness.config(grace_period=timedelta(minutes=30), conflict_grace_period=timedelta(minutes=30))
    harness.run(config, state=configmap_store(harness))
    earlier = {"schema": 1, "orphans": {s.POD_ORPHAN: "2026-11-30T09:00:00Z", "gone-meanwhile": "2026-11-30T09:00:00Z"}}

    def concurrent_writer() -> None:
        current = harness.kubeapi.get(CONFIGMAPS, "calico-gc-state")
        assert current is not None
        harness.kubeapi.put(CONFIGMAPS, {**current, "data": {"state.json": json.dumps(earlier)}})

    harness.kubeapi.on("PUT", f"^{CONFIGMAPS}/calico-gc-state$", concurrent_writer)
    harness.now += timedelta(minutes=1)
    report, code = harness.run(config, state=configmap_store(harness))
    assert code == 0 and not report["errors"]
    stored = harness.kubeapi.get(CONFIGMAPS, "calico-gc-state")
    assert stored is not None
    assert json.loads(stored["data"]["state.json"])["orphans"] == {
        s.CONFLICT_ORPHAN: "2026-11-30T12:00:00Z",
        s.POD_ORPHAN: "2026-11-30T09:00:00Z",
    }
    assert harness.kubeapi.count("PUT", f"^{CONFIGMAPS}/calico-gc-state$") == 2


def test_node_recreated_between_plan_and_delete_spares_the_host(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", lambda: harness.kubeapi.add_node(s.POD_ORPHAN))
    before = harness.dump()
    report, code = harness.run(harness.config(apply=True))
    hosts = hosts_by_name(report)
    assert code == 0
    assert (hosts[s.POD_ORPHAN]["action"], hosts[s.POD_ORPHAN]["reason"]) == ("skipped", "k8s_node_recreated")
    assert hosts[s.CONFLICT_ORPHAN]["action"] == "deleted"
    assert {k: v for k, v in harness.dump().items() if s.POD_ORPHAN in k} == {
        k: v for k, v in before.items() if s.POD_ORPHAN in k
    }


def test_a_node_back_while_its_writes_conflict_is_checked_again_before_the_next_write(harness: Harness) -> None:
    """The Node is gone at the first re-check; its calico-node, back, rewrites its Calico Node, so
    the last step conflicts. The re-plan that follows must not delete what the Node wrote."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    node_key = next(k for k in scenario.seed.keys if k.endswith(f"/nodes/{s.POD_ORPHAN}"))
    rewritten = json.loads(scenario.seed.keys[node_key])
    rewritten["spec"]["bgp"]["ipv4Address"] = "10.0.1.20/24"
    rechecks = []

    def the_node_comes_back() -> None:
        rechecks.append(1)
        if len(rechecks) == 1:  # answered 404; meanwhile calico-node starts on the new Node
            calico.load(harness.etcd.url, {node_key: json.dumps(rewritten)})
        else:
            harness.kubeapi.add_node(s.POD_ORPHAN)

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", the_node_comes_back, times=2)
    report, code = harness.run(harness.config(apply=True))
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert code == 0 and (entry["action"], entry["reason"]) == ("skipped", "k8s_node_recreated")
    assert len(rechecks) == 2, "checked before the first write and again after the conflict"
    assert json.loads(harness.dump()[node_key][0]) == rewritten, "the Calico Node the new node wrote stays"
    written = [c["key"] for c in entry["changes"]]
    assert written and node_key not in written, "the report says what was written before the conflict"
    assert hosts_by_name(report)[s.CONFLICT_ORPHAN]["action"] == "deleted"
    document, _ = harness.restore(source=report)
    restorable = {h["name"]: h for h in document["hosts"]}[s.POD_ORPHAN]
    assert restorable["action"] == "would_restore", "what was written is what a restore can put back"
    assert {c["key"] for c in restorable["changes"]} <= set(written)


def test_a_calico_node_written_during_the_run_is_not_deleted_by_it(harness: Harness) -> None:
    """The orphan's Calico Node is rewritten, mid-run, by a calico-node whose Kubernetes Node has
    another name (its orchRef now names a live Node). The re-plan after the conflict knows the
    host by what the read parsed of it: a Calico Node written meanwhile is left to the next run,
    which reads its orchRef afresh (and finds it live)."""
    scenario = s.kops_cluster()
    harness.seed(scenario)
    node_key = next(k for k in scenario.seed.keys if k.endswith(f"/nodes/{s.POD_ORPHAN}"))
    rewritten = json.loads(scenario.seed.keys[node_key])
    rewritten["spec"]["orchRefs"] = [{"nodeName": s.LIVE[0], "orchestrator": "k8s"}]

    def calico_node_rewrites_it() -> None:
        calico.load(harness.etcd.url, {node_key: json.dumps(rewritten)})

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", calico_node_rewrites_it)
    report, code = harness.run(harness.config(apply=True))
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert code == 0 and (entry["action"], entry["reason"]) == ("skipped", "calico_node_written")
    assert json.loads(harness.dump()[node_key][0]) == rewritten
    assert entry["changes"] and node_key not in [c["key"] for c in entry["changes"]]
    again, _ = harness.run(harness.config(apply=True))
    assert s.POD_ORPHAN not in hosts_by_name(again), "live now, by its new orchRef"


def test_recheck_that_keeps_failing_marks_the_host_failed_exit_4(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    harness.kubeapi.fail("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", 500, times=100)
    report, code = harness.run(harness.config(apply=True))
    assert code == 4 and report["outcome"] == "partial_failure"
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert (entry["action"], entry["reason"]) == ("failed", "k8s_recheck_failed") and entry["changes"] == []
    assert hosts_by_name(report)[s.CONFLICT_ORPHAN]["action"] == "deleted", "the run goes on with the others"


def test_key_changed_under_a_delete_is_reread_and_decided_again(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = s.kops_cluster()
    harness.seed(scenario)
    block_key = "/calico/ipam/v2/assignment/ipv4/block/100.96.20.0-26"

    def someone_allocates_in_the_orphans_block() -> None:
        seed = scenario.seed
        known = dict(seed.keys)
        seed.pod(s.LIVE[2], "shop", "late-pod", "100.96.20.30")  # its handle, block and endpoint
        calico.load(harness.etcd.url, {k: v for k, v in seed.keys.items() if known.get(k) != v})

    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", someone_allocates_in_the_orphans_block)
    reads = []
    real = EtcdV3Datastore.read
    monkeypatch.setattr(EtcdV3Datastore, "read", lambda self, *a: reads.append(1) or real(self, *a))
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and hosts_by_name(report)[s.POD_ORPHAN]["action"] == "deleted"
    block = json.loads(harness.dump()[block_key][0])
    pods = sorted(a["secondary"]["pod"] for a in block["attributes"])
    assert pods == ["api-1", "late-pod"], "the allocation made meanwhile survives"
    assert block["allocations"][30] is not None and block["affinity"] is None
    assert len(reads) == 1, "the conflict re-read only the host's own keys, not the datastore"
    assert calico.ipam_problems({k: v for k, (v, _) in harness.dump().items()}) == []


@pytest.fixture
def outage(harness: Harness) -> Iterator[Harness]:
    yield harness
    if harness.etcd.process is None:
        harness.etcd.start()


def test_etcd_stopped_mid_run_then_back_is_retried(outage: Harness) -> None:
    harness = outage
    harness.seed(s.kops_cluster())
    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", harness.etcd.stop)

    made: list[Dependencies] = []
    dependencies = harness.dependencies

    def capturing(config: Config, **kwargs: Any) -> Dependencies:
        made.append(dependencies(config, **kwargs))
        return made[-1]

    def restart_on_second_retry(state: RetryCallState) -> None:
        if state.attempt_number == 2 and harness.etcd.process is None:
            harness.etcd.start()
            # The retries here do not sleep, as the real policy does: wait instead for the job's
            # channel to dial again (its reconnect backoff, at most 1 s), or the next attempts all
            # find it still backing off and the test depends on the machine's timing.
            etcd = made[0].datastore._etcd
            grpc.channel_ready_future(etcd._channels[0]).result(timeout=30)

    harness.dependencies = capturing
    harness.retry = no_sleep_retry(attempts=5, before_sleep=(restart_on_second_retry,))
    report, code = harness.run(harness.config(apply=True))
    assert code == 0 and report["summary"]["deleted"] == 2


def test_etcd_down_for_good_fails_the_host_exit_4_and_leaves_no_half_edited_block(outage: Harness) -> None:
    harness = outage
    harness.seed(s.kops_cluster())
    before = harness.dump()
    harness.kubeapi.on("GET", f"^/api/v1/nodes/{s.POD_ORPHAN}$", harness.etcd.stop)
    report, code = harness.run(harness.config(apply=True))
    assert code == 4
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert "did not answer: Connection refused" in entry["error"] and "ETCD_ENDPOINTS" in entry["error"]
    harness.etcd.start()
    after = harness.dump()
    for key, (value, _) in after.items():
        if "/assignment/" in key:
            assert block_shape_problem(json.loads(value)) is None
    assert {k: v for k, v in after.items() if s.POD_ORPHAN in k} == {
        k: v for k, v in before.items() if s.POD_ORPHAN in k
    }, "nothing of the failed host was written"


def test_tls_with_client_certificates(harness: Harness, tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path)
    server = EtcdServer(tls=tls)
    server.start()
    try:
        session = calico._session()
        session.verify, session.cert = str(tls.ca), (str(tls.client_cert), str(tls.client_key))
        scenario = s.kops_cluster()
        calico.load(server.url, scenario.seed.keys, session)
        for name, ip in scenario.k8s_nodes:
            harness.kubeapi.add_node(name, ip)
        config = replace(
            harness.config(apply=True),
            etcd_endpoints=(EtcdEndpoint("https", "127.0.0.1", server.client_port),),
            etcd_ca_cert_file=tls.ca,
            etcd_cert_file=tls.client_cert,
            etcd_key_file=tls.client_key,
        )
        report, code = harness.run(config)
        assert code == 0 and report["summary"]["deleted"] == 2
        assert not [k for k in calico.dump(server.url, session) if s.POD_ORPHAN in k]
        attempts: list[int] = []
        harness.retry = no_sleep_retry(before_sleep=(lambda state: attempts.append(state.attempt_number),))
        without_cert = replace(config, etcd_cert_file=None, etcd_key_file=None)
        report, code = harness.run(without_cert)
        # A certificate problem is a setting to fix, not an outage: no retries, exit 2, plain words.
        assert code == 2 and report["outcome"] == "error" and attempts == []
        error = report["errors"][0]
        assert error["kind"] == "tls" and "ETCD_CERT_FILE" in error["message"] and "_ssl.c" not in error["message"]
        # Another CA altogether (the server's own certificate would do as a pinned trust anchor on
        # Python 3.13, which verifies with VERIFY_X509_PARTIAL_CHAIN).
        (tmp_path / "other").mkdir()
        wrong_ca = replace(config, etcd_ca_cert_file=make_tls_files(tmp_path / "other").ca)
        report, code = harness.run(wrong_ca)
        assert code == 2 and report["errors"][0]["kind"] == "tls" and attempts == []
    finally:
        server.close()


def test_link_to_etcd_cut_in_the_middle_of_the_read_is_a_clear_error_and_writes_nothing(harness: Harness) -> None:
    harness.seed(s.kops_cluster())
    before = harness.dump()
    link = CutLink(harness.etcd.client_port, cut_after=6000)  # a few pages in, then a partition
    try:
        config = replace(harness.config(apply=True), etcd_endpoints=(EtcdEndpoint("http", "127.0.0.1", link.port),))
        report, code = harness.run(config)
    finally:
        link.close()
    assert link.cut.is_set() and link.relayed > 6000, "the read had started when the link went"
    assert code == 1 and report["outcome"] == "error" and report["errors"][0]["kind"] == "unavailable"
    assert report["hosts"] == [] and harness.dump() == before


def test_a_write_whose_answer_was_lost_and_that_is_tried_again_is_reported_as_written(harness: Harness) -> None:
    """etcd commits the first write of a host, and the connection drops before its answer. The
    retry's compare then fails on that write's own keys: it is a write done, not a conflict."""
    harness.seed(s.kops_cluster())
    planned, _ = harness.run(harness.config())
    report, code, link = applied_losing_answers(harness, harness.config(apply=True), b'"cidr":"100.96.20.0/26"')
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    assert link.lost.is_set(), "the answer to the block's write was lost"
    assert code == 0 and (entry["action"], entry["reason"]) == ("deleted", "k8s_node_missing")
    block = next(c for c in entry["changes"] if c["key"].endswith("/block/100.96.20.0-26"))
    assert block["op"] == "update" and block["before"] is not None
    written = [(c["key"], c["op"], c["step"]) for c in entry["changes"]]
    assert written == [(c["key"], c["op"], c["step"]) for c in hosts_by_name(planned)[s.POD_ORPHAN]["changes"]], (
        "the report lists every write, the one whose answer was lost too, as the plan had them"
    )
    assert calico.ipam_problems({k: v for k, (v, _) in harness.dump().items()}) == []


@pytest.mark.parametrize("done", [True, False], ids=["done", "not-done"])
def test_a_write_whose_every_answer_was_lost_is_reported_in_doubt_and_a_restore_finds_out(
    harness: Harness, done: bool
) -> None:
    """No try of a host's block write gets its answer: the first commits, the retries conflict
    with it unanswered, and the host fails. The report lists the write apart, in doubt, and a
    restore acts on what it finds: the IPs back where it was done, nothing where it was not."""
    harness.seed(s.kops_cluster())
    seeded = {k: v for k, (v, _) in harness.dump().items()}
    report, code, link = applied_losing_answers(
        harness, harness.config(apply=True), b'"cidr":"100.96.20.0/26"', harness.retry.attempts
    )
    entry = hosts_by_name(report)[s.POD_ORPHAN]
    # Every try that reached etcd lost its answer (gRPC may fail one fast, unsent, as it reconnects).
    assert link.lost.is_set() and 1 <= link.doomed <= harness.retry.attempts
    assert code == 4 and (entry["action"], entry["reason"]) == ("failed", "datastore_error")
    assert "it may have been written" in entry["error"]
    doubted = [c for c in entry["changes"] if c.get("in_doubt")]
    assert ORPHAN_BLOCK_KEY in {c["key"] for c in doubted}, "the write in doubt is reported"
    assert {c["step"] for c in doubted} == {max(c["step"] for c in entry["changes"])}, "apart, as the last step"
    assert all(c["before"] is not None for c in doubted)
    assert harness.dump()[ORPHAN_BLOCK_KEY][0] != seeded[ORPHAN_BLOCK_KEY], "the first try was done"
    if not done:  # as if it had not been: the transaction's keys as they were
        calico.load(harness.etcd.url, {c["key"]: seeded[c["key"]] for c in doubted})
    harness.kubeapi.delete_node(s.NEW_NODE)  # else the other orphan's address is its, and stays away
    document, code = harness.restore(harness.config(apply=True), source=report)
    restored = {h["name"]: h for h in document["hosts"]}[s.POD_ORPHAN]
    assert code == 0 and (ORPHAN_BLOCK_KEY in {c["key"] for c in restored["changes"]}) is done
    now = {k: v for k, (v, _) in harness.dump().items()}
    assert calico.semantic(now) == calico.semantic(seeded) and calico.ipam_problems(now) == []


def test_a_write_that_found_no_connection_is_not_in_doubt(outage: Harness) -> None:
    """etcd refuses the connection at every try of the first write: it never reached etcd, so
    the failed host's report lists nothing, in doubt or not, and says nothing of it maybe done."""
    harness = outage
    harness.seed(s.kops_cluster())
    before = harness.dump()
    down_at_the_first_write(harness, harness.etcd.stop)
    report, code = harness.run(harness.config(apply=True))
    failed = [h for h in report["hosts"] if h["action"] == "failed"]
    assert code == 4 and failed and all(h["reason"] == "datastore_error" for h in failed)
    assert all(h["changes"] == [] and "may have been written" not in h["error"] for h in failed)
    harness.etcd.start()
    assert harness.dump() == before
