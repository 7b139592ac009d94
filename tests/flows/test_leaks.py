"""Leaked pod IPs on live nodes: always reported; released only with --release-leaked-ips, after
--leak-grace-period of being seen leaked in every run, and never while the pod holds the IP.
On etcd v3 and v2 against the real etcd, and on the Kubernetes datastore."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from job.core.model import IpamBlock, StoredItem
from job.core.scan import BlockScan
from job.flows import run as run_flow
from tests.adapters.test_etcdv2 import seeded
from tests.adapters.test_kdd import CRD, LIVE_A, cidr_name, kdd, seed_kdd
from tests.adapters.test_kubeapi_server import call
from tests.conftest import Harness
from tests.support import calico, calico2
from tests.support import scenario as s
from tests.support.calico import CalicoSeed

WEB0_IP = "100.96.0.5"  # web-0 on the first live node, in its block 100.96.0.0/26
WEB1_IP = "100.96.1.5"  # web-1 on the second
# The leak check's pods read: the list of every pod, or one pod by name.
POD_LIST = "^/api/v1/pods$"
ONE_POD = "^/api/v1/namespaces/[^/]+/pods/[^/]+$"
WEB0_POD = "^/api/v1/namespaces/default/pods/web-0$"
BLOCK = "/calico/ipam/v2/assignment/ipv4/block/100.96.0.0-26"
RELEASE = {"release_leaked_ips": True, "exclude": (r"ip-10-0-1-13\..*", r"ip-10-0-1-20\..*")}


def leak_web0(harness: Harness) -> str:
    """web-0's pod was deleted while its CNI DEL was lost: its endpoint is gone, its IP stays."""
    harness.seed(s.kops_cluster())
    endpoint = next(k for k in harness.dump() if "workloadendpoints/default/" in k and "web--0" in k)
    calico.delete(harness.etcd.url, endpoint)
    block = json.loads(harness.dump()[BLOCK][0])
    return str(next(a["handle_id"] for a in block["attributes"] if a["secondary"].get("pod") == "web-0"))


def leaks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["ip"]: entry for entry in report["audit"]["leaked_ips"]["sample"]}


def add_pod(harness: Harness, node: str, ip: str | None, name: str = "web-0", phase: str | None = None) -> None:
    status: dict[str, Any] = {"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {}
    if phase:
        status["phase"] = phase
    harness.kubeapi.put(
        "/api/v1/namespaces/default/pods",
        {"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node}, "status": status},
    )


def test_a_leaked_ip_is_reported_and_only_released_when_asked_after_its_grace(harness: Harness) -> None:
    handle = leak_web0(harness)
    first, _ = harness.run(harness.config(apply=True, exclude=RELEASE["exclude"]))
    assert first["audit"]["leaked_ips"]["count"] == 1
    assert leaks(first)[WEB0_IP] | {"since": None} == {
        "ip": WEB0_IP,
        "node": s.LIVE[0],
        "pod": "default/web-0",
        "handle": handle,
        "since": None,
        "action": "waiting_grace",
    }
    harness.now += timedelta(minutes=16)
    before = harness.dump()
    second, _ = harness.run(harness.config(apply=True, exclude=RELEASE["exclude"]))
    assert leaks(second)[WEB0_IP]["action"] == "reported", "off by default"
    assert harness.dump() == before


def test_with_release_on_a_leak_seen_for_its_grace_is_released_exactly(harness: Harness) -> None:
    handle = leak_web0(harness)
    config = harness.config(apply=True, **RELEASE)
    first, _ = harness.run(config)
    assert leaks(first)[WEB0_IP]["action"] == "waiting_grace"
    harness.now += timedelta(minutes=10)
    early, _ = harness.run(config)
    assert leaks(early)[WEB0_IP]["action"] == "waiting_grace", "never before the grace is over"
    harness.now += timedelta(minutes=6)
    before = harness.dump()
    report, code = harness.run(config)
    assert code == 0 and leaks(report)[WEB0_IP]["action"] == "released"
    assert report["audit"]["leaked_ips"]["released"] == 1
    after = harness.dump()
    block = json.loads(after[BLOCK][0])
    assert block["allocations"][5] is None and 5 in block["unallocated"]
    assert f"/calico/ipam/v2/handle/{handle}" not in after
    assert {k for k in before if after.get(k) != before[k]} == {BLOCK, f"/calico/ipam/v2/handle/{handle}"}
    assert calico.ipam_problems({k: v for k, (v, _) in after.items()}) == []


def test_a_live_pods_ip_is_never_leaked_and_a_moved_or_readdressed_pod_is(harness: Harness) -> None:
    leak_web0(harness)
    add_pod(harness, s.LIVE[0], WEB0_IP)
    report, _ = harness.run()
    assert report["audit"]["leaked_ips"]["count"] == 0, "the pod holds it, endpoint or not"
    add_pod(harness, s.LIVE[0], None)
    report, _ = harness.run()
    assert report["audit"]["leaked_ips"]["count"] == 0, "a pod still starting may get this very IP"
    add_pod(harness, s.LIVE[1], "100.96.1.7")
    report, _ = harness.run()
    assert list(leaks(report)) == [WEB0_IP], "the pod of that name runs on another node now"
    add_pod(harness, s.LIVE[0], "100.96.0.33")
    report, _ = harness.run()
    assert list(leaks(report)) == [WEB0_IP], "the pod has another IP now"


@pytest.mark.parametrize("served", ["fetched", "table", "protobuf", "json"])
def test_a_terminating_pod_holds_its_ip_until_its_kubelet_confirms(
    harness: Harness, served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod being deleted still runs, and holds its IP, until its kubelet has torn it down (the
    CNI DEL) and confirms the delete: however long its grace, its IP is no leak. Deleted through
    the API, as `kubectl delete` and then the kubelet delete it (the API test server keeps a
    scheduled pod, marked, until a delete of grace 0); the candidate's pod fetched by name, or the
    pods listed as the server prints them (a row says `Terminating`), in protobuf, or in JSON, each
    with the marks in its metadata."""
    if served != "fetched":
        monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 0)
    harness.kubeapi.serves_tables = served == "table"
    harness.kubeapi.serves_protobuf = served != "json"
    leak_web0(harness)
    add_pod(harness, s.LIVE[0], WEB0_IP)
    pod = "/api/v1/namespaces/default/pods/web-0"
    assert call(harness.kubeapi, "DELETE", pod).json()["metadata"]["deletionTimestamp"]
    config = harness.config(apply=True, **RELEASE)
    harness.kubeapi.take_encoded_bytes()
    for _ in range(2):
        report, _ = harness.run(config)
        assert report["audit"]["leaked_ips"]["count"] == 0, "terminating: its containers may still run"
        harness.now += timedelta(minutes=20)
    if served == "fetched":
        assert harness.kubeapi.count("GET", POD_LIST) == 0
        assert harness.kubeapi.count("GET", WEB0_POD) == 2, "fetched each run"
    else:
        assert harness.kubeapi.take_encoded_bytes()[f"{served} /api/v1/pods"] > 0, "the pods listed as asked"
    call(harness.kubeapi, "DELETE", pod, {"gracePeriodSeconds": 0})
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "waiting_grace", "gone: a leak from this run on, never before"


def test_the_grace_restarts_when_a_leak_is_not_seen_in_one_run(harness: Harness) -> None:
    leak_web0(harness)
    config = harness.config(apply=True, **RELEASE)
    harness.run(config)
    harness.now += timedelta(minutes=10)
    add_pod(harness, s.LIVE[0], WEB0_IP)
    harness.run(config)  # the pod is listed again: not leaked in this run
    harness.kubeapi.objects["/api/v1/namespaces/default/pods"].pop("web-0")
    harness.now += timedelta(minutes=10)
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "waiting_grace"
    assert leaks(report)[WEB0_IP]["since"] == "2026-11-30T12:20:00Z"


def test_a_pod_back_at_the_recheck_keeps_its_ip(harness: Harness) -> None:
    leak_web0(harness)
    config = harness.config(apply=True, **RELEASE)
    harness.run(config)
    harness.now += timedelta(minutes=20)
    # The pod shows up between the leak check's GET and the release: the GET right before the write sees it.
    gets: list[None] = []

    def back_at_the_second_get() -> None:
        gets.append(None)
        if len(gets) == 2:
            add_pod(harness, s.LIVE[0], WEB0_IP)

    harness.kubeapi.on("GET", WEB0_POD, back_at_the_second_get, times=2)
    before = harness.dump()
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "pod_back"
    assert harness.dump()[BLOCK] == before[BLOCK]


@pytest.mark.parametrize("read", ["fetched", "listed"])
def test_an_ip_allocated_after_the_blocks_were_read_is_not_seen_as_leaked(
    harness: Harness, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocks are read before the pods are: a pod created meanwhile either is read, or its IP
    was allocated after the blocks were read and is not in what this run saw. The candidate's pod
    fetched by name, or every pod listed."""
    if read == "listed":
        monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 0)
    leak_web0(harness)
    fresh = {"handle_id": "k8s-pod-network.fresh", "secondary": {"node": s.LIVE[0], "namespace": "default"}}
    fresh["secondary"]["pod"] = "fresh"

    def new_pod_allocates() -> None:  # a new pod's IP lands while the pod list is being read
        block = json.loads(calico.dump(harness.etcd.url)[BLOCK][0])
        block["attributes"].append(fresh)
        block["allocations"][20] = len(block["attributes"]) - 1
        block["unallocated"].remove(20)
        calico.load(harness.etcd.url, {BLOCK: json.dumps(block)})

    pods = POD_LIST if read == "listed" else WEB0_POD
    harness.kubeapi.on("GET", pods, new_pod_allocates)
    report, _ = harness.run()
    assert list(leaks(report)) == [WEB0_IP]
    assert "fresh" in harness.dump()[BLOCK][0], "allocated while the pods were read"


def test_without_leak_candidates_no_pod_is_read(harness: Harness) -> None:
    """On etcd every pod's IP is held by its workload endpoint: with none left over there is
    nothing a pod could settle, so a run lists no pods and fetches none. Without that rule every
    run listed every pod of the cluster for nothing."""
    harness.seed(s.kops_cluster())
    report, code = harness.run()
    assert code == 0 and report["audit"]["leaked_ips"]["count"] == 0
    assert harness.kubeapi.count("GET", POD_LIST) == 0
    assert harness.kubeapi.count("GET", ONE_POD) == 0


def test_leak_candidates_past_the_cap_are_settled_by_one_list(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to PODS_FETCHED_EACH candidate pods are fetched by name, one GET each; more are settled
    by listing the pods once, with the same leaks found either way."""
    leak_web0(harness)
    web1 = next(k for k in harness.dump() if "workloadendpoints/default/" in k and "web--1" in k)
    calico.delete(harness.etcd.url, web1)
    monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 2)
    fetched, _ = harness.run()
    assert (harness.kubeapi.count("GET", POD_LIST), harness.kubeapi.count("GET", ONE_POD)) == (0, 2)
    monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 1)
    listed, _ = harness.run()
    assert (harness.kubeapi.count("GET", POD_LIST), harness.kubeapi.count("GET", ONE_POD)) == (1, 2)
    assert sorted(leaks(fetched)) == sorted(leaks(listed)) == [WEB0_IP, WEB1_IP]


@pytest.mark.parametrize("read", ["fetched", "listed"])
def test_pods_that_cannot_be_read_leave_the_leaks_unknown_and_unreleased(
    harness: Harness, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server refuses the pods read: the run says so in one line (`unreadable`), reports
    the leaks as unknown (null, not zero) and releases none, whatever their grace."""
    if read == "listed":
        monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 0)
    leak_web0(harness)
    config = harness.config(apply=True, **RELEASE)
    harness.run(config)
    harness.now += timedelta(minutes=20)
    harness.kubeapi.fail("GET", POD_LIST if read == "listed" else ONE_POD, 403)
    before = harness.dump()[BLOCK]
    report, code = harness.run(config)
    assert report["audit"]["leaked_ips"]["count"] is None
    assert [e["message"].split(": forbidden (HTTP 403)")[0] for e in report["errors"]] == [
        "pods could not be read, so leaked pod IPs are not checked"
    ]
    assert code == 0, "the audit's part is missing; the run did its work"
    assert harness.dump()[BLOCK] == before, "no release without the pods"


@pytest.mark.parametrize("served", ["fetched", "table", "protobuf", "json"])
@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_finished_pod_holds_no_ip_and_its_leak_is_released_after_its_grace(
    harness: Harness, phase: str, served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pod that has finished (Failed: evicted, or its containers failed; Succeeded: a Job's)
    and is not deleted yet keeps its IPs in its status, but Calico takes it to hold none (its
    workload endpoint has no IPs) and its kube-controllers releases such an address. So does
    calico-gc: the IP is leaked, and released after its grace, the re-check finding the pod
    finished still. Running, the same pod holds it. Its pod fetched by name, or the pods listed
    (the API server leaves finished ones out) as a Table, in protobuf or in JSON."""
    if served != "fetched":
        monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 0)
    harness.kubeapi.serves_tables = served == "table"
    harness.kubeapi.serves_protobuf = served != "json"
    leak_web0(harness)
    add_pod(harness, s.LIVE[0], WEB0_IP, phase="Running")
    config = harness.config(apply=True, **RELEASE)
    report, _ = harness.run(config)
    assert report["audit"]["leaked_ips"]["count"] == 0, "running: it holds its IP"
    add_pod(harness, s.LIVE[0], WEB0_IP, phase=phase)
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "waiting_grace"
    harness.now += timedelta(minutes=20)
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "released"
    block = json.loads(harness.dump()[BLOCK][0])
    assert block["allocations"][5] is None and 5 in block["unallocated"], "freed in its block"


# Answers that are no Pod, each with the field the job's decoder names.
NOT_A_POD = [
    ({"kind": "Pod", "spec": 5}, "`$.spec`"),
    ({"kind": "Pod", "status": ["Running"]}, "`$.status`"),
    ({"kind": "Pod", "spec": {"nodeName": 7}}, "`$.spec.nodeName`"),
]


@pytest.mark.parametrize(("answer", "field"), NOT_A_POD)
def test_a_fetched_pod_the_job_cannot_read_is_one_line_not_a_traceback(
    harness: Harness, answer: Any, field: str
) -> None:
    """A proxy answers the GET of a candidate's pod with JSON that is no Pod: one `unreadable`
    line naming the request and the field (the adapter's `bad_answer`), the leaks unknown (null),
    and no traceback."""
    leak_web0(harness)
    harness.kubeapi.fail("GET", WEB0_POD, 200, body=answer)
    report, code = harness.run()
    assert code == 0 and report["audit"]["leaked_ips"]["count"] is None
    [error] = report["errors"]
    assert error["kind"] == "unreadable" and "/pods/web-0: " in error["message"] and "not a Pod" in error["message"]
    assert field in error["message"], error["message"]


def test_a_pod_name_no_pod_can_have_is_never_asked_for(harness: Harness) -> None:
    """An allocation naming a pod of a shape the API server never names one (here a path) is a
    leak, found without a request: a name read from the datastore never becomes another path."""
    leak_web0(harness)
    block = json.loads(harness.dump()[BLOCK][0])
    web0 = next(a for a in block["attributes"] if a["secondary"].get("pod") == "web-0")
    web0["secondary"]["pod"] = "../../../nodes/" + s.LIVE[0]
    calico.load(harness.etcd.url, {BLOCK: json.dumps(block)})
    report, _ = harness.run()
    assert leaks(report)[WEB0_IP]["pod"] == f"default/../../../nodes/{s.LIVE[0]}"
    assert harness.kubeapi.count("GET", "/pods/|/nodes/") == 0


def test_the_per_run_cap_defers_the_rest(harness: Harness) -> None:
    leak_web0(harness)
    config = harness.config(apply=True, max_leak_releases=0, **RELEASE)
    harness.run(config)
    harness.now += timedelta(minutes=20)
    report, _ = harness.run(config)
    assert leaks(report)[WEB0_IP]["action"] == "deferred"


def test_kubernetes_datastore_leak_is_released_after_its_grace(harness: Harness) -> None:
    seed_kdd(harness.kubeapi)
    config = kdd(harness, apply=True, release_leaked_ips=True, exclude=("worker-gone",))
    first, _ = harness.run(config)
    assert leaks(first)["100.96.1.9"]["action"] == "waiting_grace"
    harness.now += timedelta(minutes=20)
    report, code = harness.run(config)
    assert code == 0 and leaks(report)["100.96.1.9"]["action"] == "released"
    block = harness.kubeapi.get(f"{CRD}/ipamblocks", "100-96-1-0-26")
    assert block is not None and block["spec"]["allocations"][9] is None
    assert harness.kubeapi.get(f"{CRD}/ipamhandles", "k8s-pod-network.ghost") is None
    assert "web-a" in {a["secondary"].get("pod") for a in block["spec"]["attributes"]}, f"{LIVE_A}'s pod keeps its IP"


def test_kubernetes_datastore_a_finished_pods_ip_is_leaked(harness: Harness) -> None:
    """On the Kubernetes datastore the pods are the workload endpoints: web-a, evicted (Failed,
    its IP still in its status), holds no endpoint IP any more, as Calico converts it; its IP is
    leaked and released after its grace. The list leaves it out; the re-check finds it finished."""
    seed_kdd(harness.kubeapi)
    config = kdd(harness, apply=True, release_leaked_ips=True, exclude=("worker-gone",))
    pod = harness.kubeapi.get("/api/v1/namespaces/default/pods", "web-a")
    assert pod is not None
    harness.kubeapi.put(
        "/api/v1/namespaces/default/pods", {**pod, "status": {**pod["status"], "phase": "Failed", "reason": "Evicted"}}
    )
    assert leaks(harness.run(config)[0])["100.96.1.5"]["action"] == "waiting_grace"
    harness.now += timedelta(minutes=20)
    report, code = harness.run(config)
    assert code == 0 and leaks(report)["100.96.1.5"]["action"] == "released"
    block = harness.kubeapi.get(f"{CRD}/ipamblocks", "100-96-1-0-26")
    assert block is not None and block["spec"]["allocations"][5] is None


def test_calico_2_leaks_are_pods_gone_by_their_handle(harness: Harness) -> None:
    """Calico 2.x records no node on an allocation; its CNI names the handle <namespace>.<pod>.
    An IP whose endpoint and pod are both gone is leaked; a pod of that name anywhere holds it."""
    seeded(harness)
    endpoint = "/calico/v1/host/ip-10-0-2-11.ec2.internal/workload/k8s/shop.api-1/endpoint/eth0"
    calico2._session().delete(f"{harness.etcd.url}/v2/keys{endpoint}", timeout=10).raise_for_status()
    config = harness.config(datastore_type="etcdv2", exclude=(r".*",))
    report, _ = harness.run(config)
    assert {(e["pod"], e["handle"]) for e in report["audit"]["leaked_ips"]["sample"]} == {("shop/api-1", "shop.api-1")}
    harness.kubeapi.put(
        "/api/v1/namespaces/shop/pods",
        {"metadata": {"name": "api-1", "namespace": "shop"}, "spec": {"nodeName": "anywhere"}, "status": {}},
    )
    report, _ = harness.run(config)
    assert report["audit"]["leaked_ips"]["count"] == 0


def test_an_endpoint_ip_read_before_the_last_block_still_holds_its_ip() -> None:
    """The etcd v3 read files endpoints beside the blocks: an IP given to the block scan before
    blocks_read waits for it, and is never taken for a leak (an IP wrongly called leaked would
    be released under a running pod)."""
    block = {
        "cidr": "10.9.0.0/30",
        "affinity": "host:a",
        "allocations": [0, 1, None, None],
        "unallocated": [2, 3],
        "attributes": [
            {"handle_id": "k8s-pod-network.c1", "secondary": {"node": "a", "namespace": "ns", "pod": "p1"}},
            {"handle_id": "k8s-pod-network.c2", "secondary": {"node": "a", "namespace": "ns", "pod": "p2"}},
        ],
    }
    scan = BlockScan(frozenset({"a"}))
    scan.held_by_endpoints(["10.9.0.0"])  # p1's endpoint, before its block is in
    scan.add("10.9.0.0/30", block)
    scan.blocks_read()
    assert scan.unheld == {"10.9.0.0/30": 0b10}  # only p2's IP: no endpoint holds it
    scan.held_by_endpoints(["10.9.0.1"])  # after blocks_read: at once
    assert scan.unheld == {"10.9.0.0/30": 0}


def test_only_an_allocation_that_names_a_pod_on_a_live_node_is_a_leak_candidate() -> None:
    """The scan marks an allocation of a live node with a namespace as it reads the block; one
    that names no pod (another writer's, or a pod of an empty name) is dropped when the leak
    candidates are made, and a tunnel address (a node, no namespace) or a gone node's allocation
    is never marked. Without `attribute`'s check an allocation naming no pod would be called leaked."""
    attributes = [
        {"handle_id": "k8s-pod-network.c1", "secondary": {"node": "a", "namespace": "ns", "pod": "p1"}},
        {"handle_id": "k8s-pod-network.c2", "secondary": {"node": "a", "namespace": "ns"}},
        {"handle_id": "k8s-pod-network.c3", "secondary": {"node": "a", "namespace": "ns", "pod": ""}},
        {"handle_id": "ipip-tunnel-addr-a", "secondary": {"node": "a", "type": "ipipTunnelAddress"}},
        {"handle_id": "k8s-pod-network.c5", "secondary": {"node": "gone", "namespace": "ns", "pod": "p5"}},
        {"handle_id": "k8s-pod-network.c6", "secondary": {"node": "a", "namespace": 7, "pod": "p6"}},
    ]
    block = {
        "cidr": "10.9.0.0/29",
        "affinity": "host:a",
        "allocations": [0, 1, 2, 3, 4, 5, None, None],
        "unallocated": [6, 7],
        "attributes": attributes,
    }
    scan = BlockScan(frozenset({"a"}))
    scan.add("10.9.0.0/29", block)
    scan.blocks_read()
    assert scan.unheld == {"10.9.0.0/29": 0b111}
    block_key = "/calico/ipam/v2/assignment/ipv4/block/10.9.0.0-29"
    scan.attribute([IpamBlock(StoredItem(block_key, 1, json.dumps(block)), "10.9.0.0/29")])
    assert {key: [a.ip for a in found] for key, found in scan.pod_ips.items()} == {("ns", "p1"): ["10.9.0.0"]}


def test_pods_listed_without_their_namespace_settle_by_name_and_ip(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pods come as a Table's rows (the blocks are of one family; more candidates than are
    fetched each): a pod of that name on that node holding the IP keeps it, whatever its
    namespace; one holding another IP does not."""
    monkeypatch.setattr(run_flow, "PODS_FETCHED_EACH", 0)
    leak_web0(harness)
    harness.kubeapi.take_encoded_bytes()
    report, _ = harness.run()
    assert "table /api/v1/pods" in harness.kubeapi.take_encoded_bytes()
    assert list(leaks(report)) == [WEB0_IP]
    pod = {"metadata": {"name": "web-0", "namespace": "other"}, "spec": {"nodeName": s.LIVE[0]}}
    harness.kubeapi.put("/api/v1/namespaces/other/pods", {**pod, "status": {"podIPs": [{"ip": "100.96.0.34"}]}})
    report, _ = harness.run()
    assert list(leaks(report)) == [WEB0_IP], "another IP"
    harness.kubeapi.put("/api/v1/namespaces/other/pods", {**pod, "status": {"podIPs": [{"ip": WEB0_IP}]}})
    report, _ = harness.run()
    assert report["audit"]["leaked_ips"]["count"] == 0, "the IP is in use"


def test_with_blocks_of_both_families_the_pods_are_listed_whole(harness: Harness) -> None:
    """A Table prints a pod's first IP only: where a pod may hold two of the blocks' IPs, the pods
    are asked for themselves, so a dual-stack pod's IPv6 address is never taken for a leak."""
    seed_kdd(harness.kubeapi)
    ipam = CalicoSeed()
    ipam.block("fd00:96::/122", LIVE_A)
    ipam.allocate("fd00:96::5", "k8s-pod-network.web-a-v6", LIVE_A, pod="web-a", namespace="default")
    for cidr, block in ipam.blocks.items():
        harness.kubeapi.put(f"{CRD}/ipamblocks", {"metadata": {"name": cidr_name(cidr)}, "spec": block})
    handle = {"handleID": "k8s-pod-network.web-a-v6", **ipam.handles["k8s-pod-network.web-a-v6"]}
    harness.kubeapi.put(f"{CRD}/ipamhandles", {"metadata": {"name": "k8s-pod-network.web-a-v6"}, "spec": handle})
    harness.kubeapi.add_pod("default", "web-a", LIVE_A, "100.96.1.5", "fd00:96::5")
    harness.kubeapi.take_encoded_bytes()
    report, code = harness.run(kdd(harness))
    assert code == 0 and list(leaks(report)) == ["100.96.1.9"], "the ghost's only"
    assert "protobuf /api/v1/pods" in harness.kubeapi.take_encoded_bytes()


def test_a_pod_printed_with_another_familys_address_first_is_settled_by_name(harness: Harness) -> None:
    """The blocks are IPv4, a pod's first address is IPv6 from another IPAM: its row hides the
    blocks' address, so the pod settles its allocations by name and node, as one without IPs."""
    seed_kdd(harness.kubeapi)
    harness.kubeapi.add_pod("default", "web-a", LIVE_A, "fd00:96::5", "100.96.1.5")
    report, code = harness.run(kdd(harness))
    assert code == 0 and list(leaks(report)) == ["100.96.1.9"], "web-a's 100.96.1.5 is held, the ghost's is not"
